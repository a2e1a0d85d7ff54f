// Batch / instance normalisation + residual + activation (the NormAct and
// NormActGrad primitives of src/core/norm.h on a Metal GPU). Programs:
// src/metal/norm_act.cpp.
//
// Forward (training): norm_act_stats gives each (row block, channel) one
// thread that walks the block's rows in order, keeping the moments of each
// run of equal segment ids (Welford, about the run's first value) and
// merging runs into the block's per-segment partials; norm_act_merge
// combines the blocks of one (segment, channel) in a fixed tree. Metal has
// no float64: a partial is (count, shift k, mean - k, M2), centred
// throughout, and two partials merge through the difference of their
// shifts (exact for nearby shifts), so float32 keeps the variance where
// mean^2 >> var. norm_act_apply then writes
//     y = act((x - mean) * scale + b [+ residual]),  one rounding to T,
// with scale = w / sqrt(var + eps): x - mean is exact for x near the mean,
// where x * scale + (b - mean * scale) would cancel mean * scale.
//
// Backward: norm_act_grad_sums gives per (block, segment, channel)
// A = sum g, B = sum g * xhat and the row count, with g = ct * act'(z) (z's
// sign from x, or from y when a residual was added); norm_act_grad_merge
// sums the blocks in a fixed tree and the segments in order into
// dweight = sum B and dbias = sum A, and leaves per (segment, channel) the
// coefficients of dx = k0 g + k1 (x - mean) + k2 for norm_act_grad_apply
// (which also writes g, the residual's gradient). No float atomics: every
// sum has one order, so results are the same run to run.
#include <metal_stdlib>

#include "norm_params.h"

using namespace metal;

// ------------------------------------------------------------ moments

// n rows with mean k + m and sum of squared deviations q.
struct Moments {
  uint n;
  float k;
  float m;
  float q;
};

inline Moments moments_empty() {
  Moments a;
  a.n = 0;
  a.k = 0.0f;
  a.m = 0.0f;
  a.q = 0.0f;
  return a;
}

// Chan, Golub and LeVeque's pairwise update, in a's shift. The library is
// compiled without fast math (cmake/metal.cmake): reassociating
// (b.k - a.k) + (b.m - a.m) into (b.k + b.m) - (a.k + a.m) would round at the
// magnitude of the means and lose the variance.
inline Moments moments_merge(Moments a, Moments b) {
  if (b.n == 0) {
    return a;
  }
  if (a.n == 0) {
    return b;
  }
  const uint n = a.n + b.n;
  const float delta = (b.k - a.k) + (b.m - a.m);
  const float f = float(b.n) / float(n);
  a.m += delta * f;
  a.q += b.q + delta * delta * float(a.n) * f;
  a.n = n;
  return a;
}

// Welford's update by one value of the run (the shift is its first value).
inline void moments_add(thread Moments& a, float v) {
  a.n += 1;
  const float d = v - a.k;
  const float delta = d - a.m;
  a.m += delta / float(a.n);
  a.q += delta * (d - a.m);
}

// The partials (four planes of segments x channels x blocks) of the
// statistics pass; the count is stored as the bits of a uint.
inline long part_index(constant NormParams& p, int plane, int s, int c, int blk) {
  return ((long(plane) * p.segments + s) * p.channels + c) * long(p.blocks) + blk;
}

inline Moments part_load(device const float* part, constant NormParams& p, int s, int c, int blk) {
  Moments a;
  a.n = as_type<uint>(part[part_index(p, 0, s, c, blk)]);
  a.k = part[part_index(p, 1, s, c, blk)];
  a.m = part[part_index(p, 2, s, c, blk)];
  a.q = part[part_index(p, 3, s, c, blk)];
  return a;
}

inline void part_store(device float* part, constant NormParams& p, int s, int c, int blk, Moments a) {
  part[part_index(p, 0, s, c, blk)] = as_type<float>(a.n);
  part[part_index(p, 1, s, c, blk)] = a.k;
  part[part_index(p, 2, s, c, blk)] = a.m;
  part[part_index(p, 3, s, c, blk)] = a.q;
}

// A run's moments into its segment's partial of this block: stored over
// the (cleared) slot without segment ids, merged with earlier runs of the
// segment with them.
inline void part_flush(device float* part, constant NormParams& p, int s, int c, int blk, Moments run) {
  if (p.segmented) {
    run = moments_merge(part_load(part, p, s, c, blk), run);
  }
  part_store(part, p, s, c, blk, run);
}

// The (channel, row block) of a thread of a partial pass: tile_c channels
// along x, blocks along y.
inline int2 tile_position(constant NormParams& p, uint3 gid, uint3 lid, uint3 tpg) {
  return int2(int(gid.x) * p.tile_c + int(lid.x), int(gid.y) * int(tpg.y) + int(lid.y));
}

// ------------------------------------------------------------ forward

// Pass 1: the moments of each (segment, channel) over each row block.
template <typename T>
[[kernel]] void norm_act_stats(
    device const T* x [[buffer(0)]],
    device const int* seg [[buffer(1)]],
    device float* part [[buffer(2)]],
    constant NormParams& p [[buffer(3)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint3 lid [[thread_position_in_threadgroup]],
    uint3 tpg [[threads_per_threadgroup]]) {
  const int2 pos = tile_position(p, gid, lid, tpg);
  const int c = pos.x;
  const int blk = pos.y;
  if (c >= p.channels || blk >= p.blocks) {
    return;
  }
  if (p.segmented) {
    for (int s = 0; s < p.segments; ++s) {
      part[part_index(p, 0, s, c, blk)] = 0.0f; // count 0: the slot is empty
    }
  }
  const int i0 = blk * p.block_rows;
  const int i1 = min(p.rows, i0 + p.block_rows);
  Moments run = moments_empty();
  int s_run = 0;
  for (int i = i0; i < i1; ++i) {
    const int s = p.segmented ? seg[i] : 0;
    const float v = float(x[long(i) * p.channels + c]);
    if (s != s_run || run.n == 0) {
      if (run.n > 0) {
        part_flush(part, p, s_run, c, blk, run);
      }
      run = moments_empty();
      run.k = v;
      s_run = s;
    }
    moments_add(run, v);
  }
  part_flush(part, p, s_run, c, blk, run);
}

// Pass 2: one threadgroup per (channel, segment) merges the blocks, thread
// t taking blocks t, t + NORM_MERGE_THREADS, ... in order, then a fixed
// tree; writes mean and the biased variance (0 and 0 for an empty segment).
[[kernel]] void norm_act_merge(
    device const float* part [[buffer(0)]],
    device float* mean [[buffer(1)]],
    device float* var [[buffer(2)]],
    constant NormParams& p [[buffer(3)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint3 lid [[thread_position_in_threadgroup]]) {
  threadgroup uint tn[NORM_MERGE_THREADS];
  threadgroup float tk[NORM_MERGE_THREADS];
  threadgroup float tm[NORM_MERGE_THREADS];
  threadgroup float tq[NORM_MERGE_THREADS];
  const int c = int(gid.x);
  const int s = int(gid.y);
  const int t = int(lid.x);
  Moments a = moments_empty();
  for (int blk = t; blk < p.blocks; blk += NORM_MERGE_THREADS) {
    a = moments_merge(a, part_load(part, p, s, c, blk));
  }
  tn[t] = a.n;
  tk[t] = a.k;
  tm[t] = a.m;
  tq[t] = a.q;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int half_ = NORM_MERGE_THREADS / 2; half_ > 0; half_ /= 2) {
    if (t < half_) {
      Moments b;
      b.n = tn[t + half_];
      b.k = tk[t + half_];
      b.m = tm[t + half_];
      b.q = tq[t + half_];
      a = moments_merge(a, b);
      tn[t] = a.n;
      tk[t] = a.k;
      tm[t] = a.m;
      tq[t] = a.q;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (t == 0) {
    const long j = long(s) * p.channels + c;
    mean[j] = a.n > 0 ? a.k + a.m : 0.0f;
    var[j] = a.n > 0 ? max(a.q, 0.0f) / float(a.n) : 0.0f;
  }
}

// The rows of a thread of an elementwise pass: tile_c channels along x,
// rows along y, striding over the grid's rows.
struct RowWalk {
  int c;
  int first;
  int step;
};

inline RowWalk row_walk(constant NormParams& p, uint3 gid, uint3 lid, uint3 tpg, uint3 groups) {
  RowWalk w;
  w.c = int(gid.x) * p.tile_c + int(lid.x);
  w.first = int(gid.y) * int(tpg.y) + int(lid.y);
  w.step = int(groups.y) * int(tpg.y);
  return w;
}

// w / sqrt(var + eps): one expression in every pass, so that the backward
// passes recompute the forward pass's z (and its sign) exactly.
inline float norm_scale(float w, float var, float eps) {
  return w / sqrt(var + eps);
}

// The activation: y = z > 0 ? z : low * z (act' likewise from z's sign).
inline float activate(float z, float low) {
  return z > 0.0f ? z : low * z;
}

// Pass 3: y = act((x - mean) * scale + b [+ r]), mean and var from pass 2
// (training) or given (eval: segment 0 only).
template <typename T>
[[kernel]] void norm_act_apply(
    device const T* x [[buffer(0)]],
    device const float* w [[buffer(1)]],
    device const float* b [[buffer(2)]],
    device const float* mean [[buffer(3)]],
    device const float* var [[buffer(4)]],
    device const T* r [[buffer(5)]],
    device const int* seg [[buffer(6)]],
    device T* y [[buffer(7)]],
    constant NormParams& p [[buffer(8)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint3 lid [[thread_position_in_threadgroup]],
    uint3 tpg [[threads_per_threadgroup]],
    uint3 groups [[threadgroups_per_grid]]) {
  const RowWalk walk = row_walk(p, gid, lid, tpg, groups);
  const int c = walk.c;
  if (c >= p.channels) {
    return;
  }
  const float wc = w[c];
  const float bc = b[c];
  int s_prev = -1;
  float mu = 0.0f;
  float scale = 0.0f;
  for (long i = walk.first; i < p.rows; i += walk.step) {
    const int s = p.segmented ? seg[i] : 0;
    if (s != s_prev) { // the segment's statistics, kept while it repeats
      const long j = long(s) * p.channels + c;
      mu = mean[j];
      scale = norm_scale(wc, var[j], p.eps);
      s_prev = s;
    }
    const long e = long(i) * p.channels + c;
    float z = (float(x[e]) - mu) * scale + bc;
    if (p.residual) {
      z += float(r[e]);
    }
    y[e] = T(activate(z, p.low));
  }
}

// ------------------------------------------------------------ backward

// The gradient sums' partials: planes A, B and the count (uint bits).
inline long sums_index(constant NormParams& p, int plane, int s, int c, int blk) {
  return ((long(plane) * p.segments + s) * p.channels + c) * long(p.blocks) + blk;
}

inline void sums_flush(device float* part, constant NormParams& p, int s, int c, int blk, float3 run) {
  const long ia = sums_index(p, 0, s, c, blk);
  const long ib = sums_index(p, 1, s, c, blk);
  const long in = sums_index(p, 2, s, c, blk);
  uint n = uint(run.z);
  if (p.segmented) {
    run.x += part[ia];
    run.y += part[ib];
    n += as_type<uint>(part[in]);
  }
  part[ia] = run.x;
  part[ib] = run.y;
  part[in] = as_type<float>(n);
}

// Pass 1: per (block, segment, channel) A = sum g, B = sum g * xhat and the
// row count, rows in order.
template <typename T>
[[kernel]] void norm_act_grad_sums(
    device const T* x [[buffer(0)]],
    device const T* y [[buffer(1)]],
    device const T* ct [[buffer(2)]],
    device const float* w [[buffer(3)]],
    device const float* b [[buffer(4)]],
    device const float* mean [[buffer(5)]],
    device const float* var [[buffer(6)]],
    device const int* seg [[buffer(7)]],
    device float* part [[buffer(8)]],
    constant NormParams& p [[buffer(9)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint3 lid [[thread_position_in_threadgroup]],
    uint3 tpg [[threads_per_threadgroup]]) {
  const int2 pos = tile_position(p, gid, lid, tpg);
  const int c = pos.x;
  const int blk = pos.y;
  if (c >= p.channels || blk >= p.blocks) {
    return;
  }
  if (p.segmented) {
    for (int s = 0; s < p.segments; ++s) {
      part[sums_index(p, 0, s, c, blk)] = 0.0f;
      part[sums_index(p, 1, s, c, blk)] = 0.0f;
      part[sums_index(p, 2, s, c, blk)] = as_type<float>(0u);
    }
  }
  const int i0 = blk * p.block_rows;
  const int i1 = min(p.rows, i0 + p.block_rows);
  int s_run = p.segmented && i0 < i1 ? seg[i0] : 0;
  float mu = mean[long(s_run) * p.channels + c];
  float inv = 1.0f / sqrt(var[long(s_run) * p.channels + c] + p.eps);
  const float wc = w[c];
  const float bc = b[c];
  float scale = norm_scale(wc, var[long(s_run) * p.channels + c], p.eps);
  float3 run = float3(0.0f); // A, B, count
  for (int i = i0; i < i1; ++i) {
    const int s = p.segmented ? seg[i] : 0;
    if (s != s_run) {
      sums_flush(part, p, s_run, c, blk, run);
      run = float3(0.0f);
      s_run = s;
      mu = mean[long(s) * p.channels + c];
      inv = 1.0f / sqrt(var[long(s) * p.channels + c] + p.eps);
      scale = norm_scale(wc, var[long(s) * p.channels + c], p.eps);
    }
    const long e = long(i) * p.channels + c;
    const float d = float(x[e]) - mu;
    // z as the forward pass computed it (its sign gives act')
    const float z = p.residual ? float(y[e]) : d * scale + bc;
    const float g = z > 0.0f ? float(ct[e]) : p.low * float(ct[e]);
    run += float3(g, g * (d * inv), 1.0f);
  }
  sums_flush(part, p, s_run, c, blk, run);
}

// Pass 2: one threadgroup per channel; per segment in order, the blocks'
// sums in a fixed tree; dweight and dbias summed over segments in order;
// the coefficients (scale, k1, k2) per (segment, channel) into coef:
// dx = scale g + k1 (x - mean) + k2 with, in training,
//   k1 = 2 ct_var / n - scale inv B / n,  k2 = ct_mean / n - scale A / n.
[[kernel]] void norm_act_grad_merge(
    device const float* part [[buffer(0)]],
    device const float* w [[buffer(1)]],
    device const float* var [[buffer(2)]],
    device const float* ct_mean [[buffer(3)]],
    device const float* ct_var [[buffer(4)]],
    device float* coef [[buffer(5)]],
    device float* dw [[buffer(6)]],
    device float* db [[buffer(7)]],
    constant NormParams& p [[buffer(8)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint3 lid [[thread_position_in_threadgroup]]) {
  threadgroup float ta[NORM_MERGE_THREADS];
  threadgroup float tb[NORM_MERGE_THREADS];
  threadgroup uint tn[NORM_MERGE_THREADS];
  const int c = int(gid.x);
  const int t = int(lid.x);
  float sum_a = 0.0f;
  float sum_b = 0.0f;
  for (int s = 0; s < p.segments; ++s) {
    float a = 0.0f;
    float bb = 0.0f;
    uint n = 0;
    for (int blk = t; blk < p.blocks; blk += NORM_MERGE_THREADS) {
      a += part[sums_index(p, 0, s, c, blk)];
      bb += part[sums_index(p, 1, s, c, blk)];
      n += as_type<uint>(part[sums_index(p, 2, s, c, blk)]);
    }
    ta[t] = a;
    tb[t] = bb;
    tn[t] = n;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int half_ = NORM_MERGE_THREADS / 2; half_ > 0; half_ /= 2) {
      if (t < half_) {
        ta[t] += ta[t + half_];
        tb[t] += tb[t + half_];
        tn[t] += tn[t + half_];
      }
      threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (t == 0) {
      const float A = ta[0];
      const float B = tb[0];
      const uint count = tn[0];
      sum_a += A;
      sum_b += B;
      const long j = long(s) * p.channels + c;
      const float inv = 1.0f / sqrt(var[j] + p.eps);
      const float scale = norm_scale(w[c], var[j], p.eps);
      float k1 = 0.0f;
      float k2 = 0.0f;
      if (p.training && count > 0) {
        const float rn = 1.0f / float(count);
        k1 = 2.0f * ct_var[j] * rn - scale * inv * B * rn;
        k2 = ct_mean[j] * rn - scale * A * rn;
      }
      const long sc = long(p.segments) * p.channels;
      coef[j] = scale;
      coef[sc + j] = k1;
      coef[2 * sc + j] = k2;
    }
    // the tree's slots are refilled for the next segment
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  if (t == 0) {
    dw[c] = sum_b;
    db[c] = sum_a;
  }
}

// Pass 3: dx = scale g + k1 (x - mean) + k2 (eval: scale g), and g itself
// (the residual's gradient) when a residual was added.
template <typename T>
[[kernel]] void norm_act_grad_apply(
    device const T* x [[buffer(0)]],
    device const T* y [[buffer(1)]],
    device const T* ct [[buffer(2)]],
    device const float* b [[buffer(3)]],
    device const float* mean [[buffer(4)]],
    device const int* seg [[buffer(5)]],
    device const float* coef [[buffer(6)]],
    device T* dx [[buffer(7)]],
    device T* g_out [[buffer(8)]],
    constant NormParams& p [[buffer(9)]],
    uint3 gid [[threadgroup_position_in_grid]],
    uint3 lid [[thread_position_in_threadgroup]],
    uint3 tpg [[threads_per_threadgroup]],
    uint3 groups [[threadgroups_per_grid]]) {
  const RowWalk walk = row_walk(p, gid, lid, tpg, groups);
  const int c = walk.c;
  if (c >= p.channels) {
    return;
  }
  const long sc = long(p.segments) * p.channels;
  for (long i = walk.first; i < p.rows; i += walk.step) {
    const int s = p.segmented ? seg[i] : 0;
    const long j = long(s) * p.channels + c;
    const long e = long(i) * p.channels + c;
    const float scale = coef[j];
    const float d = float(x[e]) - mean[j];
    const float z = p.residual ? float(y[e]) : d * scale + b[c];
    const float g = z > 0.0f ? float(ct[e]) : p.low * float(ct[e]);
    if (p.residual) {
      g_out[e] = T(g);
    }
    float dx_e = scale * g;
    if (p.training) {
      dx_e += coef[sc + j] * d + coef[2 * sc + j];
    }
    dx[e] = T(dx_e);
  }
}

#define LATTICE_INSTANTIATE(name, fn, T) \
  template [[host_name(name)]] [[kernel]] decltype(fn<T>) fn<T>;

LATTICE_INSTANTIATE("norm_act_stats_float32", norm_act_stats, float)
LATTICE_INSTANTIATE("norm_act_stats_float16", norm_act_stats, half)
LATTICE_INSTANTIATE("norm_act_stats_bfloat16", norm_act_stats, bfloat)
LATTICE_INSTANTIATE("norm_act_apply_float32", norm_act_apply, float)
LATTICE_INSTANTIATE("norm_act_apply_float16", norm_act_apply, half)
LATTICE_INSTANTIATE("norm_act_apply_bfloat16", norm_act_apply, bfloat)
LATTICE_INSTANTIATE("norm_act_grad_sums_float32", norm_act_grad_sums, float)
LATTICE_INSTANTIATE("norm_act_grad_sums_float16", norm_act_grad_sums, half)
LATTICE_INSTANTIATE("norm_act_grad_sums_bfloat16", norm_act_grad_sums, bfloat)
LATTICE_INSTANTIATE("norm_act_grad_apply_float32", norm_act_grad_apply, float)
LATTICE_INSTANTIATE("norm_act_grad_apply_float16", norm_act_grad_apply, half)
LATTICE_INSTANTIATE("norm_act_grad_apply_bfloat16", norm_act_grad_apply, bfloat)
