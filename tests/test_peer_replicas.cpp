// Peer-memory replicas (comm/detail/peer_replicas.hpp) between two endpoints on loopback: a
// snapshot kept by one arrives whole at its successor, the newest two steps are kept, and what
// a stray, hostile or dying sender writes to a listener is refused and never kept.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <elastic/comm/detail/peer_replicas.hpp>
#include <elastic/internal/crc32c.hpp>
#include <elastic/internal/tcp.hpp>

#include "support/catch.hpp"
#include "support/eventually.hpp"
#include "support/process.hpp"

namespace {

using namespace std::chrono_literals;
using elastic::test::eventually;
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

std::shared_ptr<const detail::memory_image> find(const detail::peer_replicas& r, detail::image_key k) {
  for (const auto& i : r.images())
    if (i->key == k) return i;
  return nullptr;
}

/// Raw bytes for a listener (a stray client's), or the header and body of a replica.
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
  frame& head(const std::string& run, std::int64_t rank, std::int64_t world, std::int64_t step) {
    return text(run).put(rank).put(world).put(step);
  }
};

/// Connects to `to`'s listener; `talk` (which may throw elastic::error) returns what to write
/// last, then the connection is closed for writing; returns the one-byte answer (-1: none).
template <class Talk>
int exchange(const detail::peer_address& to, Talk talk) {
  const auto deadline = elastic::internal::tcp::clock::now() + 5s;
  auto fd = elastic::internal::tcp::connect_to(to.host, to.port, deadline);
  try {
    const frame f = talk(fd.get(), deadline);
    elastic::internal::tcp::send_all(fd.get(), f.b.data(), f.b.size(), deadline, "test");
    ::shutdown(fd.get(), SHUT_WR);
    std::uint8_t a = 0;
    elastic::internal::tcp::recv_all(fd.get(), &a, 1, deadline, "test");
    return a;
  } catch (const elastic::error&) {
    return -1;
  }
}

/// Writes `f` to `to`'s listener, then closes; returns the one-byte answer (-1: none).
int send_raw(const detail::peer_address& to, const frame& f) {
  return exchange(to, [&](int, auto) { return f; });
}

/// Speaks the handshake to `to`'s listener with `key` (without checking the listener's proof,
/// so that the listener's own checks are what the test sees), sends the header `head` and then
/// `body`, then closes; returns the one-byte answer (-1: none).
int send_as_member(const detail::peer_address& to, const detail::wire::group_key& key, const frame& head,
                   const frame& body) {
  namespace wire = detail::wire;
  return exchange(to, [&](int fd, auto deadline) {
    const auto mine = wire::random<wire::nonce>();
    frame hello;
    hello.put(wire::magic).put(wire::version);
    for (auto b : mine) hello.put(b);
    elastic::internal::tcp::send_all(fd, hello.b.data(), hello.b.size(), deadline, "test");
    wire::nonce theirs{};
    wire::mac proof{};
    elastic::internal::tcp::recv_all(fd, theirs.data(), theirs.size(), deadline, "test");
    elastic::internal::tcp::recv_all(fd, proof.data(), proof.size(), deadline, "test");
    frame rest = head;
    for (auto b : wire::client_proof(key, mine, theirs, head.b)) rest.put(b);
    rest.b.insert(rest.b.end(), body.b.begin(), body.b.end());
    return rest;
  });
}

}  // namespace

TEST_CASE("a kept snapshot reaches the successor whole, and the newest two steps are kept on each side") {
  trainer_state s0(0, 2), s1(1, 2);
  detail::peer_replicas a(s0.st, "run", "127.0.0.1", 1, {}), b(s1.st, "run", "127.0.0.1", 1, {});
  // One group: both take rank 0's key, as a resync has them do.
  a.follow(0, 2, {a.address(), b.address()}, a.key());
  b.follow(1, 2, {a.address(), b.address()}, a.key());
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
  // The receiver counts a replica before it answers; the sender counts it once the answer is read.
  CHECK(eventually([&] { return a.stats().sent == 3; }));

  // Going back to step 20 forgets what came after it, on both sides.
  a.drop_after(20);
  b.drop_after(20);
  CHECK_FALSE(find(a, {0, 2, 30, true}));
  CHECK_FALSE(find(b, {0, 2, 30, false}));
  CHECK(find(b, {0, 2, 20, false}));
}

TEST_CASE("a listener refuses another run, another group, a stray client, impossible sizes and damaged data, and "
          "keeps nothing") {
  trainer_state s1(1, 2);
  detail::peer_replicas b(s1.st, "ours", "127.0.0.1", 1, {});
  const std::uint64_t slice0 = 500 * sizeof(float);  // rank 0 of 2's slice of the moments
  std::vector<std::byte> data(slice0, std::byte{0x5a});
  const std::uint32_t crc = elastic::internal::crc32c(data.data(), data.size());
  const auto key = b.key();
  auto head = [&](const std::string& run, std::int64_t rank, std::uint64_t claimed) {
    frame f;
    f.head(run, rank, 2, 10).put(std::uint32_t{1}).put(claimed);
    return f;
  };
  auto body = [&](std::uint32_t sum) {
    frame f;
    f.b = data;
    return f.put(sum);
  };

  // Refused: the answer is 1, or a reset when the listener closed before reading it all.
  auto refused = [&](int answer) {
    CHECK(answer != 0);
    CHECK(eventually([&] { return b.stats().refused == 1; }));
    CHECK(b.images().empty());
  };
  SECTION("another run") { refused(send_as_member(b.address(), key, head("theirs", 0, slice0), body(crc))); }
  SECTION("another group of this run id (another job on the host): its key differs") {
    auto other = key;
    other[0] ^= 1;
    refused(send_as_member(b.address(), other, head("ours", 0, slice0), body(crc)));
  }
  SECTION("a stray client (no magic)") {
    frame f;
    f.b.assign(64, std::byte{'G'});
    refused(send_raw(b.address(), f));
  }
  SECTION("a size the partition does not give that rank (refused before anything is allocated)") {
    refused(send_as_member(b.address(), key, head("ours", 0, std::uint64_t{1} << 40), {}));
  }
  SECTION("an impossible rank") { refused(send_as_member(b.address(), key, head("ours", 5, slice0), {})); }
  SECTION("data damaged on the way") { refused(send_as_member(b.address(), key, head("ours", 0, slice0), body(crc ^ 1u))); }
  SECTION("a sender that dies half way") {
    auto f = body(crc);
    f.b.resize(f.b.size() / 2);
    CHECK(send_as_member(b.address(), key, head("ours", 0, slice0), f) == -1);
    CHECK(b.images().empty());
  }
  // Whatever came before, the listener still takes a good replica.
  CHECK(send_as_member(b.address(), key, head("ours", 0, slice0), body(crc)) == 0);
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
  a.follow(0, 2, {a.address(), gone}, a.key());
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

namespace {

/// The bytes of `r`'s group secret, as they would look on the wire.
std::vector<std::byte> secret_of(const detail::peer_replicas& r) {
  const auto k = r.key();
  const auto b = std::as_bytes(std::span(k));
  return {b.begin(), b.end()};
}

bool contains(const std::vector<std::byte>& hay, std::span<const std::byte> needle) {
  return !needle.empty() && std::search(hay.begin(), hay.end(), needle.begin(), needle.end()) != hay.end();
}

/// Reads what `fd` sends until it closes or `limit` passes; writes `answer` once `after` bytes came.
std::vector<std::byte> drain(int fd, std::chrono::milliseconds limit, std::size_t after = 0,
                             std::vector<std::byte> answer = {}) {
  std::vector<std::byte> got;
  const auto until = std::chrono::steady_clock::now() + limit;
  bool answered = answer.empty();
  while (std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    std::byte buf[65536];
    const ssize_t r = ::recv(fd, buf, sizeof buf, 0);
    if (r <= 0) break;
    got.insert(got.end(), buf, buf + r);
    if (!answered && got.size() >= after) {
      (void)::send(fd, answer.data(), answer.size(), MSG_NOSIGNAL);
      answered = true;
    }
  }
  return got;
}

/// A TCP relay on loopback in front of `to` for one connection, recording what the client sent.
class recording_relay {
 public:
  explicit recording_relay(detail::peer_address to) : to_(std::move(to)) {
    auto [fd, port] = elastic::internal::tcp::listen_on("127.0.0.1");
    listener_ = std::move(fd);
    address_ = {"127.0.0.1", port};
    thread_ = std::jthread([this] { relay(); });
  }
  const detail::peer_address& address() const { return address_; }
  /// What the client sent, once the connection is over on both sides.
  const std::vector<std::byte>& sent() {
    thread_.join();
    return from_client_;
  }

 private:
  void relay() {
    auto client = elastic::internal::tcp::accept_for(listener_.get(), 10000ms);
    if (!client) return;
    auto server = elastic::internal::tcp::connect_to(to_.host, to_.port, elastic::internal::tcp::clock::now() + 5s);
    const auto until = std::chrono::steady_clock::now() + 20s;
    bool open[2] = {true, true};
    while ((open[0] || open[1]) && std::chrono::steady_clock::now() < until) {
      pollfd p[2] = {{client.get(), POLLIN, 0}, {server.get(), POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if (!open[i] || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        std::byte buf[65536];
        const int from = i == 0 ? client.get() : server.get(), to = i == 0 ? server.get() : client.get();
        const ssize_t r = ::recv(from, buf, sizeof buf, 0);
        if (r <= 0) {
          open[i] = false;
          ::shutdown(to, SHUT_WR);
          continue;
        }
        if (i == 0) from_client_.insert(from_client_.end(), buf, buf + r);
        elastic::internal::tcp::send_all(to, buf, static_cast<std::size_t>(r),
                                         elastic::internal::tcp::clock::now() + 5s, "relay");
      }
    }
  }

  detail::peer_address to_, address_;
  elastic::internal::unique_fd listener_;
  std::vector<std::byte> from_client_;
  std::jthread thread_;
};

/// The lines of the events file `path` naming `event`.
std::size_t count_events(const std::string& path, const std::string& event) {
  std::ifstream in(path);
  std::size_t n = 0;
  for (std::string line; std::getline(in, line);) n += line.find("\"event\":\"" + event + "\"") != std::string::npos;
  return n;
}

}  // namespace

TEST_CASE("a process listening at a peer's recorded address gets neither the group's secret nor the slices") {
  trainer_state s0(0, 2);
  detail::peer_replicas a(s0.st, "run", "127.0.0.1", 1, {});
  // Whoever holds the recorded address now (another user's process, or a port reused after the
  // peer died) reads all the sender writes, and answers what a listener would.
  auto [fake, port] = elastic::internal::tcp::listen_on("127.0.0.1");
  a.follow(0, 2, {a.address(), {"127.0.0.1", port}}, a.key());
  const staged snap(s0.st);
  a.keep(snap.at(10));
  auto conn = elastic::internal::tcp::accept_for(fake.get(), 10000ms);
  REQUIRE(conn);
  const auto got = drain(conn.get(), 3s, 8, std::vector<std::byte>(64, std::byte{0}));
  CHECK_FALSE(got.empty());
  CHECK_FALSE(contains(got, secret_of(a)));
  const auto slice = std::as_bytes(std::span(s0.m)).first(64);
  CHECK_FALSE(contains(got, slice));
  // The sender saw a listener that could not prove it belongs to the group: a failed send.
  CHECK(eventually([&] { return a.stats().send_failures == 1; }, 20s));
  CHECK(a.stats().sent == 0);
}

TEST_CASE("a client replaying what a group member sent on the wire is refused and nothing is kept") {
  trainer_state s0(0, 2), s1(1, 2);
  detail::peer_replicas a(s0.st, "run", "127.0.0.1", 1, {}), b(s1.st, "run", "127.0.0.1", 1, {});
  recording_relay relay(b.address());
  // a reaches b through the relay, which records all that a sent.
  a.follow(0, 2, {a.address(), relay.address()}, a.key());
  b.follow(1, 2, {a.address(), b.address()}, a.key());
  const staged snap(s0.st);
  a.keep(snap.at(10));
  REQUIRE(eventually([&] { return b.stats().received == 1; }));
  const auto& recorded = relay.sent();
  REQUIRE_FALSE(recorded.empty());
  b.drop_after(0);
  REQUIRE(b.images().empty());
  // A client without the secret, holding every byte a member sent: its replay is refused.
  frame f;
  f.b = recorded;
  CHECK(send_raw(b.address(), f) != 0);
  CHECK(eventually([&] { return b.stats().refused >= 1; }));
  CHECK(b.stats().received == 1);
  CHECK(b.images().empty());
}

TEST_CASE("a flood of refused connections is counted, and logged in a bounded number of events") {
  elastic::test::temp_dir dir;
  const std::string events = dir.file("events.jsonl");
  trainer_state s1(1, 2);
  auto b = std::make_unique<detail::peer_replicas>(s1.st, "run", "127.0.0.1", 1, elastic::event_log::to_file(events));
  constexpr int flood = 200;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < flood; ++i) {
    frame f;
    f.b.assign(64, std::byte{'G'});
    (void)send_raw(b->address(), f);
  }
  REQUIRE(eventually([&] { return b->stats().refused == flood; }, 30s));
  // One event per interval at most, however many were refused in it (the count says how many);
  // a slow machine may spread the flood over more than one interval.
  const auto intervals = (std::chrono::steady_clock::now() - t0) / detail::peer_replicas::refusal_interval;
  const auto n = count_events(events, "replica_refused");
  INFO(n << " replica_refused events for " << flood << " refusals in " << intervals + 1 << " interval(s)");
  CHECK(n <= static_cast<std::size_t>(intervals) + 1);
  CHECK(elastic::test::events_named(events, "replica_refused").at(0).find("\"peer\":\"127.0.0.1:") != std::string::npos);
  // Stopping logs what was left: every refusal is in some event's count.
  b.reset();
  std::ifstream in(events);
  std::int64_t total = 0;
  for (std::string line; std::getline(in, line);) {
    const auto at = line.find("\"count\":");
    if (line.find("\"event\":\"replica_refused\"") != std::string::npos && at != std::string::npos) {
      total += std::stoll(line.substr(at + 8));
    }
  }
  CHECK(total == flood);
}

TEST_CASE("idle connections held open on a listener do not keep a replica out of it") {
  trainer_state s0(0, 2), s1(1, 2);
  detail::peer_replicas a(s0.st, "run", "127.0.0.1", 1, {}), b(s1.st, "run", "127.0.0.1", 1, {});
  a.follow(0, 2, {a.address(), b.address()}, a.key());
  b.follow(1, 2, {a.address(), b.address()}, a.key());
  // Connections that say nothing, held for the whole test (a port scanner, a stuck client):
  // more than the listener serves at once, so the oldest make room for the sender.
  std::vector<elastic::internal::unique_fd> idle;
  for (std::size_t i = 0; i < detail::peer_replicas::max_connections + 16; ++i) {
    idle.push_back(elastic::internal::tcp::connect_to(b.address().host, b.address().port,
                                                      elastic::internal::tcp::clock::now() + 5s));
  }
  const staged snap(s0.st);
  a.keep(snap.at(10));
  // Bounded wait, not a timing: served one at a time, each idle connection held a listener 10 s.
  CHECK(eventually([&] { return b.stats().received == 1; }, 30s));
  CHECK(find(b, {0, 2, 10, false}));
}
