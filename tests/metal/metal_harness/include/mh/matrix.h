// MSL's matrices (metal::matrix<T, Cols, Rows>; halfNxM and floatNxM, N
// columns of M rows, 2 to 4 each): columns of vec<T, Rows>, so Metal's
// sizes (a float3x3 is three float3 columns, 48 bytes). Constructors: a
// scalar (the diagonal, zeros elsewhere), the columns, Cols * Rows scalars
// in column order, or another matrix of the same shape (explicit);
// m[i] is column i. Operators: + and - between matrices, * and / by a
// scalar, matrix * matrix, matrix * vector (a vector of Cols components,
// giving Rows) and vector * matrix (Rows components, giving Cols); with
// transpose() and determinant() of a square matrix.
#pragma once

#include <type_traits>

#include "mh/vec.h"

namespace metal {

template <class T, int C, int R>
struct matrix {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, half>, "MSL's matrices hold float or half");
  static_assert(C >= 2 && C <= 4 && R >= 2 && R <= 4, "MSL's matrices have 2 to 4 columns and rows");
  using column_type = vec<T, R>;
  column_type columns[C];

  matrix() = default;
  constexpr explicit matrix(T s) {
    for (int c = 0; c < C; ++c) {
      columns[c] = column_type(T(0));
      if (c < R) {
        columns[c][c] = s;
      }
    }
  }
  template <class... V>
    requires(sizeof...(V) == C && (detail::is_vecish_v<V> && ...))
  constexpr matrix(const V&... cols) : columns{column_type(detail::tov(cols))...} {
    static_assert(((detail::vinfo<detail::vec_of<V>>::n == R) && ...), "a matrix column has one component per row");
  }
  template <class... S>
    requires(sizeof...(S) == C * R && (std::is_arithmetic_v<::mh::bare_t<S>> && ...))
  constexpr matrix(S... s) {
    const T v[] = {T(s)...};
    for (int c = 0; c < C; ++c) {
      for (int r = 0; r < R; ++r) {
        columns[c][r] = v[c * R + r];
      }
    }
  }
  template <class U>
    requires(!std::is_same_v<U, T>)
  constexpr explicit matrix(const matrix<U, C, R>& o) {
    for (int c = 0; c < C; ++c) {
      columns[c] = column_type(o.columns[c]);
    }
  }

  constexpr column_type& operator[](int c) { return columns[c]; }
  constexpr const column_type& operator[](int c) const { return columns[c]; }

  matrix& operator+=(const matrix& o) { return *this = *this + o; }
  matrix& operator-=(const matrix& o) { return *this = *this - o; }
  matrix& operator*=(T s) { return *this = *this * s; }
  template <int K>
    requires(K == C && C == R)
  matrix& operator*=(const matrix<T, K, C>& o) { return *this = *this * o; }

  friend constexpr matrix operator+(const matrix& a, const matrix& b) {
    matrix m;
    for (int c = 0; c < C; ++c) {
      m.columns[c] = a.columns[c] + b.columns[c];
    }
    return m;
  }
  friend constexpr matrix operator-(const matrix& a, const matrix& b) {
    matrix m;
    for (int c = 0; c < C; ++c) {
      m.columns[c] = a.columns[c] - b.columns[c];
    }
    return m;
  }
  friend constexpr matrix operator-(const matrix& a) {
    matrix m;
    for (int c = 0; c < C; ++c) {
      m.columns[c] = -a.columns[c];
    }
    return m;
  }
  friend constexpr matrix operator*(const matrix& a, T s) {
    matrix m;
    for (int c = 0; c < C; ++c) {
      m.columns[c] = a.columns[c] * s;
    }
    return m;
  }
  friend constexpr matrix operator*(T s, const matrix& a) { return a * s; }
  friend constexpr matrix operator/(const matrix& a, T s) {
    matrix m;
    for (int c = 0; c < C; ++c) {
      m.columns[c] = a.columns[c] / s;
    }
    return m;
  }
  // A linear combination of the columns.
  friend constexpr column_type operator*(const matrix& a, const vec<T, C>& v) {
    column_type out(T(0));
    for (int c = 0; c < C; ++c) {
      out += a.columns[c] * v[c];
    }
    return out;
  }
  friend constexpr vec<T, C> operator*(const vec<T, R>& v, const matrix& a) {
    vec<T, C> out(T(0));
    for (int c = 0; c < C; ++c) {
      T s = T(0);
      for (int r = 0; r < R; ++r) {
        s += v[r] * a.columns[c][r];
      }
      out[c] = s;
    }
    return out;
  }
  friend constexpr bool operator==(const matrix& a, const matrix& b) {
    for (int c = 0; c < C; ++c) {
      for (int r = 0; r < R; ++r) {
        if (a.columns[c][r] != b.columns[c][r]) {
          return false;
        }
      }
    }
    return true;
  }
};

// (R x C) * (C x K) = (R x K): each column of the right one, transformed.
template <class T, int C, int R, int K>
constexpr matrix<T, K, R> operator*(const matrix<T, C, R>& a, const matrix<T, K, C>& b) {
  matrix<T, K, R> m;
  for (int k = 0; k < K; ++k) {
    m.columns[k] = a * b.columns[k];
  }
  return m;
}

template <class T, int C, int R>
constexpr matrix<T, R, C> transpose(const matrix<T, C, R>& a) {
  matrix<T, R, C> m;
  for (int c = 0; c < C; ++c) {
    for (int r = 0; r < R; ++r) {
      m.columns[r][c] = a.columns[c][r];
    }
  }
  return m;
}

template <class T, int N>
constexpr T determinant(const matrix<T, N, N>& a) {
  // Laplace expansion along the first column (N is 2 to 4).
  if constexpr (N == 2) {
    return a[0][0] * a[1][1] - a[1][0] * a[0][1];
  } else {
    T det = T(0);
    for (int r = 0; r < N; ++r) {
      matrix<T, N - 1, N - 1> minor;
      for (int c = 1; c < N; ++c) {
        for (int rr = 0, k = 0; rr < N; ++rr) {
          if (rr != r) {
            minor[c - 1][k++] = a[c][rr];
          }
        }
      }
      const T term = a[0][r] * determinant(minor);
      det += (r % 2 == 0) ? term : -term;
    }
    return det;
  }
}

#define MH_MATRIX_NAMES(T)                                                                    \
  using T##2x2 = matrix<T, 2, 2>;                                                             \
  using T##2x3 = matrix<T, 2, 3>;                                                             \
  using T##2x4 = matrix<T, 2, 4>;                                                             \
  using T##3x2 = matrix<T, 3, 2>;                                                             \
  using T##3x3 = matrix<T, 3, 3>;                                                             \
  using T##3x4 = matrix<T, 3, 4>;                                                             \
  using T##4x2 = matrix<T, 4, 2>;                                                             \
  using T##4x3 = matrix<T, 4, 3>;                                                             \
  using T##4x4 = matrix<T, 4, 4>;
MH_MATRIX_NAMES(half)
MH_MATRIX_NAMES(float)
#undef MH_MATRIX_NAMES

static_assert(sizeof(matrix<float, 3, 3>) == 48 && sizeof(matrix<half, 2, 3>) == 16);

} // namespace metal

#define MH_GLOBAL_MATRIX(T) \
  using metal::T##2x2;      \
  using metal::T##2x3;      \
  using metal::T##2x4;      \
  using metal::T##3x2;      \
  using metal::T##3x3;      \
  using metal::T##3x4;      \
  using metal::T##4x2;      \
  using metal::T##4x3;      \
  using metal::T##4x4;
MH_GLOBAL_MATRIX(half)
MH_GLOBAL_MATRIX(float)
#undef MH_GLOBAL_MATRIX
