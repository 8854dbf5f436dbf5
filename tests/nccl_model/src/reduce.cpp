#include "reduce.hpp"

#include <cmath>
#include <cstring>
#include <type_traits>

namespace nccl_model {
namespace {

// A binary floating format narrower than float: IEEE-like (fp16, bf16, e5m2) or e4m3 "fn" (no
// infinities, one NaN pattern per sign).
struct small_format {
  int exp_bits;
  int mant_bits;
  int bias;
  bool ieee_specials;  // an all-ones exponent means inf/NaN
  bool saturate;       // overflow goes to the largest finite value (cuda_fp8.h __NV_SATFINITE)
  double max_finite;
};

constexpr small_format fp16{5, 10, 15, true, false, 65504.0};
constexpr small_format bf16{8, 7, 127, true, false, 3.38953138925153547590470800371487866880e+38};
constexpr small_format e4m3{4, 3, 7, false, true, 448.0};
constexpr small_format e5m2{5, 2, 15, true, true, 57344.0};

const small_format* format_of(ncclDataType_t t) {
  switch (t) {
    case ncclFloat16: return &fp16;
    case ncclBfloat16: return &bf16;
    case ncclFloat8e4m3: return &e4m3;
    case ncclFloat8e5m2: return &e5m2;
    default: return nullptr;
  }
}

double decode(const small_format& f, std::uint32_t bits) {
  const std::uint32_t exp_mask = (1u << f.exp_bits) - 1;
  const std::uint32_t mant_mask = (1u << f.mant_bits) - 1;
  const bool negative = ((bits >> (f.exp_bits + f.mant_bits)) & 1u) != 0;
  const std::uint32_t e = (bits >> f.mant_bits) & exp_mask;
  const std::uint32_t m = bits & mant_mask;
  double v = 0;
  if (f.ieee_specials && e == exp_mask) {
    v = m == 0 ? INFINITY : NAN;
  } else if (!f.ieee_specials && e == exp_mask && m == mant_mask) {
    v = NAN;
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - f.bias - f.mant_bits);
  } else {
    v = std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -f.mant_bits), static_cast<int>(e) - f.bias);
  }
  return negative ? -v : v;
}

std::uint32_t encode(const small_format& f, double v) {
  const std::uint32_t sign = std::signbit(v) ? 1u << (f.exp_bits + f.mant_bits) : 0u;
  const std::uint32_t exp_mask = (1u << f.exp_bits) - 1;
  const std::uint32_t mant_mask = (1u << f.mant_bits) - 1;
  const std::uint32_t inf_bits = exp_mask << f.mant_bits;
  const std::uint32_t max_bits = f.ieee_specials ? inf_bits - 1 : (exp_mask << f.mant_bits) | (mant_mask - 1);
  if (std::isnan(v)) return sign | (f.ieee_specials ? inf_bits | (1u << (f.mant_bits - 1)) : inf_bits | mant_mask);
  const double a = std::fabs(v);
  if (a == 0) return sign;
  const int min_exp = 1 - f.bias;
  int k = 0;
  (void)std::frexp(a, &k);  // a = x * 2^k, x in [0.5, 1)
  const int q_exp = std::isinf(a) ? 0 : (k - 1 > min_exp ? k - 1 : min_exp);
  const double r = std::isinf(a) ? a : std::nearbyint(std::ldexp(a, f.mant_bits - q_exp)) * std::ldexp(1.0, q_exp - f.mant_bits);
  if (r > f.max_finite) return sign | (f.saturate || !f.ieee_specials ? max_bits : inf_bits);
  if (r < std::ldexp(1.0, min_exp)) {
    return sign | static_cast<std::uint32_t>(std::ldexp(r, f.mant_bits - min_exp));  // subnormal
  }
  (void)std::frexp(r, &k);
  const int e = k - 1;
  const auto m = static_cast<std::uint32_t>(std::ldexp(r, f.mant_bits - e)) - (1u << f.mant_bits);
  return sign | (static_cast<std::uint32_t>(e + f.bias) << f.mant_bits) | m;
}

template <class T>
T load(const std::byte* p, std::size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

template <class T>
void store(std::byte* p, std::size_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

template <class T>
T combine(ncclRedOp_t op, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;  // wraps instead of overflowing, as the GPU does
    if (op == ncclSum || op == ncclAvg) return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    if (op == ncclProd) return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    if (op == ncclSum || op == ncclAvg) return a + b;
    if (op == ncclProd) return a * b;
  }
  if (op == ncclMax) return a < b ? b : a;
  return b < a ? b : a;  // ncclMin
}

template <class T>
void reduce_native(ncclRedOp_t op, int n, const std::byte* const* in, std::byte* out, std::size_t count) {
  const T scale = static_cast<T>(1) / static_cast<T>(n);  // unused for integers
  auto input = [&](int r, std::size_t i) {
    const T x = load<T>(in[r], i);
    if constexpr (std::is_floating_point_v<T>) return op == ncclAvg ? static_cast<T>(x * scale) : x;
    return x;
  };
  for (std::size_t i = 0; i < count; ++i) {
    T acc = input(0, i);
    for (int r = 1; r < n; ++r) acc = combine<T>(op, acc, input(r, i));
    if constexpr (std::is_integral_v<T>) {
      if (op == ncclAvg) {
        if constexpr (std::is_signed_v<T>) {
          acc = static_cast<T>(static_cast<long long>(acc) / n);  // C++ division truncates toward zero
        } else {
          acc = static_cast<T>(static_cast<unsigned long long>(acc) / static_cast<unsigned>(n));
        }
      }
    }
    store<T>(out, i, acc);
  }
}

template <class Bits>
void reduce_small(const small_format& f, ncclRedOp_t op, int n, const std::byte* const* in, std::byte* out,
                  std::size_t count) {
  const double scale = decode(f, encode(f, 1.0 / n));  // the 1/n of ncclDevPreMulSum, in the element type
  auto input = [&](int r, std::size_t i) {
    const double x = decode(f, load<Bits>(in[r], i));
    return op == ncclAvg ? decode(f, encode(f, x * scale)) : x;
  };
  for (std::size_t i = 0; i < count; ++i) {
    double acc = input(0, i);
    for (int r = 1; r < n; ++r) acc = decode(f, encode(f, combine<double>(op, acc, input(r, i))));
    store<Bits>(out, i, static_cast<Bits>(encode(f, acc)));
  }
}

}  // namespace

std::size_t type_size(ncclDataType_t t) noexcept {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

void reduce_in_rank_order(ncclDataType_t t, ncclRedOp_t op, int n, const std::byte* const* in, std::byte* out,
                          std::size_t count) {
  switch (t) {
    case ncclInt8: return reduce_native<std::int8_t>(op, n, in, out, count);
    case ncclUint8: return reduce_native<std::uint8_t>(op, n, in, out, count);
    case ncclInt32: return reduce_native<std::int32_t>(op, n, in, out, count);
    case ncclUint32: return reduce_native<std::uint32_t>(op, n, in, out, count);
    case ncclInt64: return reduce_native<std::int64_t>(op, n, in, out, count);
    case ncclUint64: return reduce_native<std::uint64_t>(op, n, in, out, count);
    case ncclFloat32: return reduce_native<float>(op, n, in, out, count);
    case ncclFloat64: return reduce_native<double>(op, n, in, out, count);
    case ncclFloat16: return reduce_small<std::uint16_t>(fp16, op, n, in, out, count);
    case ncclBfloat16: return reduce_small<std::uint16_t>(bf16, op, n, in, out, count);
    case ncclFloat8e4m3: return reduce_small<std::uint8_t>(e4m3, op, n, in, out, count);
    case ncclFloat8e5m2: return reduce_small<std::uint8_t>(e5m2, op, n, in, out, count);
    default: return;
  }
}

double small_float_value(ncclDataType_t t, std::uint32_t bits) noexcept {
  const small_format* f = format_of(t);
  return f ? decode(*f, bits) : NAN;
}

std::uint32_t small_float_bits(ncclDataType_t t, double v) noexcept {
  const small_format* f = format_of(t);
  return f ? encode(*f, v) : 0;
}

}  // namespace nccl_model
