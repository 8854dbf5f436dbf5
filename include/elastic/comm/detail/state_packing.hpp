// How an elastic_group's resync moves rank 0's replicated state: a fingerprint of the state's
// layout (names, kinds, sizes) that every rank compares before bytes move, and the host state
// packed into one byte string (objects as a u64 length and their bytes, host buffers as they are)
// and unpacked on the other ranks. Device buffers travel apart, by a device communicator, so the
// packing skips them, or refuses them where the communicator moves host memory only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <elastic/checkpoint/state.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::comm::detail {

/// Whether entry `e` stays out of the packed host state: slices move on their own
/// (detail/shard_resync.hpp); device entries travel by the device communicator
/// (`device_comm`); with a host one they cannot, and that is an error.
inline bool skip_entry(const checkpoint::entry& e, bool device_comm) {
  if (e.shard) return true;
  if (e.kind == checkpoint::entry_kind::object || e.where == checkpoint::location::host) return false;
  if (device_comm) return true;
  throw error(errc::invalid_argument,
              fmt::format("elastic_group: state entry '{}' lives in device memory and this group's communicator "
                          "moves host memory only: use a device communicator (nccl) or keep a host copy",
                          e.name));
}

/// Names, kinds and sizes of the state (a slice: its global size): ranks must agree before
/// bytes move.
inline std::uint64_t fingerprint(const checkpoint::state& st) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  for (const auto& e : st.entries()) {
    mix(e.name.data(), e.name.size() + 1);
    const auto kind = static_cast<std::uint8_t>(e.kind);
    mix(&kind, 1);
    const std::uint64_t bytes = e.kind == checkpoint::entry_kind::object ? 0
                                : e.shard                                ? e.shard->global_count * e.element_bytes
                                                                         : e.bytes;
    mix(&bytes, sizeof bytes);
    const std::uint8_t sliced = e.shard ? 1 : 0;
    mix(&sliced, 1);
  }
  return h >> 1;  // travels as a non-negative int64
}

/// Hands `f` the host state of `st` as pack() lays it out, piece by piece (a span of bytes
/// each): what a resync hashes without building the packed string.
template <class F>
void for_each_packed(const checkpoint::state& st, bool device_comm, F&& f) {
  std::vector<std::byte> obj;
  for (const auto& e : st.entries()) {
    if (e.kind == checkpoint::entry_kind::object) {
      obj.clear();
      e.save(obj);
      const std::uint64_t n = obj.size();
      f(std::as_bytes(std::span<const std::uint64_t>(&n, 1)));
      f(std::span<const std::byte>(obj));
    } else if (!skip_entry(e, device_comm)) {
      f(std::span<const std::byte>(static_cast<const std::byte*>(e.data), e.bytes));
    }
  }
}

/// Appends the host state of `st` to `out`.
inline void pack(const checkpoint::state& st, std::vector<std::byte>& out, bool device_comm) {
  for_each_packed(st, device_comm, [&](std::span<const std::byte> s) { out.insert(out.end(), s.begin(), s.end()); });
}

/// Loads what pack() made on rank 0 into `st`; throws errc::corrupt where it ends early.
inline void unpack(checkpoint::state& st, std::span<const std::byte> in, bool device_comm) {
  std::size_t at = 0;
  auto take = [&](std::size_t n, const std::string& name) {
    if (n > in.size() - at) {
      throw error(errc::corrupt, fmt::format("elastic_group: rank 0's state ended inside entry '{}'", name));
    }
    auto s = in.subspan(at, n);
    at += n;
    return s;
  };
  for (const auto& e : st.entries()) {
    if (e.kind == checkpoint::entry_kind::object) {
      std::uint64_t n = 0;
      std::memcpy(&n, take(sizeof n, e.name).data(), sizeof n);
      e.load(take(static_cast<std::size_t>(n), e.name));
    } else if (!skip_entry(e, device_comm)) {
      const auto s = take(e.bytes, e.name);
      if (!s.empty()) std::memcpy(e.data, s.data(), s.size());
    }
  }
}

}  // namespace elastic::inline v1::comm::detail
