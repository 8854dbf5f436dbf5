// A store that forwards every call to another: tests derive from it and override the calls they
// watch, hold up or count.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <elastic/rendezvous/store.hpp>

namespace elastic::test {

class forwarding_store : public elastic::rendezvous::store {
 public:
  using lease_id = elastic::rendezvous::lease_id;
  explicit forwarding_store(elastic::rendezvous::store& s) : s_(s) {}

  void set(std::string_view k, std::string_view v, lease_id l) override { s_.set(k, v, l); }
  std::optional<std::string> get(std::string_view k) override { return s_.get(k); }
  using store::get;
  std::int64_t add(std::string_view k, std::int64_t d) override { return s_.add(k, d); }
  bool compare_set(std::string_view k, std::optional<std::string_view> expected, std::string_view desired, lease_id l,
                   std::optional<std::string>* actual) override {
    return s_.compare_set(k, expected, desired, l, actual);
  }
  bool erase(std::string_view k) override { return s_.erase(k); }
  void wait(std::span<const std::string> keys, std::chrono::milliseconds t) override { s_.wait(keys, t); }
  std::vector<std::pair<std::string, std::string>> list(std::string_view p) override { return s_.list(p); }
  lease_id grant(std::chrono::milliseconds ttl) override { return s_.grant(ttl); }
  void keep_alive(lease_id l) override { s_.keep_alive(l); }
  void revoke(lease_id l) override { s_.revoke(l); }

 protected:
  elastic::rendezvous::store& s_;
};

}  // namespace elastic::test
