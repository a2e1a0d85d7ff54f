// Readers of quantized weights for the kernels (QuantParams: params.h).
// Codes, scales and biases are (C_out, K, .) as QuantizedWeight.kernel_major() gives them: codes hold
// 32 / bits values per uint32 word along C_in, lowest bits first, and
// w[c, k, a] = scales[c, k, a / group] * q + biases[c, k, a / group].
#pragma once

#include "params.h"

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
