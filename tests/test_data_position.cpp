// The data position (checkpoint/data_position.hpp): batches the same whatever the world, each
// sample once per epoch, restored through the state, another dataset refused.
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <elastic/checkpoint/data_position.hpp>
#include <elastic/checkpoint/state.hpp>

#include "support/catch.hpp"
#include "support/errors.hpp"

using elastic::errc;
using elastic::test::error_of;
namespace ck = elastic::checkpoint;

namespace {
bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
}  // namespace

TEST_CASE("a data position's batches are the same whatever the world, each sample once per epoch", "[checkpoint]") {
  elastic::data_position pos({.samples = 103, .global_batch = 10, .seed = 42});
  std::multiset<std::uint64_t> epoch0;
  std::vector<std::vector<std::uint64_t>> batches;
  const int worlds[] = {4, 3, 4, 1, 2};  // a world that changes every few steps
  for (int s = 0; s < 11; ++s) {
    const int world = worlds[s % 5];
    std::vector<std::uint64_t> joined;
    for (int r = 0; r < world; ++r) {
      const auto share = pos.share(r, world);
      joined.insert(joined.end(), share.begin(), share.end());
    }
    auto batch = pos.batch();
    CHECK(std::multiset<std::uint64_t>(joined.begin(), joined.end()) ==
          std::multiset<std::uint64_t>(batch.begin(), batch.end()));
    epoch0.insert(batch.begin(), batch.end());
    batches.push_back(batch);
    pos.advance();
  }
  CHECK(batches.back().size() == 3);  // the epoch's remainder: 103 = 10 * 10 + 3
  CHECK(epoch0.size() == 103);
  CHECK(std::set<std::uint64_t>(epoch0.begin(), epoch0.end()).size() == 103);
  CHECK(pos.epoch() == 1);
  CHECK(pos.offset() == 0);
  CHECK(pos.batch() != batches.front());  // another epoch, another order

  elastic::data_position again({.samples = 103, .global_batch = 10, .seed = 42});
  CHECK(again.batch() == batches.front());  // the order is a function of the seed and epoch
  std::vector<std::uint64_t> micro;
  for (std::size_t m = 0; m < 4; ++m) {
    const auto part = again.micro_batch(m, 4);
    CHECK((part.size() == 3 || part.size() == 2));
    micro.insert(micro.end(), part.begin(), part.end());
  }
  CHECK(micro == batches.front());
}

TEST_CASE("a data position restores through the state and refuses another dataset", "[checkpoint]") {
  elastic::data_position pos({.samples = 50, .global_batch = 8, .seed = 1});
  ck::state st;
  pos.add_to(st);
  pos.advance();
  pos.advance();
  const auto* e = st.find("data_position");
  REQUIRE(e);
  std::vector<std::byte> saved(e->bytes);
  std::memcpy(saved.data(), e->data, e->bytes);
  const auto at = pos.batch();

  elastic::data_position fresh({.samples = 50, .global_batch = 8, .seed = 1});
  ck::state st2;
  fresh.add_to(st2);
  std::memcpy(st2.find("data_position")->data, saved.data(), saved.size());  // what a restore does
  CHECK(fresh.offset() == 16);
  CHECK(fresh.batch() == at);

  elastic::data_position other({.samples = 60, .global_batch = 8, .seed = 1});
  ck::state st3;
  other.add_to(st3);
  std::memcpy(st3.find("data_position")->data, saved.data(), saved.size());
  const auto err = error_of([&] { (void)other.batch(); });
  CHECK(err.code() == errc::mismatch);
  CHECK(contains(err.what(), "50 samples"));
  CHECK(error_of([&] { (void)pos.share(3, 3); }).code() == errc::invalid_argument);
  CHECK(error_of([] { elastic::data_position({.samples = 0, .global_batch = 8}); }).code() == errc::invalid_argument);
}
