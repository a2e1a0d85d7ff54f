"""The implementation the CPU and Metal backends share: both run through the
C++ extension (``_ext``), whose primitives (GatherConv, WeightGrad,
QuantizedConv, NormAct: src/core/primitives.h) run each route's table entry
on the backend's stream."""

from __future__ import annotations

from .. import _ext
from .base import Backend, ProductView


class NativeBackend(Backend):
    """A backend whose products, norms and queries are the extension's."""

    # The products are the extension's primitives, whose own vjp and jvp run
    # autodiff.py's rules.
    differentiable_products = True

    def neighbor_queries(self):
        return None  # _ext.knn_query, _ext.radius_query

    def fused_norm(self):
        return _layer_norm_act

    def norm_running(self, x, weight, bias, residual, eps, act, slope, running_mean, running_var,
                     keep, mu, ratio):
        # _ext.norm_act_running: one primitive on the CPU, with the same
        # bits; the two on Metal
        return _ext.norm_act_running(x, weight, bias, residual, eps, act, slope, running_mean, running_var,
                                     keep, mu, ratio)

    def running_stats(self, mean, var, batch_mean, batch_var, keep, mu, ratio):
        # _ext.running_stats: one primitive on the CPU, MLX's ops on other
        # streams
        return _ext.running_stats(mean, var, batch_mean, batch_var, keep, mu, ratio)

    def launch(self, route, op, a, b, view, k=1, groups=1, variant=None, flip=(False, False), shape=None):
        # The route's tiles are chosen inside the extension (variant: none).
        native = None if view is None else view.native
        major = _ext.View.output_major if view is None else view.major
        if op == "conv":
            return _ext.gather_conv(a, b, native, major, route, self.stream(), groups=groups, flip=tuple(flip))
        return _ext.weight_grad(a, b, native, major, k, route, self.stream(), groups=groups,
                                shape=None if shape is None else list(shape))

    def product_view(self, relation):
        return None if relation is None else NativeView(relation._native)

    def native_view(self, native, major):
        """The view of a native relation read ``major`` (a primitive's own,
        for its autodiff rules)."""
        return NativeView(native, major)

    def quantized_conv(self, route, x, weight, relation):
        codes, scales, biases = weight.kernel_major()
        native = None if relation is None else relation._native
        return _ext.quantized_conv(x, codes, scales, biases, weight.bits, weight.group_size, native,
                                   _ext.View.output_major, route, self.stream())


def _layer_norm_act(*args):
    """``_ext.norm_act`` for the layers: a training call's statistics
    without gradient."""
    return _ext.norm_act(*args, stats_grad=False)


class NativeView(ProductView):
    """A CSR view of a relation for the extension's products: the native
    relation's maps read output-major (rows are its outputs) or input-major.
    Its kind, edges and symmetry are the native relation's own (every
    builder marks a symmetric one)."""

    def __init__(self, native, major=_ext.View.output_major):
        self.native = self.relation = native
        self.major = major

    @property
    def rows(self) -> int:
        out = self.major == _ext.View.output_major
        return self.native.n_out if out else self.native.n_in

    def flipped(self) -> "NativeView":
        out = self.major == _ext.View.output_major
        return NativeView(self.native, _ext.View.input_major if out else _ext.View.output_major)
