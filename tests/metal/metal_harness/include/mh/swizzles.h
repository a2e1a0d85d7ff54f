// Generated list of swizzle members for metal::vec (see vec.h).
// MH_SWIZZLES_N(T, S) declares the multi-letter swizzles of an
// N-component vector with storage of S elements.
#pragma once

#define MH_SWIZZLES_2(T, S) \
  swz<T, S, 0, 0> xx; \
  swz<T, S, 0, 1> xy; \
  swz<T, S, 1, 0> yx; \
  swz<T, S, 1, 1> yy; \
  swz<T, S, 0, 0, 0> xxx; \
  swz<T, S, 0, 0, 1> xxy; \
  swz<T, S, 0, 1, 0> xyx; \
  swz<T, S, 0, 1, 1> xyy; \
  swz<T, S, 1, 0, 0> yxx; \
  swz<T, S, 1, 0, 1> yxy; \
  swz<T, S, 1, 1, 0> yyx; \
  swz<T, S, 1, 1, 1> yyy; \
  swz<T, S, 0, 1> rg;

#define MH_SWIZZLES_3(T, S) \
  swz<T, S, 0, 0> xx; \
  swz<T, S, 0, 1> xy; \
  swz<T, S, 0, 2> xz; \
  swz<T, S, 1, 0> yx; \
  swz<T, S, 1, 1> yy; \
  swz<T, S, 1, 2> yz; \
  swz<T, S, 2, 0> zx; \
  swz<T, S, 2, 1> zy; \
  swz<T, S, 2, 2> zz; \
  swz<T, S, 0, 0, 0> xxx; \
  swz<T, S, 0, 0, 1> xxy; \
  swz<T, S, 0, 0, 2> xxz; \
  swz<T, S, 0, 1, 0> xyx; \
  swz<T, S, 0, 1, 1> xyy; \
  swz<T, S, 0, 1, 2> xyz; \
  swz<T, S, 0, 2, 0> xzx; \
  swz<T, S, 0, 2, 1> xzy; \
  swz<T, S, 0, 2, 2> xzz; \
  swz<T, S, 1, 0, 0> yxx; \
  swz<T, S, 1, 0, 1> yxy; \
  swz<T, S, 1, 0, 2> yxz; \
  swz<T, S, 1, 1, 0> yyx; \
  swz<T, S, 1, 1, 1> yyy; \
  swz<T, S, 1, 1, 2> yyz; \
  swz<T, S, 1, 2, 0> yzx; \
  swz<T, S, 1, 2, 1> yzy; \
  swz<T, S, 1, 2, 2> yzz; \
  swz<T, S, 2, 0, 0> zxx; \
  swz<T, S, 2, 0, 1> zxy; \
  swz<T, S, 2, 0, 2> zxz; \
  swz<T, S, 2, 1, 0> zyx; \
  swz<T, S, 2, 1, 1> zyy; \
  swz<T, S, 2, 1, 2> zyz; \
  swz<T, S, 2, 2, 0> zzx; \
  swz<T, S, 2, 2, 1> zzy; \
  swz<T, S, 2, 2, 2> zzz; \
  swz<T, S, 0, 1> rg; \
  swz<T, S, 0, 1, 2> rgb;

#define MH_SWIZZLES_4(T, S) \
  swz<T, S, 0, 0> xx; \
  swz<T, S, 0, 1> xy; \
  swz<T, S, 0, 2> xz; \
  swz<T, S, 0, 3> xw; \
  swz<T, S, 1, 0> yx; \
  swz<T, S, 1, 1> yy; \
  swz<T, S, 1, 2> yz; \
  swz<T, S, 1, 3> yw; \
  swz<T, S, 2, 0> zx; \
  swz<T, S, 2, 1> zy; \
  swz<T, S, 2, 2> zz; \
  swz<T, S, 2, 3> zw; \
  swz<T, S, 3, 0> wx; \
  swz<T, S, 3, 1> wy; \
  swz<T, S, 3, 2> wz; \
  swz<T, S, 3, 3> ww; \
  swz<T, S, 0, 0, 0> xxx; \
  swz<T, S, 0, 0, 1> xxy; \
  swz<T, S, 0, 0, 2> xxz; \
  swz<T, S, 0, 0, 3> xxw; \
  swz<T, S, 0, 1, 0> xyx; \
  swz<T, S, 0, 1, 1> xyy; \
  swz<T, S, 0, 1, 2> xyz; \
  swz<T, S, 0, 1, 3> xyw; \
  swz<T, S, 0, 2, 0> xzx; \
  swz<T, S, 0, 2, 1> xzy; \
  swz<T, S, 0, 2, 2> xzz; \
  swz<T, S, 0, 2, 3> xzw; \
  swz<T, S, 0, 3, 0> xwx; \
  swz<T, S, 0, 3, 1> xwy; \
  swz<T, S, 0, 3, 2> xwz; \
  swz<T, S, 0, 3, 3> xww; \
  swz<T, S, 1, 0, 0> yxx; \
  swz<T, S, 1, 0, 1> yxy; \
  swz<T, S, 1, 0, 2> yxz; \
  swz<T, S, 1, 0, 3> yxw; \
  swz<T, S, 1, 1, 0> yyx; \
  swz<T, S, 1, 1, 1> yyy; \
  swz<T, S, 1, 1, 2> yyz; \
  swz<T, S, 1, 1, 3> yyw; \
  swz<T, S, 1, 2, 0> yzx; \
  swz<T, S, 1, 2, 1> yzy; \
  swz<T, S, 1, 2, 2> yzz; \
  swz<T, S, 1, 2, 3> yzw; \
  swz<T, S, 1, 3, 0> ywx; \
  swz<T, S, 1, 3, 1> ywy; \
  swz<T, S, 1, 3, 2> ywz; \
  swz<T, S, 1, 3, 3> yww; \
  swz<T, S, 2, 0, 0> zxx; \
  swz<T, S, 2, 0, 1> zxy; \
  swz<T, S, 2, 0, 2> zxz; \
  swz<T, S, 2, 0, 3> zxw; \
  swz<T, S, 2, 1, 0> zyx; \
  swz<T, S, 2, 1, 1> zyy; \
  swz<T, S, 2, 1, 2> zyz; \
  swz<T, S, 2, 1, 3> zyw; \
  swz<T, S, 2, 2, 0> zzx; \
  swz<T, S, 2, 2, 1> zzy; \
  swz<T, S, 2, 2, 2> zzz; \
  swz<T, S, 2, 2, 3> zzw; \
  swz<T, S, 2, 3, 0> zwx; \
  swz<T, S, 2, 3, 1> zwy; \
  swz<T, S, 2, 3, 2> zwz; \
  swz<T, S, 2, 3, 3> zww; \
  swz<T, S, 3, 0, 0> wxx; \
  swz<T, S, 3, 0, 1> wxy; \
  swz<T, S, 3, 0, 2> wxz; \
  swz<T, S, 3, 0, 3> wxw; \
  swz<T, S, 3, 1, 0> wyx; \
  swz<T, S, 3, 1, 1> wyy; \
  swz<T, S, 3, 1, 2> wyz; \
  swz<T, S, 3, 1, 3> wyw; \
  swz<T, S, 3, 2, 0> wzx; \
  swz<T, S, 3, 2, 1> wzy; \
  swz<T, S, 3, 2, 2> wzz; \
  swz<T, S, 3, 2, 3> wzw; \
  swz<T, S, 3, 3, 0> wwx; \
  swz<T, S, 3, 3, 1> wwy; \
  swz<T, S, 3, 3, 2> wwz; \
  swz<T, S, 3, 3, 3> www; \
  swz<T, S, 0, 1, 2, 3> xyzw; \
  swz<T, S, 0, 1, 3, 2> xywz; \
  swz<T, S, 0, 2, 1, 3> xzyw; \
  swz<T, S, 0, 2, 3, 1> xzwy; \
  swz<T, S, 0, 3, 1, 2> xwyz; \
  swz<T, S, 0, 3, 2, 1> xwzy; \
  swz<T, S, 1, 0, 2, 3> yxzw; \
  swz<T, S, 1, 0, 3, 2> yxwz; \
  swz<T, S, 1, 2, 0, 3> yzxw; \
  swz<T, S, 1, 2, 3, 0> yzwx; \
  swz<T, S, 1, 3, 0, 2> ywxz; \
  swz<T, S, 1, 3, 2, 0> ywzx; \
  swz<T, S, 2, 0, 1, 3> zxyw; \
  swz<T, S, 2, 0, 3, 1> zxwy; \
  swz<T, S, 2, 1, 0, 3> zyxw; \
  swz<T, S, 2, 1, 3, 0> zywx; \
  swz<T, S, 2, 3, 0, 1> zwxy; \
  swz<T, S, 2, 3, 1, 0> zwyx; \
  swz<T, S, 3, 0, 1, 2> wxyz; \
  swz<T, S, 3, 0, 2, 1> wxzy; \
  swz<T, S, 3, 1, 0, 2> wyxz; \
  swz<T, S, 3, 1, 2, 0> wyzx; \
  swz<T, S, 3, 2, 0, 1> wzxy; \
  swz<T, S, 3, 2, 1, 0> wzyx; \
  swz<T, S, 0, 0, 0, 0> xxxx; \
  swz<T, S, 1, 1, 1, 1> yyyy; \
  swz<T, S, 2, 2, 2, 2> zzzz; \
  swz<T, S, 3, 3, 3, 3> wwww; \
  swz<T, S, 0, 1> rg; \
  swz<T, S, 0, 1, 2> rgb; \
  swz<T, S, 0, 1, 2, 3> rgba; \
  swz<T, S, 2, 1, 0, 3> bgra;

