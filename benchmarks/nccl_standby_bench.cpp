// Standby communicators on one GPU (issue 32, item 3): a communicator for each likely next world,
// built in the background by an independent init, so that a death costs a revoke and a switch
// instead of a fresh init. Four ranks (processes of this program, each with its own NCCL_HOSTID,
// so that they share GPU 0 and talk NET/Socket over loopback) measure:
//
//   fresh init        a 3-rank init from a fresh id exchanged through the store, and its first
//                     step: what the reinit path pays after a death (median over --init-reps)
//   step times        a 16 MiB float allreduce per step (--size-kib) on the 4-rank communicator,
//                     synchronised each step: idle (no standby), while the standbys build in a
//                     background thread, and once they are built (they then sit idle)
//   standbys          per rank one per 3-rank world it belongs to (3), each an independent init
//                     from an id the world's lowest member publishes, then one warm-up allreduce
//                     of the step's size (NCCL connects lazily, at a communicator's first
//                     collective: an unwarmed standby would pay that in the switch)
//   memory            cudaMemGetInfo on the shared GPU before and after all 12 rank-standbys
//                     (4 worlds x 3 members), divided by 12; ncclCommMemStats where the libnccl
//                     has it (2.29.7+) and the wrapper can reach the handle (it cannot: reported)
//   switch            the driver SIGKILLs --victim mid-loop, reaps it and sets the store key
//                     "dead". Each survivor's watcher thread, woken by that key, takes the time
//                     (it has now learnt who died: detection is not measured), revokes the 4-rank
//                     communicator (no wait); the training thread picks the standby without the
//                     dead rank and runs a step on it. Switch = learnt -> that step completed.
//                     The old communicator is aborted on a thread of its own, started at the
//                     switch (abort=concurrent) or after the first step (abort=deferred): each is
//                     one episode (a fresh set of 4 ranks). Then the same survivors make a fresh
//                     3-rank communicator + first step, for comparison on the same job.
//
// Output: a markdown table, a conclusion line, and one JSON line starting {"bench":"nccl_standby"
// (the table's figures, and under "ranks" every survivor's own). Exit 1 when a rank failed or
// any row has no value (the suite's model run checks that); 77 without a CUDA device.
//
//   nccl_standby_bench [--size-kib=16384] [--steps=30] [--init-reps=3] [--kill-after-ms=300]
//                      [--victim=3] [--timeout-s=60] [--abort=concurrent,deferred]
//                      [--budget-mib=1024]
//
// Built against real NCCL (target nccl_standby_bench) and against the NCCL model (target
// nccl_standby_bench_model, ELASTIC_NCCL_MODEL=1: no memory figures, the table says "model").
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <elastic/comm/nccl.hpp>
#include <elastic/internal/base64.hpp>
#include <elastic/internal/cuda.hpp>
#include <elastic/internal/env.hpp>
#include <elastic/internal/json.hpp>
#include <elastic/rendezvous/shm_store.hpp>

#include "bench_common.hpp"
#include "support/process.hpp"

namespace {

using namespace std::chrono_literals;
namespace comm = elastic::comm;
namespace cuda = elastic::internal::cuda;
using elastic::bench::clock_type;
using elastic::bench::median;
using elastic::internal::json;
using elastic::rendezvous::shm_store;

constexpr int world = 4;
constexpr int device = 0;

#ifdef ELASTIC_NCCL_MODEL
constexpr bool on_model = true;
#else
constexpr bool on_model = false;
#endif

struct options {
  long size_kib = 16 * 1024;
  int steps = 30;
  int init_reps = 3;
  int kill_after_ms = 300;
  int victim = world - 1;
  int timeout_s = 60;
  long budget_mib = 1024;
  std::vector<std::string> aborts{"concurrent", "deferred"};
  // Rank mode (set by the driver only).
  int rank = -1;
  std::string store;
  std::string abort = "concurrent";
  bool full = true;
  pid_t parent = 0;
};

double ms_since(clock_type::time_point t0) { return elastic::bench::since(t0) * 1e3; }

std::vector<std::string> split(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    const auto comma = s.find(',');
    out.emplace_back(s.substr(0, comma));
    s = comma == std::string_view::npos ? std::string_view() : s.substr(comma + 1);
  }
  return out;
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg(argv[i]);
    const auto eq = arg.find('=');
    const std::string_view key = arg.substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? std::string_view() : arg.substr(eq + 1);
    auto number = [&](long lo, long hi) {
      const auto n = elastic::internal::parse_integer(value);
      if (!n || *n < lo || *n > hi) {
        throw std::runtime_error(fmt::format("{} wants a number in {}..{}, not '{}'", key, lo, hi, value));
      }
      return static_cast<long>(*n);
    };
    if (key == "--size-kib") o.size_kib = number(1, 1L << 22);
    else if (key == "--steps") o.steps = static_cast<int>(number(1, 100000));
    else if (key == "--init-reps") o.init_reps = static_cast<int>(number(1, 1000));
    else if (key == "--kill-after-ms") o.kill_after_ms = static_cast<int>(number(0, 600000));
    else if (key == "--victim") o.victim = static_cast<int>(number(0, world - 1));
    else if (key == "--timeout-s") o.timeout_s = static_cast<int>(number(1, 3600));
    else if (key == "--budget-mib") o.budget_mib = number(1, 1L << 30);
    else if (key == "--abort") {
      o.aborts = split(value);
      for (const auto& a : o.aborts) {
        if (a != "concurrent" && a != "deferred") {
          throw std::runtime_error(fmt::format("--abort takes concurrent and/or deferred, not '{}'", a));
        }
      }
      if (o.aborts.empty()) throw std::runtime_error("--abort needs at least one of concurrent, deferred");
    } else if (key == "--rank") o.rank = static_cast<int>(number(0, world - 1));
    else if (key == "--store") o.store = value;
    else if (key == "--abort-mode") o.abort = value;
    else if (key == "--full") o.full = number(0, 1) == 1;
    else if (key == "--parent") o.parent = static_cast<pid_t>(number(1, 1L << 30));
    else throw std::runtime_error(fmt::format("unknown option '{}' (see the comment at the top of the source)", arg));
  }
  return o;
}

// ---------------------------------------------------------------------------------------------
// A rank.

// Free device memory on the shared GPU; nothing on the model (its device memory is host memory).
std::optional<double> free_mib() {
#ifdef ELASTIC_NCCL_MODEL
  return std::nullopt;
#else
  std::size_t free = 0;
  std::size_t total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) return std::nullopt;
  return static_cast<double>(free) / (1024.0 * 1024.0);
#endif
}

class rank_process {
 public:
  explicit rank_process(const options& o)
      : o_(o), store_(o.store), timeout_(std::chrono::seconds(o.timeout_s)),
        count_(static_cast<std::size_t>(o.size_kib) * 1024 / sizeof(float)) {}

  int run() {
    cuda::device_scope on(device);
    grad_ = cuda::device_bytes(count_ * sizeof(float));
    scratch_ = cuda::device_bytes(count_ * sizeof(float));
    if (cudaMemset(grad_.get(), 0, count_ * sizeof(float)) != cudaSuccess ||
        cudaMemset(scratch_.get(), 0, count_ * sizeof(float)) != cudaSuccess) {
      throw std::runtime_error("cudaMemset of the step buffers failed");
    }
    main_ = std::make_unique<comm::nccl_communicator>(shared_id("main", o_.rank == 0), o_.rank, world, device, timeout_);
    for (int i = 0; i < 3; ++i) step(*main_);  // warm: NCCL connects at the first collective
    out_["rank"] = o_.rank;
    out_["abort_mode"] = o_.abort;
    if (o_.full) {
      fresh_inits();
      steps_and_standbys();
    } else {
      barrier("build", all());
      std::jthread builder([this] { build_standbys(); });
    }
    if (!builder_error_.empty()) throw std::runtime_error(builder_error_);
    kill_and_switch();
    std::printf("%s\n", json(json::object_t{{"standby_rank", std::move(out_)}}).dump().c_str());
    std::fflush(stdout);
    return 0;
  }

 private:
  static std::vector<int> all() { return {0, 1, 2, 3}; }
  static std::vector<int> without(int dead) {
    std::vector<int> m;
    for (int r = 0; r < world; ++r) {
      if (r != dead) m.push_back(r);
    }
    return m;
  }
  static int index_in(const std::vector<int>& members, int rank) {
    return static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
  }

  // Every member sets its key, then waits for the others' (the shm store wakes waiters at once).
  void barrier(const std::string& name, const std::vector<int>& members) {
    store_.set(fmt::format("barrier/{}/{}", name, o_.rank), "1");
    std::vector<std::string> keys;
    for (int r : members) keys.push_back(fmt::format("barrier/{}/{}", name, r));
    store_.wait(keys, timeout_);
  }

  // An id the maker publishes (base64: the store's values are text to its listing) and the
  // others read.
  std::string shared_id(const std::string& name, bool maker) {
    const std::string key = "id/" + name;
    if (maker) {
      std::string id = comm::nccl_unique_id();
      store_.set(key, elastic::internal::base64_encode(id));
      return id;
    }
    auto id = elastic::internal::base64_decode(store_.get(key, timeout_));
    if (!id) throw std::runtime_error("the id under " + key + " is not base64");
    return *id;
  }

  double step(comm::nccl_communicator& c) {
    const auto t0 = clock_type::now();
    c.allreduce(std::span<float>(static_cast<float*>(grad_.get()), count_), comm::reduce_op::sum);
    return ms_since(t0);
  }

  // (1) What the reinit path pays: ranks 0..2 make a 3-rank communicator from a fresh id, then
  // its first step; and how long aborting a healthy one takes.
  void fresh_inits() {
    std::vector<double> init_ms, first_ms, abort_ms;
    for (int rep = 0; rep < o_.init_reps; ++rep) {
      barrier(fmt::format("fresh{}", rep), all());
      if (o_.rank == world - 1) continue;
      const auto t0 = clock_type::now();
      comm::nccl_communicator c(shared_id(fmt::format("fresh{}", rep), o_.rank == 0), o_.rank, world - 1, device,
                                timeout_);
      init_ms.push_back(ms_since(t0));
      step(c);
      first_ms.push_back(ms_since(t0));
      // A rank whose step is done may still owe its peers bytes (NCCL's proxy sends them after
      // the kernel ends): aborting before they all finished cut their sockets (seen on the H200).
      barrier(fmt::format("fresh{}-done", rep), without(world - 1));
      const auto t1 = clock_type::now();
      c.abort();
      abort_ms.push_back(ms_since(t1));
    }
    if (o_.rank != world - 1) {
      out_["fresh_init_ms"] = median(init_ms);
      out_["fresh_init_first_step_ms"] = median(first_ms);
      out_["abort_healthy_ms"] = median(abort_ms);
    }
  }

  // (2), (3): step times idle, while the standbys build, once built; memory before and after.
  void steps_and_standbys() {
    barrier("idle", all());
    std::vector<double> idle;
    for (int i = 0; i < o_.steps; ++i) idle.push_back(step(*main_));
    barrier("mem0", all());
    const auto free0 = free_mib();
    barrier("build", all());
    std::vector<double> building, built;
    {
      std::jthread builder([this] { build_standbys(); });
      // Every rank must run the same number of steps: rank 0 fixes the last one, a margin past
      // the step where it saw every rank's standbys built (ranks are within a step of each other,
      // the allreduce holds them together); the others read it before each step.
      // Rank 0 also gives up waiting after the timeout (a builder that failed never counts).
      const int margin = std::max(10, o_.steps);
      const auto give_up = clock_type::now() + timeout_ + 5s;
      long last = -1;
      for (long i = 0; last < 0 || i <= last; ++i) {
        const bool all_built = store_.get("built").value_or("0") == std::to_string(world);
        if (last < 0) {
          if (o_.rank == 0 && (all_built || clock_type::now() > give_up)) {
            last = i + margin;
            store_.set("last_build_step", std::to_string(last));
          } else if (auto v = store_.get("last_build_step")) {
            last = static_cast<long>(elastic::internal::parse_integer(*v).value_or(0));
          }
        }
        (all_built ? built : building).push_back(step(*main_));
      }
    }  // joins the builder
    barrier("mem1", all());
    const auto free1 = free_mib();
    out_["step_idle_ms"] = median(idle);
    out_["step_building_ms"] = building.empty() ? json() : json(median(building));
    out_["step_built_ms"] = built.empty() ? json() : json(median(built));
    out_["steps_building"] = static_cast<std::int64_t>(building.size());
    out_["build_ms"] = build_ms_;
    if (free0 && free1) {
      out_["free_before_mib"] = *free0;
      out_["free_after_mib"] = *free1;
    }
  }

  // The standbys of this rank, one per 3-rank world it belongs to, built one after another in the
  // same order on every rank (by the dead rank they stand in for), so that no two wait on each
  // other. Each is warmed by one allreduce of the step's size, on a buffer of its own.
  void build_standbys() {
    try {
      cuda::device_scope on(device);
      const auto t0 = clock_type::now();
      for (int dead = 0; dead < world; ++dead) {
        if (dead == o_.rank) continue;
        const auto members = without(dead);
        const int me = index_in(members, o_.rank);
        auto c = std::make_unique<comm::nccl_communicator>(shared_id(fmt::format("standby{}", dead), me == 0), me,
                                                           world - 1, device, timeout_);
        c->allreduce(std::span<float>(static_cast<float*>(scratch_.get()), count_), comm::reduce_op::sum);
        standby_[static_cast<std::size_t>(dead)] = std::move(c);
      }
      build_ms_ = ms_since(t0);
      store_.add("built", 1);
    } catch (const std::exception& e) {
      builder_error_ = fmt::format("rank {}: building the standbys failed: {}", o_.rank, e.what());
    }
  }

  // (4) The death and the switch.
  void kill_and_switch() {
    barrier("kill", all());
    std::atomic<int> dead{-1};
    clock_type::time_point learnt;
    double revoke_ms = 0;
    std::jthread watcher([&](std::stop_token stop) {
      elastic::internal::cuda::adopt_device(device);
      const std::string key = "dead";
      while (!stop.stop_requested()) {
        try {
          store_.wait(std::span<const std::string>(&key, 1), 100ms);
        } catch (const elastic::error&) {
          continue;  // not yet
        }
        learnt = clock_type::now();
        const auto v = store_.get(key).value_or("-1");
        const auto t = clock_type::now();
        main_->revoke();
        revoke_ms = ms_since(t);
        dead.store(static_cast<int>(elastic::internal::parse_integer(v).value_or(-1)), std::memory_order_release);
        return;
      }
    });
    auto old_done = cuda::event::create();  // made here, outside the timed switch
    store_.add("in_kill_loop", 1);
    const auto until = clock_type::now() + timeout_;
    long steps = 0;
    std::string failure = "none";
    while (clock_type::now() < until) {
      try {
        step(*main_);
        ++steps;
      } catch (const std::exception& e) {
        failure = std::string(e.what()).substr(0, 160);
        break;
      }
    }
    while (dead.load(std::memory_order_acquire) < 0 && clock_type::now() < until) std::this_thread::sleep_for(100us);
    const int d = dead.load(std::memory_order_acquire);
    if (d < 0 || d == o_.rank || d >= world) throw std::runtime_error(fmt::format("no valid dead rank learnt ({})", d));

    // The switch: the standby without the dead rank. The old communicator's abort runs on a
    // thread of its own, started now (concurrent) or after the first step (deferred).
    // Revoke stops the old communicator's kernels but does not wait for them: its last collective
    // may still be writing the gradient buffer when the standby's first one reads it (TSan saw
    // exactly that on the model). So the standby's stream waits for the old stream first, by an
    // event. Without ncclCommRevoke the old kernel ends only with the abort, which then cannot
    // wait for the first step: such a run aborts at once whatever --abort says (abort_mode_used).
    double abort_ms = 0;
    std::jthread aborter;
    auto start_abort = [&] {
      aborter = std::jthread([&] {
        const auto t = clock_type::now();
        main_->abort();
        abort_ms = ms_since(t);
      });
    };
    const bool concurrent = o_.abort == "concurrent" || !comm::nccl_communicator::can_revoke();
    auto& standby = *standby_[static_cast<std::size_t>(d)];
    old_done.record(main_->stream());  // behind the revoked collective
    if (concurrent) start_abort();
    old_done.make_wait(standby.stream());
    step(standby);
    const double switch_ms = ms_since(learnt);
    if (!concurrent) start_abort();
    std::vector<double> after;
    for (int i = 0; i < 3; ++i) after.push_back(step(standby));
    aborter.join();

    // The same survivors, the reinit way: a fresh 3-rank init from a new id, and its first step
    // (the old communicator is already aborted here, so this is init + step alone).
    const auto survivors = without(d);
    const int me = index_in(survivors, o_.rank);
    barrier("reinit", survivors);
    const auto t0 = clock_type::now();
    comm::nccl_communicator fresh(shared_id("reinit", me == 0), me, world - 1, device, timeout_);
    step(fresh);
    const double fresh_ms = ms_since(t0);
    barrier("reinit-done", survivors);  // no communicator torn down under a peer's last step

    out_["dead"] = d;
    out_["kill_loop_steps"] = static_cast<std::int64_t>(steps);
    out_["kill_loop_end"] = failure;
    out_["revoke_ms"] = revoke_ms;
    out_["switch_ms"] = switch_ms;
    out_["step_on_standby_ms"] = median(after);
    out_["abort_old_ms"] = abort_ms;
    out_["abort_mode_used"] = concurrent ? "concurrent" : "deferred";
    out_["fresh_after_death_ms"] = fresh_ms;
    out_["can_revoke"] = comm::nccl_communicator::can_revoke();
  }

  const options& o_;
  shm_store store_;
  std::chrono::milliseconds timeout_;
  std::size_t count_;
  cuda::device_bytes grad_;
  cuda::device_bytes scratch_;  // the builder's warm-up buffer
  std::unique_ptr<comm::nccl_communicator> main_;
  std::array<std::unique_ptr<comm::nccl_communicator>, world> standby_;
  double build_ms_ = 0;
  std::string builder_error_;
  json out_ = json::object();
};

int rank_main(const options& o) {
  // Die with the driver; and if it is already gone, do not start.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != o.parent) return 3;
  try {
    rank_process r(o);
    return r.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_standby_bench rank %d: %s\n", o.rank, e.what());
    return 1;
  }
}

// ---------------------------------------------------------------------------------------------
// The driver.

std::string self_path(const char* argv0) {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string(argv0);
}

// One episode: 4 fresh ranks, standbys, a kill. Returns each survivor's result object.
std::vector<json> episode(const options& o, const std::string& self, const std::string& abort, bool full, int index) {
  const std::string name = fmt::format("standby-bench-{}-{}", ::getpid(), index);
  shm_store::remove(name);
  shm_store store(name);
  struct remover {
    std::string name;
    ~remover() { shm_store::remove(name); }
  } remove_at_end{name};

  std::vector<elastic::test::child_process> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(elastic::test::child_process::spawn(
        {self, fmt::format("--rank={}", r), "--store=" + name, "--abort-mode=" + abort,
         fmt::format("--full={}", full ? 1 : 0), fmt::format("--parent={}", ::getpid()),
         fmt::format("--size-kib={}", o.size_kib), fmt::format("--steps={}", o.steps),
         fmt::format("--init-reps={}", o.init_reps), fmt::format("--timeout-s={}", o.timeout_s)},
        {{"NCCL_HOSTID", fmt::format("standby-bench-host-{}", r)},
         {"NCCL_SOCKET_IFNAME", "lo"},
         {"NCCL_IB_DISABLE", "1"}}));
  }
  // Each phase is bounded by the ranks' own timeouts: the fresh inits, the build, the kill.
  const auto deadline = clock_type::now() + std::chrono::seconds(o.timeout_s) * (4 + (full ? o.init_reps : 0));
  auto fail = [&](const std::string& why) -> std::runtime_error {
    return std::runtime_error(fmt::format("episode {} (abort {}): {}", index, abort, why));
  };
  // Wait until all four are in the training loop of the kill phase (or one of them ended).
  for (;;) {
    if (store.get("in_kill_loop").value_or("0") == std::to_string(world)) break;
    for (int r = 0; r < world; ++r) {
      if (auto st = ranks[static_cast<std::size_t>(r)].wait_for(0ms)) {
        throw fail(fmt::format("rank {} ended before the kill (wait status {})", r, *st));
      }
    }
    if (clock_type::now() > deadline) throw fail("the ranks did not reach the kill phase in time");
    std::this_thread::sleep_for(5ms);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(o.kill_after_ms));
  auto& victim = ranks[static_cast<std::size_t>(o.victim)];
  victim.kill(SIGKILL);
  if (!victim.killed_by(SIGKILL, 10s)) throw fail("the victim did not die of SIGKILL");
  store.set("dead", std::to_string(o.victim));

  std::vector<json> results;
  for (int r = 0; r < world; ++r) {
    if (r == o.victim) continue;
    auto& c = ranks[static_cast<std::size_t>(r)];
    std::optional<json> result;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
      auto line = c.read_line(std::max(left, 0ms));
      if (!line) break;
      if (line->starts_with("{\"standby_rank\"")) {
        result = json::parse(*line).at("standby_rank");
        break;
      }
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
    const auto code = c.exit_code(std::max(left, 0ms));
    if (!result || code != 0) {
      throw fail(fmt::format("rank {} {}", r,
                             result ? fmt::format("exited with {}", code ? std::to_string(*code) : "a signal/timeout")
                                    : "printed no result"));
    }
    results.push_back(std::move(*result));
  }
  return results;
}

// A figure over the survivors: `max` for the group's time (it trains again when the slowest
// survivor does), else the median. Null when a rank lacks it.
json over(const std::vector<json>& ranks, std::string_view key, bool max) {
  std::vector<double> v;
  for (const auto& r : ranks) {
    const json* x = r.find(key);
    if (x == nullptr || !x->is_number()) continue;
    v.push_back(x->as_double());
  }
  if (v.empty()) return json();
  return max ? json(*std::max_element(v.begin(), v.end())) : json(median(v));
}

std::string cell(const json& v, std::string_view unit) {
  if (v.is_null()) return "missing";
  return unit == "x" ? fmt::format("{:.2f}x", v.as_double()) : fmt::format("{:.1f}{}", v.as_double(), unit);
}

int drive(const options& o, const std::string& self) {
  int devices = 0;
  if (const cudaError_t rc = cudaGetDeviceCount(&devices); rc != cudaSuccess || devices < 1) {
    std::printf("nccl_standby_bench: skipped: no CUDA device (%s)\n",
                rc != cudaSuccess ? cudaGetErrorString(rc) : "none visible");
    return 77;
  }
  json report = json::object();
  report["bench"] = "nccl_standby";
  report["model"] = on_model;
  report["world"] = world;
  report["survivors"] = world - 1;
  report["size_kib"] = static_cast<std::int64_t>(o.size_kib);
  report["nccl"] = comm::detail::nccl_version_string(comm::detail::nccl_runtime_version());

  std::vector<std::vector<json>> episodes;
  for (std::size_t i = 0; i < o.aborts.size(); ++i) {
    episodes.push_back(episode(o, self, o.aborts[i], i == 0, static_cast<int>(i)));
  }
  const auto& first = episodes.front();  // the full episode: fresh inits, step times, memory
  // Rank 0 always survives unless it is the victim; the GPU's free memory is the same for all.
  json free0, free1;
  for (const auto& r : first) {
    if (const json* f = r.find("free_before_mib"); f != nullptr && free0.is_null()) {
      free0 = *f;
      free1 = r.at("free_after_mib");
    }
  }
  report["fresh_init_ms"] = over(first, "fresh_init_ms", false);
  report["fresh_init_first_step_ms"] = over(first, "fresh_init_first_step_ms", false);
  report["abort_healthy_ms"] = over(first, "abort_healthy_ms", false);
  report["step_idle_ms"] = over(first, "step_idle_ms", false);
  report["step_building_ms"] = over(first, "step_building_ms", false);
  report["step_built_ms"] = over(first, "step_built_ms", false);
  report["build_ms"] = over(first, "build_ms", true);
  const int rank_standbys = world * (world - 1);  // 4 worlds of 3 members
  if (!free0.is_null()) {
    report["standby_mib"] = (free0.as_double() - free1.as_double()) / rank_standbys;
  } else {
    report["standby_mib"] = on_model ? json("model") : json("unknown");
  }
  const bool has_memstats = comm::detail::nccl_symbol("ncclCommMemStats") != nullptr;
  report["ncclCommMemStats"] = has_memstats ? "in libnccl, but nccl_communicator exposes no ncclComm_t to ask it"
                                            : "not in this libnccl (2.29.7+)";
  json modes = json::object();
  for (std::size_t i = 0; i < o.aborts.size(); ++i) {
    json m = json::object();
    m["switch_ms"] = over(episodes[i], "switch_ms", true);
    m["revoke_ms"] = over(episodes[i], "revoke_ms", true);
    m["abort_old_ms"] = over(episodes[i], "abort_old_ms", true);
    m["step_on_standby_ms"] = over(episodes[i], "step_on_standby_ms", false);
    m["fresh_after_death_ms"] = over(episodes[i], "fresh_after_death_ms", true);
    std::string used = o.aborts[i];  // what the survivors did (no revoke: concurrent, see the rank)
    for (const auto& r : episodes[i]) {
      if (const json* u = r.find("abort_mode_used"); u != nullptr && u->is_string()) used = u->as_string();
    }
    m["abort_mode_used"] = used;
    modes[o.aborts[i]] = std::move(m);
  }
  report["abort_modes"] = modes;
  json raw = json::object();  // every survivor's own figures, for a closer look
  for (std::size_t i = 0; i < o.aborts.size(); ++i) raw[o.aborts[i]] = json(json::array_t(episodes[i]));
  report["ranks"] = raw;
  bool can_revoke = true;
  for (const auto& r : first) can_revoke = can_revoke && r.find("can_revoke") && r.at("can_revoke").as_bool();
  report["can_revoke"] = can_revoke;

  // The table.
  std::printf("## Standby communicators: world 4 -> 3 on one GPU (NCCL %s%s, %ld KiB allreduce)\n\n",
              report["nccl"].as_string().c_str(), on_model ? ", MODEL: no real timings or memory" : "", o.size_kib);
  std::printf("| measure | value |\n|---|---|\n");
  std::vector<std::string> missing;
  auto row = [&](const std::string& what, const json& v, std::string_view unit = " ms") {
    if (v.is_null()) missing.push_back(what);
    std::printf("| %s | %s |\n", what.c_str(), cell(v, unit).c_str());
  };
  row("fresh 3-rank init (from a fresh id)", report["fresh_init_ms"]);
  row("fresh 3-rank init + first step", report["fresh_init_first_step_ms"]);
  for (const auto& mode : o.aborts) {
    const json& m = report["abort_modes"][mode];
    const std::string& used = m.at("abort_mode_used").as_string();
    row(fmt::format("standby switch, learnt death -> first step done (old abort {}{})", mode,
                    used == mode ? "" : ", ran " + used + ": no ncclCommRevoke"),
        m.at("switch_ms"));
    row(fmt::format("  revoke of the old communicator (abort {})", mode), m.at("revoke_ms"));
    row(fmt::format("  abort of the old communicator, on its own thread (abort {})", mode), m.at("abort_old_ms"));
    row(fmt::format("  survivors' fresh init + first step after the death (abort {})", mode),
        m.at("fresh_after_death_ms"));
    row(fmt::format("  step on the standby afterwards (abort {})", mode), m.at("step_on_standby_ms"));
  }
  row("abort of a healthy 3-rank communicator", report["abort_healthy_ms"]);
  row("step time, no standby", report["step_idle_ms"]);
  row("step time while the standbys build", report["step_building_ms"]);
  row("step time with the standbys built (idle)", report["step_built_ms"]);
  row("standby build, 3 per rank (init + warm-up allreduce each)", report["build_ms"]);
  json ratio_building, ratio_built;
  if (!report["step_building_ms"].is_null() && !report["step_idle_ms"].is_null()) {
    ratio_building = report["step_building_ms"].as_double() / report["step_idle_ms"].as_double();
    report["step_ratio_building"] = ratio_building;
  }
  if (!report["step_built_ms"].is_null() && !report["step_idle_ms"].is_null()) {
    ratio_built = report["step_built_ms"].as_double() / report["step_idle_ms"].as_double();
    report["step_ratio_built"] = ratio_built;
  }
  row("step time ratio, building / none", ratio_building, "x");
  row("step time ratio, built / none", ratio_built, "x");
  const json& mib = report["standby_mib"];
  std::printf("| memory per standby per rank (cudaMemGetInfo / %d) | %s |\n", rank_standbys,
              mib.is_string() ? mib.as_string().c_str() : fmt::format("{:.1f} MiB", mib.as_double()).c_str());
  if (!on_model && !mib.is_number()) missing.push_back("memory per standby");
  std::printf("| ncclCommMemStats | %s |\n", report["ncclCommMemStats"].as_string().c_str());
  std::printf("| revoke used (ncclCommRevoke) | %s |\n\n", can_revoke ? "yes" : "no: the libnccl lacks or gates it");

  // The conclusion the lead can quote.
  const json& best = report["abort_modes"][o.aborts.back()];
  std::string conclusion = "incomplete: see the missing rows";
  if (missing.empty()) {
    const double sw = best.at("switch_ms").as_double();
    const double fresh = report["fresh_init_first_step_ms"].as_double();
    const double per = mib.is_number() ? mib.as_double() : 0.0;
    const std::string memory =
        mib.is_number()
            ? fmt::format("{:.0f} MiB per standby, so N-1 standbys per rank (one per possible death) fit a {} MiB "
                          "budget up to N = {}",
                          per, o.budget_mib, per > 0 ? static_cast<long>(o.budget_mib / per) + 1 : 0L)
            : "memory: not measured here (model)";
    conclusion = fmt::format(
        "standby switch {:.0f} ms vs fresh init + first step {:.0f} ms ({:.1f}x; a reinit that aborts the old "
        "communicator first adds {:.0f} ms); steps took {:.2f}x their time for the {:.0f} ms the standbys took to "
        "build after each membership change; {}. Worth it when deaths are frequent enough that the {:.0f} ms saved "
        "per death outweighs that slowdown, and the group is small enough that N-1 standbys per rank fit the "
        "memory budget (beyond that, keep standbys only for the likeliest deaths).",
        sw, fresh, sw > 0 ? fresh / sw : 0.0, best.at("abort_old_ms").as_double(), ratio_building.as_double(),
        report["build_ms"].as_double(), memory, fresh - sw);
  }
  report["conclusion"] = conclusion;
  std::printf("conclusion: %s\n\n", conclusion.c_str());
  std::printf("%s\n", report.dump().c_str());
  if (!missing.empty()) {
    std::fprintf(stderr, "nccl_standby_bench: rows without a value: %s\n", fmt::format("{}", fmt::join(missing, "; ")).c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const options o = parse(argc, argv);
    if (o.rank >= 0) return rank_main(o);
    if (o.victim < 0 || o.victim >= world) throw std::runtime_error("--victim must be 0..3");
    return drive(o, self_path(argv[0]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nccl_standby_bench: %s\n", e.what());
    return 1;
  }
}
