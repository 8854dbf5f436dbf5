// A test's way into shm_store's private lock and table, for tests of what a client that dies in
// the middle of a write leaves behind. Named in shm_store as a friend; nothing else uses it.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include <elastic/rendezvous/shm_store.hpp>

namespace elastic::rendezvous {

struct shm_store_test_peer {
  /// Takes the store's lock and never gives it back (the caller then dies). Leaves `key`
  /// half-written, as a client killed in the middle of set() would.
  static void lock_and_start_writing(shm_store& s, std::string_view key) {
    s.lock();
    for (auto& e : s.layout().entries) {
      if (e.state == detail::entry_free) {
        e.state = detail::entry_writing;
        std::memcpy(e.key, key.data(), key.size());
        e.key_len = static_cast<std::uint32_t>(key.size());
        return;
      }
    }
  }
};

}  // namespace elastic::rendezvous
