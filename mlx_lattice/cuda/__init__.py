"""CUDA routes (MLX on NVIDIA GPUs), written as ``mx.fast.cuda_kernel``
sources that MLX compiles at run time: no private MLX C++ ABI is needed.

Every route computes the same product as the C++ primitives,
``y[r] = sum over the edges of row r of x[g] @ W[k]`` over a CSR view of a
relation, and gets its autodiff from ``mx.custom_function``: the input
gradient is the same product over the relation with roles swapped and W
transposed, the weight gradient a per-offset contraction.

- ``kernels``: the kernel sources;
- ``view``: CSR views and sorted plans of a relation;
- ``routes``: the route table (route name -> the function computing it);
- ``autodiff``: ``conv`` and ``weight_grad`` with their VJP/JVP;
- ``neighbors``: k-nearest and radius queries (used by
  ``mlx_lattice.neighbors`` when the default device is a CUDA GPU).
"""

from .autodiff import conv, weight_grad
from .kernels import available, sorted_mma_shared_bytes
from .routes import ROUTES, find
from .view import View, view_of

__all__ = ["ROUTES", "View", "available", "conv", "find", "sorted_mma_shared_bytes", "view_of", "weight_grad"]
