// Element types and reductions of the NCCL model's collectives. Results must be bit-identical on
// every rank, so a reduction always combines the ranks' inputs in rank order 0..n-1, rounding to
// the element type after each step. ncclAvg: integers sum then divide, truncating toward zero (as
// NCCL's ncclDevSumPostDiv); floating types multiply each input by 1/n in the element type, then
// sum (as NCCL's ncclDevPreMulSum). Half, bfloat16 and the fp8 types compute each step in double
// and round to nearest even, saturating the fp8 types to their largest finite value (as the
// __NV_SATFINITE conversions of cuda_fp8.h).
#pragma once

#include <nccl.h>

#include <cstddef>
#include <cstdint>

namespace nccl_model {

/// Bytes per element; 0 for a type NCCL does not know.
std::size_t type_size(ncclDataType_t t) noexcept;

/// out[i] = op(inputs[0][i], ..., inputs[n-1][i]) for `count` elements.
void reduce_in_rank_order(ncclDataType_t t, ncclRedOp_t op, int n, const std::byte* const* inputs, std::byte* out,
                          std::size_t count);

/// The 16-bit and 8-bit floating formats, for tests: value <-> bits.
double small_float_value(ncclDataType_t t, std::uint32_t bits) noexcept;
std::uint32_t small_float_bits(ncclDataType_t t, double v) noexcept;

}  // namespace nccl_model
