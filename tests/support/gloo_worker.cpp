// A rank of a gloo communicator in its own process, for tests/test_gloo.cpp.
//
//   elastic_gloo_worker STORE PREFIX RANK SIZE TIMEOUT_MS MODE
//
// It opens shm://STORE, connects a gloo_communicator under PREFIX, prints "connected", then:
//   collectives  runs allreduce (sum, avg) on float/double/int32/int64 buffers, a broadcast from
//                root 2 and a barrier, printing one line per check:
//                "<name> correct=<0|1> hash=<fnv-1a of the result bytes>"
//   half         runs allreduce (sum, avg) on bfloat16/float16 buffers and a float16 broadcast
//                from root 1, one line per check in the same form
//   die          prints "entering", then sleeps without joining the collective (the test kills it)
//   stall        prints "entering", receives a broadcast of 128 MB from rank 0 and stops itself
//                (SIGSTOP) 5 ms into it: frozen in the middle of the transfer, its sockets open
//   others       prints "entering", runs one allreduce and prints
//                "error code=<errc> ok=<0|1> ms=<elapsed> later_fails=<0|1> named=<0|1>" or
//                "finished" if it completed; in mode "revoke" another thread revokes the
//                communicator 300 ms into the allreduce, naming member "w9" (named=1: the error
//                says so); "revoke_large" is the same with a broadcast of 128 MB from this rank
//                (rank 0), revoked 1 s into it
// and ends with "done". Exit code 0 unless setup failed.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <elastic/comm/gloo.hpp>
#include <elastic/rendezvous/shm_store.hpp>

namespace {

using namespace std::chrono_literals;
namespace comm = elastic::comm;

template <class T>
std::uint64_t fnv1a(std::span<const T> buf) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(buf.data());
  for (std::size_t i = 0; i < buf.size_bytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

void say(const std::string& line) { std::cout << line << std::endl; }

// Rank r holds base(r) + step(i); values stay exact in every type so ranks can compare bytes.
template <class T>
void check_allreduce(comm::gloo_communicator& c, const char* name, comm::reduce_op op, T base, std::size_t n) {
  std::vector<T> buf(n);
  for (std::size_t i = 0; i < n; ++i) buf[i] = static_cast<T>(base * c.rank() + static_cast<T>(i % 1000));
  c.allreduce(std::span<T>(buf), op);
  const int s = c.size();
  bool correct = true;
  for (std::size_t i = 0; i < n; ++i) {
    T sum = static_cast<T>(base * (s * (s - 1) / 2) + static_cast<T>(s) * static_cast<T>(i % 1000));
    T want = op == comm::reduce_op::sum ? sum : static_cast<T>(sum / static_cast<T>(s));
    if (buf[i] != want) {
      correct = false;
      std::cerr << name << ": element " << i << " is " << buf[i] << ", want " << want << "\n";
      break;
    }
  }
  say(std::string(name) + " correct=" + (correct ? "1" : "0") +
      " hash=" + std::to_string(fnv1a(std::span<const T>(buf))));
}

// 16-bit floats: rank r holds small integers (exact in both types), the sum is checked exactly;
// the average is checked against the float average rounded once, which is what gloo promises.
template <class H>
void check_half_allreduce(comm::gloo_communicator& c, const char* name, comm::reduce_op op, std::size_t n) {
  std::vector<H> buf(n);
  auto value = [](int rank, std::size_t i) { return static_cast<float>(rank + 1) * static_cast<float>(i % 13); };
  for (std::size_t i = 0; i < n; ++i) buf[i] = H(value(c.rank(), i));
  c.allreduce(std::span<H>(buf), op);
  bool correct = true;
  for (std::size_t i = 0; i < n; ++i) {
    float sum = 0;
    for (int r = 0; r < c.size(); ++r) sum += value(r, i);
    const float want_f = op == comm::reduce_op::sum ? sum : sum / static_cast<float>(c.size());
    const H want(want_f);
    if (buf[i].bits != want.bits) {
      correct = false;
      std::cerr << name << ": element " << i << " has bits " << buf[i].bits << ", want " << want.bits << "\n";
      break;
    }
  }
  say(std::string(name) + " correct=" + (correct ? "1" : "0") +
      " hash=" + std::to_string(fnv1a(std::span<const H>(buf))));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::cerr << "usage: elastic_gloo_worker STORE PREFIX RANK SIZE TIMEOUT_MS MODE\n";
    return 2;
  }
  const std::string store_name = argv[1], prefix = argv[2], mode = argv[6];
  const int rank = std::atoi(argv[3]), size = std::atoi(argv[4]);
  const std::chrono::milliseconds timeout(std::atoll(argv[5]));
  try {
    elastic::rendezvous::shm_store store(store_name);
    comm::gloo_communicator c(store, prefix, rank, size, timeout);
    say("connected");
    if (mode == "collectives") {
      constexpr std::size_t n = 100003;  // not a multiple of the ring's chunk count
      check_allreduce<float>(c, "float_sum", comm::reduce_op::sum, 1.0f, n);
      check_allreduce<float>(c, "float_avg", comm::reduce_op::avg, 1.0f, n);
      check_allreduce<double>(c, "double_sum", comm::reduce_op::sum, 0.25, n);
      check_allreduce<std::int32_t>(c, "int32_sum", comm::reduce_op::sum, 1000, n);
      check_allreduce<std::int64_t>(c, "int64_sum", comm::reduce_op::sum, 1'000'000'000'000LL, n);
      check_allreduce<std::int64_t>(c, "int64_avg", comm::reduce_op::avg, 1'000'000'000'000LL, n);

      std::vector<float> b(n, -1.0f);
      if (rank == 2)
        for (std::size_t i = 0; i < n; ++i) b[i] = 42.0f + static_cast<float>(i % 777);
      c.broadcast(std::span<float>(b), 2);
      bool correct = true;
      for (std::size_t i = 0; i < n; ++i) correct = correct && b[i] == 42.0f + static_cast<float>(i % 777);
      say(std::string("broadcast_root2 correct=") + (correct ? "1" : "0") +
          " hash=" + std::to_string(fnv1a(std::span<const float>(b))));

      // A rank leaves the barrier only after every rank has entered it: each marks its entry in
      // the store first (the later ranks after a delay), then checks every mark is there.
      std::this_thread::sleep_for(std::chrono::milliseconds(50 * rank));
      store.set(prefix + "-barrier/" + std::to_string(rank), "in");
      c.barrier();
      int seen = 0;
      for (int r = 0; r < size; ++r) seen += store.get(prefix + "-barrier/" + std::to_string(r)).has_value() ? 1 : 0;
      say(std::string("barrier correct=") + (seen == size ? "1" : "0") + " hash=0");
    } else if (mode == "half") {
      constexpr std::size_t n = 50021;
      check_half_allreduce<comm::bfloat16>(c, "bf16_sum", comm::reduce_op::sum, n);
      check_half_allreduce<comm::bfloat16>(c, "bf16_avg", comm::reduce_op::avg, n);
      check_half_allreduce<comm::float16>(c, "fp16_sum", comm::reduce_op::sum, n);
      check_half_allreduce<comm::float16>(c, "fp16_avg", comm::reduce_op::avg, n);

      std::vector<comm::float16> b(n, comm::float16(-1.0f));
      auto pattern = [](std::size_t i) { return static_cast<std::uint16_t>((i * 7919) & 0xffff); };
      if (rank == 1)
        for (std::size_t i = 0; i < n; ++i) b[i] = comm::float16::from_bits(pattern(i));  // NaNs too
      c.broadcast(std::span<comm::float16>(b), 1);
      bool correct = true;
      for (std::size_t i = 0; i < n; ++i) correct = correct && b[i].bits == pattern(i);
      say(std::string("fp16_broadcast_root1 correct=") + (correct ? "1" : "0") +
          " hash=" + std::to_string(fnv1a(std::span<const comm::float16>(b))));
    } else if (mode == "die") {
      say("entering");
      for (;;) std::this_thread::sleep_for(1s);
    } else if (mode == "stall") {
      std::vector<float> buf(std::size_t{32} << 20, 1.0f);
      say("entering");
      std::jthread stopper([] {
        std::this_thread::sleep_for(5ms);  // its receive posted, the bytes not yet all here
        ::kill(::getpid(), SIGSTOP);
      });
      c.broadcast(std::span<float>(buf), 0);  // never ends: the test kills it
    } else {
      const bool large = mode == "revoke_large";
      std::vector<float> buf(large ? std::size_t{32} << 20 : std::size_t{1} << 16, 1.0f);
      say("entering");
      const auto t0 = std::chrono::steady_clock::now();
      std::jthread revoker;
      if (mode == "revoke" || large) {  // as an elastic group's watcher does when a member's heartbeat lapses
        revoker = std::jthread([&c, large] {
          std::this_thread::sleep_for(large ? 1000ms : 300ms);
          c.revoke("member w9 of round 1 departed");
        });
      }
      try {
        if (large) {
          c.broadcast(std::span<float>(buf), 0);
        } else {
          c.allreduce(std::span<float>(buf), comm::reduce_op::sum);
        }
        say("finished");
      } catch (const elastic::error& e) {
        const auto ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
        std::cerr << "rank " << rank << ": " << e.what() << "\n";
        // A later call must fail at once, not wait again.
        bool later_fails = false;
        try {
          c.barrier();
        } catch (const elastic::error&) {
          later_fails = true;
        }
        say("error code=" + std::string(elastic::to_string(e.code())) + " ok=" + (c.ok() ? "1" : "0") +
            " ms=" + std::to_string(ms) + " later_fails=" + (later_fails ? "1" : "0") +
            " named=" + (std::string(e.what()).find("member w9 of round 1 departed") != std::string::npos ? "1" : "0"));
      }
    }
    say("done");
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << ": " << e.what() << "\n";
    say(std::string("setup_error ") + e.what());
    return 1;
  }
}
