// What every communicator (gloo on CPU, nccl on GPU) offers the elastic group: collectives over a
// fixed set of ranks, a health flag, and a way to give up on it.
//
// A communicator is built for one rendezvous round and never outlives it: when a peer dies, the
// collective that notices it throws elastic::error, ok() turns false for good, and the group
// builds a new communicator for the next round. Nothing repairs a communicator in place.
#pragma once

#include <concepts>
#include <cstdint>
#include <span>
#include <string_view>

#include <elastic/comm/half.hpp>

namespace elastic::inline v1::comm {

/// How allreduce combines the ranks' buffers.
enum class reduce_op {
  sum,  ///< element-wise sum
  avg,  ///< element-wise sum divided by size(); integers divide with truncation toward zero
};

/// A short, stable name for an operation (used in events and messages).
constexpr std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::avg: return "avg";
  }
  return "unknown";
}

/// The element types every communicator reduces: float, double, int32, int64 and the 16-bit
/// floats bfloat16/float16 (see half.hpp; NCCL reduces them natively, gloo through float).
template <class T>
concept reducible = std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, std::int32_t> ||
                    std::same_as<T, std::int64_t> || std::same_as<T, bfloat16> || std::same_as<T, float16>;

/// A communicator over `size()` ranks.
///
/// - `allreduce(buf, op)`: in place; every rank passes a buffer of the same length and gets the
///   same result.
/// - `broadcast(buf, root)`: in place; every rank ends with root's buffer.
/// - `barrier()`: returns once every rank has entered it.
/// - Each collective is bounded by the communicator's timeout: a collective that cannot finish
///   (a peer died or hangs) throws elastic::error (errc::timeout when the time ran out,
///   errc::peer_lost when a peer or its connection went away) and leaves `ok()` false; every
///   later call throws at once, with the same code.
/// - `abort()`: gives the communicator up; every later call throws errc::aborted at once.
///   Never throws.
template <class C>
concept communicator = requires(C& c, const C& cc, std::span<float> f32, std::span<double> f64,
                                std::span<std::int32_t> i32, std::span<std::int64_t> i64, std::span<bfloat16> bf16,
                                std::span<float16> f16, reduce_op op, int root) {
  { cc.rank() } -> std::convertible_to<int>;
  { cc.size() } -> std::convertible_to<int>;
  c.allreduce(f32, op);
  c.allreduce(f64, op);
  c.allreduce(i32, op);
  c.allreduce(i64, op);
  c.allreduce(bf16, op);
  c.allreduce(f16, op);
  c.broadcast(f32, root);
  c.broadcast(f64, root);
  c.broadcast(i32, root);
  c.broadcast(i64, root);
  c.broadcast(bf16, root);
  c.broadcast(f16, root);
  c.barrier();
  { cc.ok() } -> std::convertible_to<bool>;
  { c.abort() } noexcept;
};

/// A communicator whose collectives take device memory (NCCL). For the state that lives on the
/// host (step, RNG, loader cursor) it also broadcasts host words, through device staging.
template <class C>
concept device_communicator = requires(C& c, std::span<std::int64_t> words, int root) {
  requires C::takes_device_memory;
  c.broadcast_host(words, root);
};

}  // namespace elastic::inline v1::comm
