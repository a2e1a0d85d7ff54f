// The CPU routes: which kernel of src/cpu/ each route name runs, over which
// arrays of the primitive's inputs; the routed primitives' eval_cpu.
#include "cpu/routes.h"

#include <stdexcept>
#include <utility>

#include "core/primitives.h"
#include "cpu/kernels.h"
#include "mlx/allocator.h"

namespace mlx_lattice::cpu {

namespace {

// The CSR view arrays at inputs [first, first + 3) (offsets, gather, k).
// Routes reading the view's offset groups have them at [first + 3,
// first + 6) (segments, rows, gather).
CsrView csr_view(const Call& c, size_t first) {
  CsrView v;
  v.rows = c.out.shape(0);
  if (c.relation) {
    v.offsets = c.in[first].data<int32_t>();
    v.gather = c.in[first + 1].data<int32_t>();
    v.k = c.in[first + 2].data<int32_t>();
    v.edges = c.in[first + 1].shape(0);
    if (c.in.size() >= first + 6) {
      v.segments = c.in[first + 3].data<int32_t>();
      v.group_rows = c.in[first + 4].data<int32_t>();
      v.group_gather = c.in[first + 5].data<int32_t>();
    }
  } else {
    v.edges = v.rows;
  }
  return v;
}

// The relation's edges grouped by offset for the view (cached on it), so
// that the gather-GEMM need not group each block's edges on every call.
std::vector<mx::array> offset_groups(Relation& rel, View view) {
  const auto& g = rel.offset_groups(view);
  return {g.segments, g.rows, g.gather};
}

// x @ W[0] in the blocked GEMM kernel; no relation.
void pointwise(const Call& c) {
  if (c.relation) {
    throw std::invalid_argument(c.route + " needs a pointwise product (no relation)");
  }
  gather_conv(c.in[0], c.in[1], csr_view(c, 2), c.out, c.stream);
}

// Blocked gather-GEMM over the CSR view (x, w, offsets, gather, k) and its
// offset groups (segments, rows, gather).
void gather_gemm(const Call& c) {
  gather_conv(c.in[0], c.in[1], csr_view(c, 2), c.out, c.stream);
}

// The same kernel on its row-major traversal (narrow inputs): edges in
// the view's order, no grouping by offset; the same sums. (Rows whose
// offsets do not ascend, which only relations made from CSR arrays have,
// are grouped per block instead.)
void row_gather(const Call& c) {
  if (!c.relation) {
    throw std::invalid_argument(c.route + " needs a relation (a pointwise product has none)");
  }
  CsrView v = csr_view(c, 2);
  v.row_major = true;
  gather_conv(c.in[0], c.in[1], v, c.out, c.stream);
}

// The gather-GEMM with int4/int8 codes unpacked into float32 weight panels
// (x, codes, scales, biases, offsets, gather, k, segments, rows, gather).
void quantized_gather_gemm(const Call& c) {
  gather_conv_quantized(
      c.in[0], c.in[1], c.in[2], c.in[3], c.bits, c.group, c.in[1].shape(1), csr_view(c, 4),
      c.out, c.stream);
}

// The kernel-major pairs at inputs [2, 5) (offsets, g, r).
PairView pair_view(const Call& c) {
  PairView v;
  v.k = c.out.shape(0);
  if (c.relation) {
    v.offsets = c.in[2].data<int32_t>();
    v.g = c.in[3].data<int32_t>();
    v.r = c.in[4].data<int32_t>();
    v.edges = c.in[3].shape(0);
  } else {
    v.edges = c.in[0].shape(0);
  }
  return v;
}

// Per-offset GEMM over packed panels (x, ct, offsets, g, r).
void wgrad_gemm(const Call& c) {
  weight_grad(c.in[0], c.in[1], pair_view(c), c.out, c.stream);
}

// Grouped / depthwise products: per-group multiply-adds over the CSR view
// (x, w, offsets, gather, k) and per-group weight gradients (x, ct, pairs).
void grouped_gather(const Call& c) {
  grouped_conv(c.in[0], c.in[1], c.groups, csr_view(c, 2), c.out, c.stream);
}

void grouped_wgrad(const Call& c) {
  grouped_weight_grad(c.in[0], c.in[1], c.groups, pair_view(c), c.out, c.stream);
}

} // namespace

const std::vector<Route>& routes() {
  static const std::vector<Route> table = {
      {"cpu.pointwise", Op::Conv, pointwise},
      {"cpu.gather_gemm", Op::Conv, gather_gemm, offset_groups},
      {"cpu.row_gather", Op::Conv, row_gather},
      {"cpu.wgrad_gemm", Op::WeightGrad, wgrad_gemm},
      {"cpu.quantized_gather_gemm", Op::QuantizedConv, quantized_gather_gemm, offset_groups},
      {"cpu.grouped_gather", Op::Conv, grouped_gather, nullptr, true},
      {"cpu.grouped_wgrad", Op::WeightGrad, grouped_wgrad, nullptr, true},
  };
  return table;
}

const Route& find(const std::string& name, Op op) {
  if (const Route* r = find_entry(routes(), name, op)) {
    return *r;
  }
  throw std::invalid_argument("no CPU route named " + name);
}

void register_routes() {
  std::vector<RouteEntry> entries;
  for (const Route& r : routes()) {
    entries.push_back({r.name, r.op, r.extra_inputs, r.grouped});
  }
  mlx_lattice::register_routes(Backend::Cpu, "CPU", std::move(entries));
}

} // namespace mlx_lattice::cpu

namespace mlx_lattice {

// GatherConv, WeightGrad and QuantizedConv on the CPU: the task of their
// route's entry above.
void RoutedPrimitive::eval_cpu(
    const std::vector<mx::array>& in,
    std::vector<mx::array>& out) {
  cpu::Call call{route_, in, out[0], stream(), rel_ != nullptr, bits_, group_, groups_};
  cpu::find(route_, op_).run(call);
}

namespace {

mx::Strides row_strides(const mx::Shape& shape) {
  mx::Strides st(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
    st[i] = st[i + 1] * shape[i + 1];
  }
  return st;
}

// `a`'s buffer read with another shape and strides (no copy).
mx::array view_of(const mx::array& a, mx::Shape shape, mx::Strides strides, int64_t offset = 0) {
  mx::array v(shape, a.dtype(), nullptr, {});
  v.copy_shared_buffer(a, strides, cpu::dense_flags(shape, strides), a.data_size(), offset);
  return v;
}

// Stride of the kernel axes k1, ..., kn of a parameter (B, k1, ..., kn, A)
// read as one axis K, or -1 when they do not merge (any strides). With
// K = 1 the stride is never read (0).
int64_t merged_kernel_stride(const mx::array& w) {
  const int nd = w.ndim();
  int64_t stride = 0, extent = 1;
  for (int i = nd - 2; i >= 1; --i) {
    if (w.shape(i) == 1) {
      continue;
    }
    if (extent == 1) {
      stride = w.strides()[i];
    } else if (w.strides()[i] != stride * extent) {
      return -1;
    }
    extent *= w.shape(i);
  }
  return stride;
}

// The (K, A, B) weight a conv product multiplies by (A = its input
// channels): w read kernel-major (a parameter through a view of its own
// buffer), then transposed and / or mirrored by strides; a copy only for a
// parameter whose kernel axes do not merge, or where the kernel needs a
// dense weight (the grouped routes).
mx::array kernel_major_weight(const mx::array& w, WeightFlip flip, bool need_dense, mx::Stream s) {
  if (!parameter_layout(w) && !flip.any()) {
    return need_dense ? cpu::dense(w, s) : w;
  }
  const KernelDims d = kernel_dims(w.shape());
  mx::array p = w;
  mx::Strides st;
  if (parameter_layout(w)) {
    int64_t sk = merged_kernel_stride(w);
    if (sk < 0) {
      p = cpu::dense(w, s);
      sk = merged_kernel_stride(p);
    }
    st = {sk, p.strides().back(), p.strides()[0]};
  } else {
    st = {w.strides()[0], w.strides()[1], w.strides()[2]};
  }
  mx::Shape shape = {static_cast<int>(d.k), static_cast<int>(d.a), static_cast<int>(d.b)};
  int64_t offset = 0;
  if (flip.transposed) {
    std::swap(shape[1], shape[2]);
    std::swap(st[1], st[2]);
  }
  if (flip.mirrored) {
    offset = (d.k - 1) * st[0];
    st[0] = -st[0];
  }
  auto v = view_of(p, shape, st, offset);
  return need_dense ? cpu::dense(v, s) : v;
}

} // namespace

// x and w come as the graph left them (no Contiguous node in front of the
// primitive): x is copied to dense rows if it is not (a transpose, a
// broadcast), w read through its strides.
void GatherConv::eval_cpu(
    const std::vector<mx::array>& in,
    std::vector<mx::array>& out) {
  std::vector<mx::array> args = in;
  args[0] = cpu::dense(in[0], stream());
  args[1] = kernel_major_weight(in[1], flip_, cpu::find(route_, op_).grouped, stream());
  cpu::Call call{route_, args, out[0], stream(), rel_ != nullptr, bits_, group_, groups_};
  cpu::find(route_, op_).run(call);
}

// A gradient in a parameter's layout: the kernel-major (K, A, B) result of
// the route, which the CPU weight gradient stores in the parameter's order
// ({A, 1, K * A}: shared as it is); a grouped route's contiguous one is
// copied into that order.
void WeightGrad::eval_cpu(
    const std::vector<mx::array>& in,
    std::vector<mx::array>& out) {
  std::vector<mx::array> args = in;
  args[0] = cpu::dense(in[0], stream());
  args[1] = cpu::dense(in[1], stream());
  if (!shape_) {
    RoutedPrimitive::eval_cpu(args, out);
    return;
  }
  auto& o = out[0];
  const KernelDims d = kernel_dims(o.shape());
  const mx::Shape km_shape = {static_cast<int>(d.k), static_cast<int>(d.a), static_cast<int>(d.b)};
  mx::array km(km_shape, o.dtype(), nullptr, {});
  cpu::Call call{route_, args, km, stream(), rel_ != nullptr, bits_, group_, groups_};
  cpu::find(route_, op_).run(call);
  const mx::Strides param_order = {d.a, 1, d.k * d.a};
  const auto strides = row_strides(o.shape());
  if (km.strides() == param_order || d.k * d.a * d.b == 0) {
    o.copy_shared_buffer(km, strides, cpu::dense_flags(o.shape(), strides), km.data_size());
    return;
  }
  o.set_data(mx::allocator::malloc(o.nbytes()));
  auto dst = view_of(o, km_shape, param_order);
  cpu::copy_strided(km, dst, stream());
  mx::cpu::get_command_encoder(stream()).add_temporary(km);
}

} // namespace mlx_lattice
