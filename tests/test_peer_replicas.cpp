// Peer-memory replicas (comm/detail/peer_replicas.hpp) between two endpoints on loopback: a
// snapshot kept by one arrives whole at its successor, the newest two steps are kept, and what
// a stray, hostile or dying sender writes to a listener is refused and never kept.
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <elastic/comm/detail/peer_replicas.hpp>
#include <elastic/internal/crc32c.hpp>
#include <elastic/internal/tcp.hpp>

#include "support/catch.hpp"

namespace {

using namespace std::chrono_literals;
namespace detail = elastic::comm::detail;
namespace ck = elastic::checkpoint;

constexpr std::uint64_t global = 1000;  // elements of the partitioned entry, floats

/// A state like a ZeRO-1 trainer's: replicated weights, a value, and partitioned moments.
struct trainer_state {
  std::vector<float> w = std::vector<float>(16, 1.0f);
  std::uint64_t seen = 7;
  std::vector<float> m;
  ck::state st;
  trainer_state(int rank, int world) {
    st.add("w", w).add_value("seen", seen).add_partitioned("m", m, global, rank, world);
    for (std::size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>(rank * 10000 + static_cast<int>(i));
  }
};

/// What the checkpointer's copier hands over: the entries as at the snapshot, their bytes.
struct staged {
  std::vector<ck::entry> records;
  std::vector<ck::staged_entry> entries;
  explicit staged(const ck::state& st) : records(st.entries()) {
    for (auto& r : records) {  // records carry no callbacks (the checkpointer copies fields)
      r.partition = nullptr;
      r.resize = nullptr;
    }
    for (std::size_t i = 0; i < records.size(); ++i) {
      entries.push_back({&records[i], {static_cast<const std::byte*>(st.entries()[i].data), st.entries()[i].bytes}});
    }
  }
  ck::staged_snapshot at(std::uint64_t step) const { return {step, entries}; }
};

bool eventually(const std::function<bool()>& f, std::chrono::milliseconds limit = 10s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (f()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return f();
}

std::shared_ptr<const detail::memory_image> find(const detail::peer_replicas& r, detail::image_key k) {
  for (const auto& i : r.images())
    if (i->key == k) return i;
  return nullptr;
}

/// Raw bytes for a listener, as a sender would write them (or a stray client).
struct frame {
  std::vector<std::byte> b;
  template <class T>
  frame& put(T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    b.insert(b.end(), p, p + sizeof v);
    return *this;
  }
  frame& text(const std::string& s) {
    put(static_cast<std::uint32_t>(s.size()));
    for (char c : s) b.push_back(static_cast<std::byte>(c));
    return *this;
  }
  frame& head(const std::string& run, std::uint64_t token, std::int64_t rank, std::int64_t world, std::int64_t step) {
    put(std::uint32_t{0x50524c45}).put(std::uint32_t{1}).text(run).put(token);
    return put(rank).put(world).put(step);
  }
};

/// Writes `f` to `to`'s listener, then closes; returns the one-byte answer (-1: none).
int send_raw(const detail::peer_address& to, const frame& f) {
  const auto deadline = elastic::internal::tcp::clock::now() + 5s;
  auto fd = elastic::internal::tcp::connect_to(to.host, to.port, deadline);
  try {
    elastic::internal::tcp::send_all(fd.get(), f.b.data(), f.b.size(), deadline, "test");
    ::shutdown(fd.get(), SHUT_WR);
    std::uint8_t a = 0;
    elastic::internal::tcp::recv_all(fd.get(), &a, 1, deadline, "test");
    return a;
  } catch (const elastic::error&) {
    return -1;
  }
}

}  // namespace

TEST_CASE("a kept snapshot reaches the successor whole, and the newest two steps are kept on each side") {
  trainer_state s0(0, 2), s1(1, 2);
  detail::peer_replicas a(s0.st, "run", "127.0.0.1", 1, {}), b(s1.st, "run", "127.0.0.1", 1, {});
  // One group: both take rank 0's token, as a resync has them do.
  a.follow(0, 2, {a.address(), b.address()}, a.token());
  b.follow(1, 2, {a.address(), b.address()}, a.token());
  const staged snap(s0.st);
  a.keep(snap.at(10));
  REQUIRE(eventually([&] { return b.stats().received == 1; }));
  const auto r = find(b, {0, 2, 10, false});
  REQUIRE(r);
  REQUIRE(r->sizes.size() == 1);
  REQUIRE(r->bytes(0).size() == s0.m.size() * sizeof(float));
  CHECK(std::memcmp(r->bytes(0).data(), s0.m.data(), r->bytes(0).size()) == 0);
  // The sender's own image holds everything: the replicated weights and value too.
  const auto own = find(a, {0, 2, 10, true});
  REQUIRE(own);
  CHECK(std::memcmp(own->bytes(0).data(), s0.w.data(), s0.w.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(own->bytes(1).data(), &s0.seen, sizeof s0.seen) == 0);

  for (std::uint64_t step : {20, 30}) {  // one at a time: a sender sends only the newest it has
    s0.m[0] = static_cast<float>(step);
    a.keep(snap.at(step));
    REQUIRE(eventually([&] { return b.stats().received == step / 10; }));
  }
  CHECK_FALSE(find(b, {0, 2, 10, false}));
  CHECK(find(b, {0, 2, 20, false}));
  const auto newest = find(b, {0, 2, 30, false});
  REQUIRE(newest);
  float first = 0;
  std::memcpy(&first, newest->bytes(0).data(), sizeof first);
  CHECK(first == 30.0f);
  CHECK_FALSE(find(a, {0, 2, 10, true}));
  CHECK(find(a, {0, 2, 30, true}));
  CHECK(a.stats().sent == 3);

  // Going back to step 20 forgets what came after it, on both sides.
  a.drop_after(20);
  b.drop_after(20);
  CHECK_FALSE(find(a, {0, 2, 30, true}));
  CHECK_FALSE(find(b, {0, 2, 30, false}));
  CHECK(find(b, {0, 2, 20, false}));
}

TEST_CASE("a listener refuses another run, a stray client, impossible sizes and damaged data, and keeps nothing") {
  trainer_state s1(1, 2);
  detail::peer_replicas b(s1.st, "ours", "127.0.0.1", 1, {});
  const std::uint64_t slice0 = 500 * sizeof(float);  // rank 0 of 2's slice of the moments
  std::vector<std::byte> data(slice0, std::byte{0x5a});
  const std::uint32_t crc = elastic::internal::crc32c(data.data(), data.size());
  const std::uint64_t token = b.token();
  auto whole = [&](const std::string& run, std::uint64_t claimed, std::uint32_t sum, std::uint64_t tok) {
    frame f;
    f.head(run, tok, 0, 2, 10).put(std::uint32_t{1}).put(claimed);
    f.b.insert(f.b.end(), data.begin(), data.end());
    return f.put(sum);
  };

  // Refused: the answer is 1, or a reset when the listener closed before reading it all.
  auto refused = [&](const frame& f) {
    CHECK(send_raw(b.address(), f) != 0);
    CHECK(eventually([&] { return b.stats().refused == 1; }));
    CHECK(b.images().empty());
  };
  SECTION("another run") { refused(whole("theirs", slice0, crc, token)); }
  SECTION("another group of this run id (another job on the host)") { refused(whole("ours", slice0, crc, token + 1)); }
  SECTION("a stray client (no magic)") {
    frame f;
    f.b.assign(64, std::byte{'G'});
    refused(f);
  }
  SECTION("a size the partition does not give that rank (refused before anything is allocated)") {
    frame f;
    f.head("ours", token, 0, 2, 10).put(std::uint32_t{1}).put(std::uint64_t{1} << 40);
    refused(f);
  }
  SECTION("an impossible rank") {
    frame f;
    f.head("ours", token, 5, 2, 10).put(std::uint32_t{1}).put(slice0);
    refused(f);
  }
  SECTION("data damaged on the way") { refused(whole("ours", slice0, crc ^ 1u, token)); }
  SECTION("a sender that dies half way") {
    auto f = whole("ours", slice0, crc, token);
    f.b.resize(f.b.size() / 2);
    CHECK(send_raw(b.address(), f) == -1);
    CHECK(b.images().empty());
  }
  // Whatever came before, the listener still takes a good replica.
  CHECK(send_raw(b.address(), whole("ours", slice0, crc, token)) == 0);
  const auto kept = find(b, {0, 2, 10, false});
  REQUIRE(kept);
  CHECK(std::memcmp(kept->bytes(0).data(), data.data(), data.size()) == 0);
}

TEST_CASE("a successor that is gone costs a failed send, not the training") {
  trainer_state s0(0, 2);
  detail::peer_replicas a(s0.st, "run", "127.0.0.1", 1, {});
  detail::peer_address gone;
  {
    auto [fd, port] = elastic::internal::tcp::listen_on("127.0.0.1");
    gone = {"127.0.0.1", port};
  }  // closed: connections to it are refused
  a.follow(0, 2, {a.address(), gone}, a.token());
  const staged snap(s0.st);
  a.keep(snap.at(10));  // returns at once: the send is the sender thread's
  REQUIRE(eventually([&] { return a.stats().send_failures == 1; }));
  CHECK(a.stats().sent == 0);
  CHECK(find(a, {0, 2, 10, true}));  // its own image stays
}

TEST_CASE("peer replicas refuse nonsense options with a clear error") {
  trainer_state s0(0, 2);
  CHECK_THROWS_AS(detail::peer_replicas(s0.st, "run", "127.0.0.1", 0, {}), elastic::error);
  CHECK_THROWS_AS(detail::peer_replicas(s0.st, "run", "no.such.host.invalid", 1, {}), elastic::error);
}

TEST_CASE("stopping does not wait for a peer that stalls in the middle of a replica") {
  trainer_state s1(1, 2);
  auto b = std::make_unique<detail::peer_replicas>(s1.st, "run", "127.0.0.1", 1, elastic::event_log{});
  const auto deadline = elastic::internal::tcp::clock::now() + 5s;
  auto fd = elastic::internal::tcp::connect_to(b->address().host, b->address().port, deadline);
  const std::uint32_t magic = 0x50524c45;
  elastic::internal::tcp::send_all(fd.get(), &magic, sizeof magic, deadline, "test");  // and then nothing
  std::this_thread::sleep_for(200ms);  // the listener is inside the connection now
  const auto t0 = std::chrono::steady_clock::now();
  b.reset();
  CHECK(std::chrono::steady_clock::now() - t0 < 8s);  // a hang check: not the listener's 10 s deadline
}
