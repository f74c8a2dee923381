// kiln C++ kernel prelude: scalar helpers with eager PyTorch semantics.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <algorithm>
#include <type_traits>
#include <omp.h>

// Vector variants from glibc's libmvec (linked with -lmvec): inside `#pragma omp simd` loops
// these math calls vectorize instead of running one element at a time.
extern "C" {
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
float logf(float);
#pragma omp declare simd notinbranch
float erff(float);
#pragma omp declare simd notinbranch
float tanhf(float);
#pragma omp declare simd notinbranch
float expm1f(float);
#pragma omp declare simd notinbranch
float log1pf(float);
#pragma omp declare simd notinbranch
float sinf(float);
#pragma omp declare simd notinbranch
float cosf(float);
#pragma omp declare simd notinbranch
double exp(double);
#pragma omp declare simd notinbranch
double log(double);
#pragma omp declare simd notinbranch
double erf(double);
#pragma omp declare simd notinbranch
double tanh(double);
#pragma omp declare simd notinbranch
double sin(double);
#pragma omp declare simd notinbranch
double cos(double);
}

namespace kiln {

#define KILN_VMATH(name) \
  static inline float v##name(float x) { return ::name##f(x); } \
  static inline double v##name(double x) { return ::name(x); } \
  template <typename T> static inline T v##name(T x) { return static_cast<T>(::name(static_cast<double>(x))); }
KILN_VMATH(exp)
KILN_VMATH(log)
KILN_VMATH(erf)
KILN_VMATH(tanh)
KILN_VMATH(sin)
KILN_VMATH(cos)
#undef KILN_VMATH
static inline float vexpm1(float x) { return ::expm1f(x); }
static inline double vexpm1(double x) { return std::expm1(x); }
static inline float vlog1p(float x) { return ::log1pf(x); }
static inline double vlog1p(double x) { return std::log1p(x); }

// float32 and float64 sqrt, log and log2 of a negative number (-inf included) are +NaN in eager's CPU kernels
// (MKL's vector math, in its vectorized and scalar loops alike), where x86's sqrt and glibc's log make the
// default NaN, which is negative; a NaN operand passes through both. The result is computed first and then
// replaced, so the libm call stays unconditional and vectorizes.
template <typename T> static inline T positive_nan_below_zero(T x, T result) {
  return x < T(0) ? std::numeric_limits<T>::quiet_NaN() : result;
}
template <typename T> static inline T sqrt_as_eager(T x) { return positive_nan_below_zero(x, std::sqrt(x)); }
template <typename T> static inline T log_as_eager(T x) { return positive_nan_below_zero(x, vlog(x)); }
template <typename T> static inline T log2_as_eager(T x) { return positive_nan_below_zero(x, std::log2(x)); }

// A float's bits, and its sign bit.
template <typename T> using FloatBits = typename std::conditional<sizeof(T) == 4, uint32_t, uint64_t>::type;
template <typename T> constexpr FloatBits<T> SIGN_BIT = FloatBits<T>(1) << (8 * sizeof(T) - 1);
template <typename T> static inline FloatBits<T> bits_of(T x) {
  FloatBits<T> bits;
  std::memcpy(&bits, &x, sizeof(x));
  return bits;
}
template <typename T> static inline T from_bits(FloatBits<T> bits) {
  T x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

static inline float bf16_to_float(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// Storing a value: a NaN keeps its sign and upper payload (quieted), so that a bf16 NaN copied, moved or
// negated keeps its bits as in eager; an op's result has already been rounded by round_bf16.
static inline uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if (f != f) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fff + ((bits >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

// An op's float result rounded to bf16, as c10's scalar conversion rounds it (a NaN is 0x7fc0): eager's scalar
// loop, which a tensor shorter than a vector, a vector loop's tail and strided operands see. (Its vectorized
// loop, ATen's cvtfp32_bf16, makes a NaN 0xffff: tests/codegen/test_nan_bits.py.)
static inline float round_bf16(float f) { return f != f ? bf16_to_float(0x7fc0) : bf16_to_float(float_to_bf16(f)); }

// IEEE half: float <-> binary16 bits (round to nearest even, subnormals, inf and NaN kept).
static inline float fp16_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: value man * 2^-24
    float f = static_cast<float>(man) * 5.9604644775390625e-08f;
    return sign ? -f : f;
  }
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

static inline uint16_t float_to_fp16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  uint32_t abs = bits & 0x7fffffffu;
  // a NaN keeps its sign and upper payload, quieted (c10's conversion and x86's vcvtps2ph alike)
  if (abs > 0x7f800000u) return sign | 0x7e00 | static_cast<uint16_t>((abs >> 13) & 0x3ff);
  if (abs == 0x7f800000u) return sign | 0x7c00;
  if (abs >= 0x477ff000u) return sign | 0x7c00;                                   // rounds past 65504
  if (abs < 0x38800000u) {  // below the smallest normal half: a subnormal (or zero), rounded to even
    float a;
    std::memcpy(&a, &abs, sizeof(a));
    float scaled = a * 16777216.0f;  // in units of 2^-24; exact, and nearbyint rounds half to even
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t rounded = abs + 0xfff + ((abs >> 13) & 1) - (112u << 23);
  return sign | static_cast<uint16_t>(rounded >> 13);
}

static inline float round_fp16(float f) { return fp16_to_float(float_to_fp16(f)); }

// A float converted to an integer type as eager's CPU kernels convert it on x86-64. C++ leaves the conversion of
// a value outside the target's range undefined, and the compiler uses that: a NaN it can see became 0 where eager
// gives INT64_MIN. Eager's conversion truncates toward zero into int64 for an 8-byte target and into int32 for a
// narrower one; NaN, the infinities and values outside that type's range give its minimum (the instruction's
// "integer indefinite"); a narrower target keeps the low bits of the int32 (NaN to int8 is 0, 300.5 to uint8 44).
template <typename I, typename F> static inline I float_to_int(F x) {
  using Wide = typename std::conditional<(sizeof(I) > 4), int64_t, int32_t>::type;
  constexpr F bound = static_cast<F>(-static_cast<double>(std::numeric_limits<Wide>::min()));  // 2^63 or 2^31
  const bool fits = x >= -bound && x < bound;
  return static_cast<I>(fits ? static_cast<Wide>(x) : std::numeric_limits<Wide>::min());
}

// NaN wins; between equal values (0.0 and -0.0) the first, as eager's maximum, clamp and relu.
template <typename T> static inline T maximum(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) { if (a != a) return a; if (b != b) return b; }
  return a < b ? b : a;
}
template <typename T> static inline T minimum(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) { if (a != a) return a; if (b != b) return b; }
  return b < a ? b : a;
}
// The same, for an accumulator updated in vector lanes (a max's lane tiles): the comparison first and the NaNs
// selected after it, selects with no early return, which GCC vectorizes with blends (a row's max in lanes took
// half the time). A sequential chain of updates keeps the forms above, whose NaN branches are predicted: there these
// three dependent selects took three times as long.
template <typename T> static inline T maximum_in_lanes(T a, T b) {
  const T larger = a < b ? b : a;
  if constexpr (std::is_floating_point<T>::value) { const T with_b = b != b ? b : larger; return a != a ? a : with_b; }
  return larger;
}
template <typename T> static inline T minimum_in_lanes(T a, T b) {
  const T smaller = b < a ? b : a;
  if constexpr (std::is_floating_point<T>::value) { const T with_b = b != b ? b : smaller; return a != a ? a : with_b; }
  return smaller;
}
// sign(NaN) is 0, as eager's.
template <typename T> static inline T sign(T a) { return static_cast<T>((T(0) < a) - (a < T(0))); }

// -a in two's complement without signed overflow (eager's -INT64_MIN and abs(INT64_MIN) are INT64_MIN).
template <typename T> static inline T wrapping_neg(T a) {
  if constexpr (std::is_signed<T>::value && !std::is_floating_point<T>::value) {
    return static_cast<T>(static_cast<typename std::make_unsigned<T>::type>(0) -
                          static_cast<typename std::make_unsigned<T>::type>(a));
  } else {
    return -a;
  }
}
// Negation, abs and copysign set a float's sign bit on its bits, as eager's kernels do for a NaN, not through
// `-x`, std::abs or std::copysign: GCC takes a NaN's sign as insignificant and folds them away (`x - (-y)` made
// `x + y`, `(-x) / (-y)` made `x / y`, the fabs of `x * x` dropped and `copysign(y, x * x)` made fabs(y): it takes a
// square to be non-negative, and the square of a negative NaN is negative).
template <typename T> static inline T copy_sign(T magnitude, T sign) {
  return from_bits<T>((bits_of(magnitude) & ~SIGN_BIT<T>) | (bits_of(sign) & SIGN_BIT<T>));
}
template <typename T> static inline T negate(T a) { return from_bits<T>(bits_of(a) ^ SIGN_BIT<T>); }
template <typename T> static inline T absolute(T a) {
  if constexpr (std::is_floating_point<T>::value) return from_bits<T>(bits_of(a) & ~SIGN_BIT<T>);
  else if constexpr (!std::is_signed<T>::value) return a;
  else return a < 0 ? wrapping_neg(a) : a;
}

// Invalid values eager rejects: a kernel ORs the error bit (kiln/lower/ir.py KERNEL_ERRORS) of each value it
// rejects into its `kiln_error`, which it returns and the wrapper raises. The checks are branch-free and
// `kiln_error` is an OR-reduction of the kernel's parallel regions (CppKernel adds the clauses): a loop with
// checks still vectorizes and hoists its invariant index loads (with a reporting branch or an atomic
// store, an embedding's gather ran several times slower), and threads do not race.
constexpr int64_t ZERO_DIVISION = 1;
static inline void report(int64_t& err, bool bad, int64_t code) { err |= bad ? code : int64_t(0); }
// `i` if 0 <= i < n, else 0 (a valid address) with `code` reported.
static inline int64_t check_index(int64_t i, int64_t n, int64_t code, int64_t& err) {
  bool bad = static_cast<uint64_t>(i) >= static_cast<uint64_t>(n);
  report(err, bad, code);
  return bad ? 0 : i;
}
// A divisor of 0 is reported and replaced by 1 (the quotient is never used: the wrapper raises).
template <typename T> static inline T checked_divisor(T b, int64_t& err) {
  report(err, b == 0, ZERO_DIVISION);
  return b == 0 ? T(1) : b;
}
// b == -1 is answered without dividing: INT_MIN / -1 overflows, which x86 traps (SIGFPE); eager wraps.
template <typename T> static inline bool minus_one(T b) {
  if constexpr (std::is_signed<T>::value) return b == T(-1);
  else return false;
}

// Floating floor division as eager's div_floor_floating (floor(a / b) misrounds 1 // 0.1 to 10).
template <typename T> static inline T floordiv(T a, T b) {
  if (b == 0) return a / b;
  T mod = std::fmod(a, b);
  T div = (a - mod) / b;
  if (mod != 0 && (b < 0) != (mod < 0)) div -= T(1);
  if (div == 0) return std::copysign(T(0), a / b);
  T floordiv = std::floor(div);
  if (div - floordiv > T(0.5)) floordiv += T(1);
  return floordiv;
}
template <typename T> static inline T floordiv(T a, T b, int64_t& err) {
  b = checked_divisor(b, err);
  if (minus_one(b)) return wrapping_neg(a);
  T q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
  return q;
}
// Index arithmetic over an int input's symbol, which may be negative: Python's rounding (torch's FloorDiv,
// PythonMod), where C++'s `/` and `%` truncate toward zero.
static inline int64_t index_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t index_mod(int64_t a, int64_t b) {
  int64_t r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
template <typename T> static inline T truncdiv(T a, T b) { return std::trunc(a / b); }
template <typename T> static inline T truncdiv(T a, T b, int64_t& err) {
  b = checked_divisor(b, err);
  return minus_one(b) ? wrapping_neg(a) : a / b;
}
template <typename T> static inline T pymod(T a, T b) {
  T r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
template <typename T> static inline T pymod(T a, T b, int64_t& err) {
  b = checked_divisor(b, err);
  if (minus_one(b)) return 0;
  T r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
template <typename T> static inline T cfmod(T a, T b) { return std::fmod(a, b); }
template <typename T> static inline T cfmod(T a, T b, int64_t& err) {
  b = checked_divisor(b, err);
  return minus_one(b) ? T(0) : static_cast<T>(a % b);
}
// Integer powers wrap on overflow as eager's do (computed unsigned: signed overflow is undefined in C++).
template <typename T> static inline T ipow(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) { return std::pow(a, b); }
  else {
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
    using U = typename std::make_unsigned<T>::type;
    U r = 1, base = static_cast<U>(a);
    while (b) { if (b & 1) r = static_cast<U>(r * base); base = static_cast<U>(base * base); b >>= 1; }
    return static_cast<T>(r);
  }
}
template <typename T> static inline T sigmoid(T a) { return T(1) / (T(1) + vexp(-a)); }
template <typename T> static inline T lowest() {
  if constexpr (std::is_floating_point<T>::value) return -std::numeric_limits<T>::infinity();
  else return std::numeric_limits<T>::lowest();
}
template <typename T> static inline T highest() {
  if constexpr (std::is_floating_point<T>::value) return std::numeric_limits<T>::infinity();
  else return std::numeric_limits<T>::max();
}

template <typename T> struct Welford {
  T mean = 0, m2 = 0, n = 0;
  inline void update(T x) { n += 1; T d = x - mean; mean += d / n; m2 += d * (x - mean); }
  inline void merge(const Welford& o) {
    if (o.n == 0) return;
    if (n == 0) { *this = o; return; }
    T tot = n + o.n, d = o.mean - mean;
    mean += d * (o.n / tot);
    m2 += o.m2 + d * d * (n * o.n / tot);
    n = tot;
  }
};

// First index wins ties; a NaN is the maximum (and minimum), like eager.
template <typename T, bool Max> struct ArgReduce {
  T value = Max ? lowest<T>() : highest<T>();
  int64_t index = 0;
  bool seen = false;
  inline void update(T x, int64_t i) {
    if (!seen) { value = x; index = i; seen = true; return; }
    bool value_nan = false, x_nan = false;
    if constexpr (std::is_floating_point<T>::value) { value_nan = value != value; x_nan = x != x; }
    if (value_nan) return;
    if (x_nan || (Max ? x > value : x < value)) { value = x; index = i; }
  }
  inline void merge(const ArgReduce& o) {
    if (!o.seen) return;
    if (!seen) { *this = o; return; }
    bool value_nan = false, o_nan = false;
    if constexpr (std::is_floating_point<T>::value) { value_nan = value != value; o_nan = o.value != o.value; }
    if (value_nan) return;
    if (o_nan || (Max ? o.value > value : o.value < value) || (o.value == value && o.index < index)) *this = o;
  }
};

// The derivatives of lgamma as ATen computes them (calc_digamma, trigamma: Cephes), in T's own arithmetic, so
// that lgamma's gradient and digamma / polygamma(0|1, x) give eager's values.
template <typename T> static inline T digamma_from(T x) {  // x > 0
  T result = 0;
  while (x < T(10)) { result -= T(1) / x; x += T(1); }
  if (x == T(10)) return result + T(2.25175258906672110764);
  T y = 0;
  if (x < T(1.0e17)) {
    const T z = T(1) / (x * x);
    const T A[] = {T(8.33333333333333333333E-2), T(-2.10927960927960927961E-2), T(7.57575757575757575758E-3),
                   T(-4.16666666666666666667E-3), T(3.96825396825396825397E-3), T(-8.33333333333333333333E-3),
                   T(8.33333333333333333333E-2)};
    T poly = 0;
    for (int i = 0; i < 7; ++i) poly = poly * z + A[i];
    y = z * poly;
  }
  return result + std::log(x) - (T(0.5) / x) - y;
}
template <typename T> static inline T digamma(T x) {
  if (x == 0) return std::copysign(std::numeric_limits<T>::infinity(), -x);
  if (x < 0) {
    if (x == std::trunc(x)) return std::numeric_limits<T>::quiet_NaN();
    double whole;
    const double r = std::modf(static_cast<double>(x), &whole);  // tan of the fraction: exact periodicity
    const double pi = 3.14159265358979323846;
    return digamma_from<T>(T(1) - x) - static_cast<T>(pi / std::tan(pi * r));
  }
  return digamma_from<T>(x);
}
template <typename T> static inline T trigamma(T x) {
  const T pi = T(3.14159265358979323846);
  T sign = 1, result = 0;
  if (x < T(0.5)) {
    sign = -1;
    const T s = std::sin(pi * x);
    result -= (pi * pi) / (s * s);
    x = T(1) - x;
  }
  for (int i = 0; i < 6; ++i) { result += T(1) / (x * x); x += T(1); }
  const T ixx = T(1) / (x * x);
  result += (T(1) + T(1) / (T(2) * x) + ixx * (T(1) / T(6) - ixx * (T(1) / T(30) - ixx * (T(1) / T(42))))) / x;
  return sign * result;
}

// The Hurwitz zeta function sum over k >= 0 of (k + q)^-x, as ATen's CPU kernel computes it (Cephes' zeta:
// terms summed directly until q + k passes 9, then the Euler-Maclaurin tail), in double as ATen accumulates on
// the CPU; its first term is a power in T, as ATen's is. Polygamma of order n >= 2 is a multiple of zeta(n + 1, x).
template <typename T> static inline T zeta(T x, T q) {
  const double eps = 1.11022302462515654042E-16;  // Cephes' MACHEP: a term below eps * sum ends the series
  // (2j)! / B_2j, B_2j the Bernoulli numbers: the tail's coefficients
  static const double bernoulli_ratio[12] = {
      12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9, 7.47242496e10,
      -2.950130727918164224e12, 1.1646782814350067249e14, -4.5979787224074726105e15, 1.8152105401943546773e17,
      -7.1661652561756670113e18};
  if (x == T(1)) return std::numeric_limits<T>::infinity();
  if (x < T(1)) return std::numeric_limits<T>::quiet_NaN();
  if (q <= T(0)) {
    if (q == std::floor(q)) return std::numeric_limits<T>::infinity();  // a pole
    if (x != std::floor(x)) return std::numeric_limits<T>::quiet_NaN();  // (k + q)^-x of a negative base
  }
  double sum = static_cast<double>(std::pow(q, -x));
  double base = q, term = 0;
  for (int k = 0; k < 9 || base <= 9.0; ++k) {
    base += 1.0;
    term = std::pow(base, -static_cast<double>(x));
    sum += term;
    if (-eps * sum < term && term < eps * sum) return static_cast<T>(sum);
  }
  const double w = base;
  sum += term * w / (static_cast<double>(x) - 1.0);
  sum -= 0.5 * term;
  double rising = 1.0, k = 0.0;  // x (x + 1) ... (x + 2j), built two factors a step
  for (int j = 0; j < 12; ++j) {
    rising *= static_cast<double>(x) + k;
    term /= w;
    const double t = rising * term / bernoulli_ratio[j];
    sum += t;
    if (-eps * sum < std::fabs(t) && std::fabs(t) < eps * sum) return static_cast<T>(sum);
    k += 1.0;
    rising *= static_cast<double>(x) + k;
    term /= w;
    k += 1.0;
  }
  return static_cast<T>(sum);
}

}  // namespace kiln
