// <elastic/fwd.hpp> declares what the full headers define, the same way: a translation unit that
// names the types through fwd.hpp and then includes everything compiles, and the declared types
// are the defined ones.
#include <elastic/fwd.hpp>

#include <type_traits>

namespace {
// Only names the types, as a trainer's header would.
struct holder {
  elastic::timer::watchdog* watchdog = nullptr;
  elastic::checkpoint::state* state = nullptr;
  elastic::training_loop* loop = nullptr;
  elastic::rendezvous::store* store = nullptr;
  elastic::comm::gloo_group* group = nullptr;
};
int count_named(const holder& h) {
  return (h.watchdog != nullptr) + (h.state != nullptr) + (h.loop != nullptr) + (h.store != nullptr) + (h.group != nullptr);
}
}  // namespace

#include <elastic/elastic.hpp>

#include "support/catch.hpp"

static_assert(std::is_same_v<elastic::training_loop, elastic::checkpoint::training_loop>);
static_assert(std::is_same_v<elastic::comm::gloo_group, elastic::comm::elastic_group<elastic::comm::gloo_communicator>>);
static_assert(std::is_enum_v<elastic::errc> && std::is_enum_v<elastic::checkpoint::dtype>);

TEST_CASE("fwd.hpp declares the types the full headers define") {
  holder h;
  CHECK(count_named(h) == 0);
  elastic::checkpoint::state s;
  h.state = &s;
  CHECK(count_named(h) == 1);
}
