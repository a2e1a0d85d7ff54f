"""Benchmarks and profilers (``python -m mlx_lattice.bench --help``).

The library never imports this package; only the command line does
(``python -m mlx_lattice bench`` / ``tune``). Modules, each importing only
those listed before it:

- ``timing``: best-of-N timers and the same-run NumPy sgemm reference.
- ``workloads``: the scenes, layer shapes and dtypes the benches run.
- ``training_step``: the MinkUNet training step that is timed, its useful
  FLOPs, and the variant with Adam's update compiled.
- ``spconv_side``: spconv 2.x on the same GPU (optional: torch, spconv).
- ``profile``: where a training step's time goes on any backend (host
  graph building, evaluation, primitives by kind, memory: ``--profile``).
- ``cuda_profile``: the same on CUDA with its extras (isolated products,
  map stages), and the benches' one import of the CUDA backend
  (``cuda_backend()``).
- ``layers``: single-layer benches on the CPU (convolution passes and map
  building, grouped layers, attention) and the network row of the table.
- ``tuner``: pre-tuning a model's shapes, tuned against static routes.
- ``network``: the whole-network stage profile on the CPU and the step's
  products by layer (``python -m mlx_lattice.bench.network``).
- ``gpu``: the CUDA bench (``--device gpu``).
- ``startup``: a new process's first training steps (``--startup``).
- ``quantized``: int8 / int4 against float weights on the CPU
  (``--quantized``).
- ``__main__``: the command line.
"""
