// Parameters of the quantized convolution kernels; the same layout as
// QuantParams in src/metal/program.h. Codes, scales and biases are
// (C_out, K, .) as QuantizedWeight.kernel_major() gives them: codes hold
// 32 / bits values per uint32 word along C_in, lowest bits first, and
// w[c, k, a] = scales[c, k, a / group] * q + biases[c, k, a / group].
#pragma once

struct QuantParams {
  int rows;     // output rows of this product
  int a;        // input channels
  int b;        // output channels
  int identity; // 1: pointwise (row r reads row r at offset 0)
  int k;        // kernel volume
  int n_in;     // rows of x
  int n_tiles;  // tiles of the sorted plan
  int edges;    // edge count
  int bits;     // 4 or 8
  int group;    // input channels per scale/bias
};

// Code of input channel a in one (c, k) row of packed words.
template <int BITS>
inline float quant_code(device const uint* words, int a) {
  constexpr int per = 32 / BITS;
  constexpr uint mask = (1u << BITS) - 1u;
  return float((words[a / per] >> uint((a % per) * BITS)) & mask);
}

// The dequantized weight w[c, k, a] (float).
template <int BITS>
inline float quant_weight(
    device const uint* codes,
    device const float* scales,
    device const float* biases,
    constant QuantParams& p,
    int c,
    int k,
    int a) {
  const long row = long(c) * p.k + k;
  const int groups = p.a / p.group;
  const long sg = row * groups + a / p.group;
  return scales[sg] * quant_code<BITS>(codes + row * (p.a * BITS / 32), a) + biases[sg];
}
