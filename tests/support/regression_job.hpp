// What the elastic-group workers (group_worker.cpp over Gloo, nccl_group_worker.cpp over NCCL)
// share: their command line, the synthetic linear-regression data, the line they print, and a
// rank's share of a step's gradient in 2^-24 fixed point (summed exactly by any world size).
#pragma once

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <elastic/comm/group_options.hpp>
#include <elastic/internal/clock.hpp>

namespace elastic::test {

/// The options every job worker takes (`--name value` each).
struct job_options {
  using ms = std::chrono::milliseconds;
  std::string store, run_id, dir, id;
  int min = 1, max = 1;
  std::uint64_t steps = 100, every = 10;
  std::size_t dim = 65536, batch = 16;
  ms timeout{2000}, hb_interval{100}, hb_timeout{500}, last_call{300}, join_timeout{20000}, poll{20};
  ms step_sleep{0}, step_timeout{0};
  long kill_self_at = -1;  // SIGKILL ourselves mid-allreduce of this step
  long die_at = -1;        // SIGKILL ourselves before the allreduce of this step (no peer finishes it)
  int die_rank = -1;       // ... only when we are this rank of the full group (--max ranks) then (-1: any)
  long stop_self_at = -1;  // SIGSTOP ourselves before the allreduce of this step (a hang)
  int replicas = 1;        // group_options::replicas: successors holding our slices in memory
};

/// Parses argv over `o` (the worker's defaults); an option it does not know goes to `extra`
/// (false: unknown too, exit 2). `program` names the worker in messages.
inline job_options parse_job_options(int argc, char** argv, const char* program, job_options o,
                                     const std::function<bool(const std::string&, long long)>& extra = {}) {
  auto usage = [&](const std::string& why) {
    std::fprintf(stderr, "%s: %s\n", program, why.c_str());
    std::exit(2);
  };
  using ms = job_options::ms;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage("missing value for " + a);
    const std::string v = argv[++i];
    const long long n = std::strtoll(v.c_str(), nullptr, 10);
    if (a == "--store") o.store = v;
    else if (a == "--run-id") o.run_id = v;
    else if (a == "--dir") o.dir = v;
    else if (a == "--id") o.id = v;
    else if (a == "--min") o.min = static_cast<int>(n);
    else if (a == "--max") o.max = static_cast<int>(n);
    else if (a == "--steps") o.steps = static_cast<std::uint64_t>(n);
    else if (a == "--every") o.every = static_cast<std::uint64_t>(n);
    else if (a == "--dim") o.dim = static_cast<std::size_t>(n);
    else if (a == "--timeout-ms") o.timeout = ms(n);
    else if (a == "--hb-interval-ms") o.hb_interval = ms(n);
    else if (a == "--hb-timeout-ms") o.hb_timeout = ms(n);
    else if (a == "--last-call-ms") o.last_call = ms(n);
    else if (a == "--join-timeout-ms") o.join_timeout = ms(n);
    else if (a == "--poll-ms") o.poll = ms(n);
    else if (a == "--step-sleep-ms") o.step_sleep = ms(n);
    else if (a == "--step-timeout-ms") o.step_timeout = ms(n);
    else if (a == "--kill-self-at") o.kill_self_at = static_cast<long>(n);
    else if (a == "--die-at") o.die_at = static_cast<long>(n);
    else if (a == "--die-rank") o.die_rank = static_cast<int>(n);
    else if (a == "--replicas") o.replicas = static_cast<int>(n);
    else if (a == "--stop-self-at") o.stop_self_at = static_cast<long>(n);
    else if (!extra || !extra(a, n)) usage("unknown option " + a);
  }
  // Under elastic-run the store is the one it gives its workers (its relay, with an etcd store).
  if (const char* e = std::getenv("ELASTIC_RDZV"); o.store.empty() && e != nullptr) o.store = e;
  if (o.store.empty() || o.dir.empty()) usage("--store (or ELASTIC_RDZV) and --dir are required");
  return o;
}

/// One line on stdout, flushed at once (the tests read workers line by line).
inline void say(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

/// The synthetic dataset: sample s has features x_s[k] = table[(s * 2654435761 + k) mod T] and
/// label w*·x_s; both the same on every rank, computed where needed.
struct dataset {
  std::size_t table_size;
  std::vector<float> table, target;
  dataset(std::size_t dim, int table_bits) : table_size(std::size_t{1} << table_bits), table(table_size), target(dim) {
    std::uint64_t z = 0x9e3779b97f4a7c15ull;
    auto next = [&] {
      z += 0x9e3779b97f4a7c15ull;
      std::uint64_t x = z;
      x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
      x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
      return static_cast<float>(static_cast<double>((x ^ (x >> 31)) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    };
    for (auto& v : table) v = next();
    for (auto& v : target) v = next();
  }
  std::size_t features(std::uint64_t s) const { return static_cast<std::size_t>(s * 2654435761ull); }
  float at(std::size_t x, std::size_t k) const { return table[(x + k) & (table_size - 1)]; }
};

/// 2^24: gradients travel as integers in this fixed point, so their sum is exact in any order.
inline constexpr double gradient_scale = 16777216.0;

/// This rank's share of step `step`'s gradient (samples j of the batch with j % world == rank)
/// for weights `w`, added into `grad` (`dim` int64 words, zeroed by the caller).
inline void local_gradient(const dataset& data, const std::vector<float>& w, std::uint64_t step, std::size_t batch,
                           int rank, int world, std::int64_t* grad) {
  const std::size_t dim = w.size();
  for (std::size_t j = static_cast<std::size_t>(rank); j < batch; j += static_cast<std::size_t>(world)) {
    const std::size_t x = data.features(step * batch + j);
    float pred = 0, label = 0;
    for (std::size_t k = 0; k < dim; ++k) {
      pred += w[k] * data.at(x, k);
      label += data.target[k] * data.at(x, k);
    }
    const float r = pred - label;
    for (std::size_t k = 0; k < dim; ++k) grad[k] += std::llround(static_cast<double>(r * data.at(x, k)) * gradient_scale);
  }
}

/// The SGD update every rank applies with the summed gradient.
inline void apply_gradient(std::vector<float>& w, const std::int64_t* grad, std::size_t batch) {
  const float lr = 4.0f / static_cast<float>(w.size());
  for (std::size_t k = 0; k < w.size(); ++k) {
    w[k] -= lr * static_cast<float>(static_cast<double>(grad[k]) / gradient_scale / static_cast<double>(batch));
  }
}

/// The group's options from the command line.
inline comm::group_options group_options_of(const job_options& o) {
  comm::group_options go;
  go.rendezvous.run_id = o.run_id;
  go.rendezvous.min_ranks = o.min;
  go.rendezvous.max_ranks = o.max;
  go.rendezvous.join_timeout = o.join_timeout;
  go.rendezvous.last_call_timeout = o.last_call;
  go.rendezvous.heartbeat_interval = o.hb_interval;
  go.rendezvous.heartbeat_timeout = o.hb_timeout;
  go.rendezvous.participant_id = o.id;
  go.poll_interval = o.poll;
  go.replicas = o.replicas;
  return go;
}

/// Prints "joined ..." once, and "rebuilt ..." after each rebuild of `group` (`seen`: the worker's
/// count so far).
template <class Group>
void report_group(const Group& group, bool& announced, std::size_t& seen) {
  const auto now = std::to_string(internal::monotonic_ns());
  if (!announced) {
    say("joined round=" + std::to_string(group.round()) + " rank=" + std::to_string(group.rank()) +
        " world=" + std::to_string(group.size()) + " t=" + now);
    announced = true;
  }
  if (group.rebuilds() == seen) return;
  seen = group.rebuilds();
  const auto& r = group.last_recovery();
  say("rebuilt round=" + std::to_string(r.round) + " world=" + std::to_string(r.world_size) +
      " rank=" + std::to_string(group.rank()) + " path=" + r.path + " noticed=" + std::to_string(r.noticed_ns) +
      " met=" + std::to_string(r.rendezvous_done_ns) + " connected=" + std::to_string(r.connected_ns) +
      " resynced=" + std::to_string(r.resynced_ns) + " cause=" + r.cause + (r.reason.empty() ? "" : " reason=" + r.reason));
}

/// The faults a test asks of step `step`: a SIGSTOP now (a hang inside the step's timer scope, as
/// a hung kernel or NFS read would leave it), a SIGKILL now (--die-at, when `rank` is --die-rank;
/// no peer can finish the step's allreduce, so the survivors all hold the state before it), or a SIGKILL ~20 ms into the step's allreduce (the returned thread fires it; the
/// others enter the allreduce first).
inline std::jthread inject_faults(const job_options& o, std::uint64_t step, int rank = -1) {
  if (o.stop_self_at >= 0 && step == static_cast<std::uint64_t>(o.stop_self_at)) {
    say("stopping t=" + std::to_string(internal::monotonic_ns()));
    ::raise(SIGSTOP);
  }
  if (o.die_at >= 0 && step == static_cast<std::uint64_t>(o.die_at) && (o.die_rank < 0 || o.die_rank == rank)) {
    // The peers first finish the previous allreduce: a process killed while their last bytes to
    // it are unread resets its connections, and a peer still in that allreduce would fail it.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    say("killing t=" + std::to_string(internal::monotonic_ns()));
    ::kill(::getpid(), SIGKILL);
  }
  if (o.kill_self_at < 0 || step != static_cast<std::uint64_t>(o.kill_self_at)) return {};
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return std::jthread([] {
    std::this_thread::sleep_for(std::chrono::microseconds(300));
    say("killing t=" + std::to_string(internal::monotonic_ns()));
    ::kill(::getpid(), SIGKILL);
  });
}

/// "step=N world=W rank=r t=<ns> crc=<hex>" after step N.
inline void report_step(std::uint64_t done, int world, int rank, std::uint32_t crc) {
  char line[160];
  std::snprintf(line, sizeof line, "step=%llu world=%d rank=%d t=%lld crc=%08x", static_cast<unsigned long long>(done),
                world, rank, static_cast<long long>(internal::monotonic_ns()), crc);
  say(line);
}

}  // namespace elastic::test
