// The gloo communicator with real processes over an shm:// store: allreduce, broadcast and
// barrier across 4 ranks, and a peer SIGKILLed in the middle of an allreduce.
#include <signal.h>

#include <chrono>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <elastic/comm/gloo.hpp>
#include <elastic/rendezvous/shm_store.hpp>

#include "support/catch.hpp"
#include "support/errors.hpp"
#include "support/process.hpp"

using namespace std::chrono_literals;
using elastic::errc;
using elastic::test::error_of;
namespace comm = elastic::comm;
namespace rdzv = elastic::rendezvous;

namespace {

/// A store with a unique name, removed at the end of the test.
struct scratch_store {
  std::string name = elastic::test::unique_name("gloo");
  rdzv::shm_store s{name};
  ~scratch_store() { rdzv::shm_store::remove(name); }
};

/// `size` worker processes, rank i running `mode_of(i)`; killed and reaped on destruction.
template <class Mode>
std::vector<elastic::test::child_process> spawn_ranks(const scratch_store& st, const std::string& prefix, int size,
                                                      std::chrono::milliseconds timeout, Mode mode_of) {
  std::vector<elastic::test::child_process> ranks;
  for (int r = 0; r < size; ++r) {
    ranks.push_back(elastic::test::child_process::spawn({ELASTIC_GLOO_WORKER, st.name, prefix, std::to_string(r),
                                                         std::to_string(size), std::to_string(timeout.count()),
                                                         mode_of(r)}));
  }
  return ranks;
}

/// 4 ranks of `mode_of`, each connected and about to enter its allreduce.
template <class Mode>
std::vector<elastic::test::child_process> entered_ranks(const scratch_store& st, std::chrono::milliseconds timeout,
                                                        Mode mode_of) {
  auto ranks = spawn_ranks(st, "/round/0/gloo", 4, timeout, mode_of);
  for (auto& p : ranks) {
    REQUIRE(p.read_line(20s) == std::optional<std::string>("connected"));
    REQUIRE(p.read_line(10s) == std::optional<std::string>("entering"));
  }
  return ranks;
}

/// The value of `field=` in a worker's line.
std::string field(const std::string& line, const std::string& name) {
  const auto at = line.find(name + "=");
  if (at == std::string::npos) return "";
  const auto from = at + name.size() + 1;
  return line.substr(from, line.find(' ', from) - from);
}

}  // namespace

static_assert(comm::communicator<comm::gloo_communicator>);

TEST_CASE("4 gloo ranks allreduce, broadcast and barrier to identical, correct results", "[gloo]") {
  scratch_store st;
  auto ranks = spawn_ranks(st, "/round/0/gloo", 4, 10s, [](int) { return std::string("collectives"); });
  const std::vector<std::string> checks = {"float_sum", "float_avg", "double_sum", "int32_sum",
                                           "int64_sum", "int64_avg", "broadcast_root2", "barrier"};
  std::map<std::string, std::string> first_hash;
  for (auto& p : ranks) {
    auto line = p.read_line(20s);
    REQUIRE(line);
    REQUIRE(*line == "connected");
  }
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    for (const auto& name : checks) {
      auto line = ranks[r].read_line(20s);
      INFO("rank " << r << " check " << name << " line " << line.value_or("<none>"));
      REQUIRE(line);
      CHECK(line->starts_with(name + " "));
      CHECK(field(*line, "correct") == "1");
      auto [it, fresh] = first_hash.emplace(name, field(*line, "hash"));
      CHECK(it->second == field(*line, "hash"));  // every rank holds the same bytes
    }
    CHECK(ranks[r].read_line(10s) == std::optional<std::string>("done"));
    CHECK(ranks[r].exit_code(10s) == 0);
  }
}

TEST_CASE("4 gloo ranks allreduce bfloat16 and float16 through float and broadcast their bits", "[gloo]") {
  scratch_store st;
  auto ranks = spawn_ranks(st, "/round/0/gloo", 4, 10s, [](int) { return std::string("half"); });
  const std::vector<std::string> checks = {"bf16_sum", "bf16_avg", "fp16_sum", "fp16_avg", "fp16_broadcast_root1"};
  std::map<std::string, std::string> first_hash;
  for (auto& p : ranks) {
    auto line = p.read_line(20s);
    REQUIRE(line);
    REQUIRE(*line == "connected");
  }
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    for (const auto& name : checks) {
      auto line = ranks[r].read_line(20s);
      INFO("rank " << r << " check " << name << " line " << line.value_or("<none>"));
      REQUIRE(line);
      CHECK(line->starts_with(name + " "));
      CHECK(field(*line, "correct") == "1");
      auto [it, fresh] = first_hash.emplace(name, field(*line, "hash"));
      CHECK(it->second == field(*line, "hash"));  // every rank holds the same bits
    }
    CHECK(ranks[r].read_line(10s) == std::optional<std::string>("done"));
    CHECK(ranks[r].exit_code(10s) == 0);
  }
}

TEST_CASE("a peer SIGKILLed during an allreduce makes the survivors fail within the timeout", "[gloo]") {
  scratch_store st;
  constexpr auto timeout = 3s;
  constexpr int doomed = 1;
  auto ranks = entered_ranks(st, timeout, [](int r) { return std::string(r == doomed ? "die" : "survive"); });
  std::this_thread::sleep_for(200ms);  // the survivors are inside the allreduce now
  ranks[doomed].kill(SIGKILL);
  REQUIRE(ranks[doomed].killed_by(SIGKILL, 5s));
  const auto killed_at = std::chrono::steady_clock::now();
  for (int r = 0; r < 4; ++r) {
    if (r == doomed) continue;
    // Each survivor fails either because its connection to a dead peer broke or because its
    // own timeout ran out: never later than the timeout (plus slack for a loaded machine).
    auto line = ranks[r].read_line(timeout + 5s);
    INFO("rank " << r << " line " << line.value_or("<none>"));
    REQUIRE(line);
    CHECK(line->starts_with("error "));
    const auto code = field(*line, "code");
    CHECK((code == "timeout" || code == "peer_lost" || code == "corrupt"));
    CHECK(field(*line, "ok") == "0");
    CHECK(field(*line, "later_fails") == "1");
    CHECK(std::stoi(field(*line, "ms")) < std::chrono::duration_cast<std::chrono::milliseconds>(timeout + 2s).count());
    CHECK(ranks[r].exit_code(10s) == 0);
  }
  CHECK(std::chrono::steady_clock::now() - killed_at < timeout + 5s);
}

TEST_CASE("a peer that hangs during an allreduce makes the survivors time out", "[gloo]") {
  scratch_store st;
  constexpr auto timeout = 1500ms;
  constexpr int hung = 1;
  auto ranks = entered_ranks(st, timeout, [](int r) { return std::string(r == hung ? "die" : "survive"); });
  ranks[hung].kill(SIGSTOP);  // alive, connections open, answering nothing
  int timed_out = 0;
  for (int r = 0; r < 4; ++r) {
    if (r == hung) continue;
    // A survivor waiting on the hung rank times out; one waiting on a survivor that gave up may
    // see that connection close first. Either way none waits past its timeout (plus slack).
    auto line = ranks[r].read_line(timeout + 5s);
    INFO("rank " << r << " line " << line.value_or("<none>"));
    REQUIRE(line);
    CHECK(line->starts_with("error "));
    CHECK(field(*line, "ok") == "0");
    CHECK(field(*line, "later_fails") == "1");
    const int ms = std::stoi(field(*line, "ms"));
    CHECK(ms < std::chrono::duration_cast<std::chrono::milliseconds>(timeout + 2s).count());
    if (field(*line, "code") == "timeout") {
      ++timed_out;
      CHECK(ms >= std::chrono::duration_cast<std::chrono::milliseconds>(timeout).count() * 9 / 10);
    }
  }
  CHECK(timed_out >= 1);
  ranks[hung].kill(SIGKILL);
}

TEST_CASE("a revoke from another thread ends an allreduce waiting for a frozen peer with peer_lost, not at the "
          "timeout", "[gloo]") {
  scratch_store st;
  constexpr auto timeout = 60s;  // what the survivors would otherwise wait
  constexpr int frozen = 1;
  auto ranks = entered_ranks(st, timeout, [](int r) { return std::string(r == frozen ? "die" : "revoke"); });
  ranks[frozen].kill(SIGSTOP);  // alive, connections open, answering nothing
  int named = 0;
  for (int r = 0; r < 4; ++r) {
    if (r == frozen) continue;
    // Bounded well below the timeout: only the revoke can end the wait in time.
    auto line = ranks[r].read_line(20s);
    INFO("rank " << r << " line " << line.value_or("<none>"));
    REQUIRE(line);
    CHECK(line->starts_with("error "));
    // Its own revoke, or a peer's that closed their connection first: the same cause either way.
    CHECK(field(*line, "code") == "peer_lost");
    CHECK(field(*line, "ok") == "0");
    CHECK(field(*line, "later_fails") == "1");
    named += field(*line, "named") == "1" ? 1 : 0;
    REQUIRE(ranks[r].read_line(10s) == std::optional<std::string>("done"));
  }
  CHECK(named >= 1);  // the first to revoke failed by its own revoke, and its error says why
  ranks[frozen].kill(SIGKILL);
}

TEST_CASE("a revoke ends a broadcast whose transfer a peer froze in the middle of, not at the timeout", "[gloo]") {
  // Gloo fails a closed pair's queued buffers but not a send already half written (or a receive
  // begun): a peer that stops reading mid-transfer left the root waiting to its timeout after the
  // revoke. 128 MB outlasts the 5 ms before the receiver stops itself.
  scratch_store st;
  constexpr auto timeout = 60s;  // what the survivor would otherwise wait
  auto ranks = spawn_ranks(st, "/round/0/gloo", 2, timeout,
                           [](int r) { return std::string(r == 1 ? "stall" : "revoke_large"); });
  for (auto& p : ranks) {
    REQUIRE(p.read_line(20s) == std::optional<std::string>("connected"));
    REQUIRE(p.read_line(20s) == std::optional<std::string>("entering"));
  }
  auto line = ranks[0].read_line(20s);  // the revoke comes 1 s in
  INFO("rank 0 line " << line.value_or("<none>"));
  REQUIRE(line);
  CHECK(line->starts_with("error "));
  CHECK(field(*line, "code") == "peer_lost");
  CHECK(field(*line, "named") == "1");
  CHECK(field(*line, "later_fails") == "1");
  CHECK(std::stoi(field(*line, "ms")) < 20'000);
  REQUIRE(ranks[0].read_line(10s) == std::optional<std::string>("done"));
  ranks[1].kill(SIGKILL);
}

TEST_CASE("a single-rank gloo communicator reduces to itself and refuses work after abort", "[gloo]") {
  scratch_store st;
  comm::gloo_communicator c(st.s, "/round/0/gloo", 0, 1, 5s);
  CHECK(c.rank() == 0);
  CHECK(c.size() == 1);
  CHECK(c.ok());
  std::vector<double> d = {1.5, -2.0, 3.25};
  c.allreduce(std::span<double>(d), comm::reduce_op::avg);
  CHECK(d == std::vector<double>{1.5, -2.0, 3.25});
  std::vector<std::int32_t> i = {7, 8};
  c.broadcast(std::span<std::int32_t>(i), 0);
  CHECK(i == std::vector<std::int32_t>{7, 8});
  c.barrier();
  std::vector<comm::bfloat16> h = {comm::bfloat16(1.5f), comm::bfloat16(-3.0f)};
  c.allreduce(std::span<comm::bfloat16>(h), comm::reduce_op::avg);
  CHECK(h[0].bits == comm::bfloat16(1.5f).bits);
  CHECK(h[1].bits == comm::bfloat16(-3.0f).bits);
  CHECK(error_of([&] { c.broadcast(std::span<std::int32_t>(i), 1); }).code() == errc::invalid_argument);
  CHECK(c.ok());  // a bad argument is the caller's mistake; the communicator is still fine

  c.abort();
  CHECK_FALSE(c.ok());
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(error_of([&] { c.allreduce(std::span<double>(d), comm::reduce_op::sum); }).code() == errc::aborted);
  CHECK(error_of([&] { c.barrier(); }).code() == errc::aborted);
  CHECK(std::chrono::steady_clock::now() - t0 < 100ms);
}

TEST_CASE("a gloo communicator whose peers never come fails with a timeout", "[gloo]") {
  scratch_store st;
  const auto t0 = std::chrono::steady_clock::now();
  const auto e = error_of([&] { comm::gloo_communicator c(st.s, "/round/0/gloo", 0, 2, 500ms); });
  CHECK(e.code() == errc::timeout);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
}

TEST_CASE("bad ranks, sizes and timeouts get clear errors", "[gloo]") {
  scratch_store st;
  CHECK(error_of([&] { comm::gloo_communicator c(st.s, "p", 2, 2, 1s); }).code() == errc::invalid_argument);
  CHECK(error_of([&] { comm::gloo_communicator c(st.s, "p", -1, 2, 1s); }).code() == errc::invalid_argument);
  CHECK(error_of([&] { comm::gloo_communicator c(st.s, "p", 0, 0, 1s); }).code() == errc::invalid_argument);
  CHECK(error_of([&] { comm::gloo_communicator c(st.s, "p", 0, 1, 0ms); }).code() == errc::invalid_argument);
}
