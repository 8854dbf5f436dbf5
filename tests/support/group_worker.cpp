// A rank of an elastic data-parallel job, for tests/test_elastic_group.cpp and the recovery
// benchmark: linear regression on synthetic data, trained by a training_loop with a gloo_group.
//
//   elastic_group_worker --store URL --run-id ID --min N --max N --steps S --dir CKPT [options]
//
// Gradients are summed in 2^-24 fixed point (int64), so the sum is exact whatever the world
// size and the order of the ranks: a run that loses and regains ranks ends with the very same
// weights as an undisturbed one, and the tests compare them bit for bit.
//
// stdout, one line each, flushed:
//   joined round=R rank=r world=W t=<ns>
//   step=N world=W rank=r t=<CLOCK_MONOTONIC ns> crc=<crc32c of the weights>   (N steps done)
//   rebuilt round=R world=W rank=r cause=<...> noticed=<ns> met=<ns> connected=<ns> resynced=<ns>
//   killing t=<ns>                      (--kill-self-at: just before the SIGKILL)
//   stopping t=<ns>                     (--stop-self-at: just before the SIGSTOP)
//   final step=N crc=<hex> reason=<finished|preempted|stopped> redone=<n>
// Errors: "error code=<errc> <message>" and exit 3.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <elastic/checkpoint.hpp>
#include <elastic/comm/gloo_group.hpp>
#include <elastic/internal/clock.hpp>
#include <elastic/internal/crc32c.hpp>
#include <elastic/rendezvous/open_store.hpp>

namespace {

using namespace std::chrono_literals;
using ms = std::chrono::milliseconds;

struct options {
  std::string store, run_id, dir, id;
  std::size_t min = 1, max = 1;
  std::uint64_t steps = 100, every = 10;
  std::size_t dim = 65536, batch = 16;
  ms timeout{2000}, hb_interval{100}, hb_timeout{500}, last_call{300}, join_timeout{20000}, poll{20};
  ms step_sleep{0}, step_timeout{0}, unavailable{30000};
  long kill_self_at = -1;  // SIGKILL ourselves mid-allreduce of this step
  long stop_self_at = -1;  // SIGSTOP ourselves before the allreduce of this step (a hang)
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "elastic_group_worker: %s\n", why.c_str());
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage("missing value for " + a);
    const std::string v = argv[++i];
    auto n = [&] { return std::strtoll(v.c_str(), nullptr, 10); };
    if (a == "--store") o.store = v;
    else if (a == "--run-id") o.run_id = v;
    else if (a == "--dir") o.dir = v;
    else if (a == "--id") o.id = v;
    else if (a == "--min") o.min = static_cast<std::size_t>(n());
    else if (a == "--max") o.max = static_cast<std::size_t>(n());
    else if (a == "--steps") o.steps = static_cast<std::uint64_t>(n());
    else if (a == "--every") o.every = static_cast<std::uint64_t>(n());
    else if (a == "--dim") o.dim = static_cast<std::size_t>(n());
    else if (a == "--timeout-ms") o.timeout = ms(n());
    else if (a == "--hb-interval-ms") o.hb_interval = ms(n());
    else if (a == "--hb-timeout-ms") o.hb_timeout = ms(n());
    else if (a == "--last-call-ms") o.last_call = ms(n());
    else if (a == "--join-timeout-ms") o.join_timeout = ms(n());
    else if (a == "--poll-ms") o.poll = ms(n());
    else if (a == "--step-sleep-ms") o.step_sleep = ms(n());
    else if (a == "--step-timeout-ms") o.step_timeout = ms(n());
    else if (a == "--unavailable-ms") o.unavailable = ms(n());
    else if (a == "--kill-self-at") o.kill_self_at = static_cast<long>(n());
    else if (a == "--stop-self-at") o.stop_self_at = static_cast<long>(n());
    else usage("unknown option " + a);
  }
  if (o.store.empty() || o.dir.empty()) usage("--store and --dir are required");
  return o;
}

std::unique_ptr<elastic::rendezvous::store> open_store(const options& o) {
#if ELASTIC_WITH_ETCD
  elastic::rendezvous::etcd_options eo;
  eo.unavailable_timeout = o.unavailable;
  eo.request_timeout = 2s;
  return elastic::rendezvous::open_store(o.store, eo);
#else
  return elastic::rendezvous::open_store(o.store);
#endif
}

void say(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

/// The synthetic dataset: sample s has features x_s[k] = table[(s * 2654435761 + k) mod T] and
/// label w*·x_s; both the same on every rank, computed where needed.
struct dataset {
  static constexpr std::size_t table_size = 1 << 20;
  std::vector<float> table, target;
  explicit dataset(std::size_t dim) : table(table_size), target(dim) {
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

/// Replicated host state beside the weights, so a resync must carry values and objects too.
struct history {
  std::vector<std::uint32_t> recent;  // crc of the weights after each of the last 8 steps
};
template <class Archive>
void elastic_checkpoint(Archive& ar, history& h) {
  ar(h.recent);
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  namespace comm = elastic::comm;
  try {
    auto store = open_store(o);
    const dataset data(o.dim);
    std::vector<float> w(o.dim, 0.0f);
    std::uint64_t samples_seen = 0;
    history hist;
    elastic::checkpoint::state st;
    st.add("w", w).add_value("samples_seen", samples_seen).add_object("history", hist);

    comm::group_options go;
    go.rendezvous.run_id = o.run_id;
    go.rendezvous.min_ranks = static_cast<int>(o.min);
    go.rendezvous.max_ranks = static_cast<int>(o.max);
    go.rendezvous.join_timeout = o.join_timeout;
    go.rendezvous.last_call_timeout = o.last_call;
    go.rendezvous.heartbeat_interval = o.hb_interval;
    go.rendezvous.heartbeat_timeout = o.hb_timeout;
    go.rendezvous.participant_id = o.id;
    go.poll_interval = o.poll;
    comm::gloo_group group(*store, go, comm::gloo_factory(o.timeout));

    elastic::training_loop loop({.dir = o.dir,
                                 .steps = o.steps,
                                 .every_steps = o.every,
                                 .keep_last = 3,
                                 .step_timeout = o.step_timeout,
                                 .group = &group},
                                st);
    const double scale = 16777216.0;  // 2^24
    const float lr = 4.0f / static_cast<float>(o.dim);
    std::vector<std::int64_t> grad(o.dim);
    std::size_t rebuilds_seen = 0;
    bool announced = false;
    for (auto& step : loop) {
      if (!announced) {
        say("joined round=" + std::to_string(group.round()) + " rank=" + std::to_string(group.rank()) +
            " world=" + std::to_string(group.size()) + " t=" + std::to_string(elastic::internal::monotonic_ns()));
        announced = true;
      }
      if (group.rebuilds() != rebuilds_seen) {
        rebuilds_seen = group.rebuilds();
        const auto& r = group.last_recovery();
        say("rebuilt round=" + std::to_string(r.round) + " world=" + std::to_string(r.world_size) +
            " rank=" + std::to_string(group.rank()) + " noticed=" + std::to_string(r.noticed_ns) +
            " met=" + std::to_string(r.rendezvous_done_ns) + " connected=" + std::to_string(r.connected_ns) +
            " resynced=" + std::to_string(r.resynced_ns) + " cause=" + r.cause);
      }
      const std::uint64_t idx = step.index();
      // This rank's share of the global batch: samples j with j % world == rank.
      std::fill(grad.begin(), grad.end(), 0);
      for (std::size_t j = static_cast<std::size_t>(group.rank()); j < o.batch; j += static_cast<std::size_t>(group.size())) {
        const std::size_t x = data.features(idx * o.batch + j);
        float pred = 0, label = 0;
        for (std::size_t k = 0; k < o.dim; ++k) {
          pred += w[k] * data.at(x, k);
          label += data.target[k] * data.at(x, k);
        }
        const float r = pred - label;
        for (std::size_t k = 0; k < o.dim; ++k) grad[k] += std::llround(static_cast<double>(r * data.at(x, k)) * scale);
      }
      if (o.stop_self_at >= 0 && idx == static_cast<std::uint64_t>(o.stop_self_at)) {
        say("stopping t=" + std::to_string(elastic::internal::monotonic_ns()));
        ::raise(SIGSTOP);  // frozen inside the step's timer scope, as a hung kernel or NFS read would be
      }
      std::jthread killer;
      if (o.kill_self_at >= 0 && idx == static_cast<std::uint64_t>(o.kill_self_at)) {
        // Let the others enter the allreduce first, then die inside ours.
        std::this_thread::sleep_for(20ms);
        killer = std::jthread([] {
          std::this_thread::sleep_for(std::chrono::microseconds(300));
          say("killing t=" + std::to_string(elastic::internal::monotonic_ns()));
          ::kill(::getpid(), SIGKILL);
        });
      }
      if (!group.allreduce(std::span<std::int64_t>(grad), comm::reduce_op::sum)) continue;  // redone on the new group
      step.before_update();
      for (std::size_t k = 0; k < o.dim; ++k) {
        w[k] -= lr * static_cast<float>(static_cast<double>(grad[k]) / scale / static_cast<double>(o.batch));
      }
      const auto crc = elastic::internal::crc32c(w.data(), w.size() * sizeof(float));
      samples_seen += o.batch;
      hist.recent.push_back(crc);
      if (hist.recent.size() > 8) hist.recent.erase(hist.recent.begin());
      char line[160];
      std::snprintf(line, sizeof line, "step=%llu world=%d rank=%d t=%lld crc=%08x",
                    static_cast<unsigned long long>(idx + 1), group.size(), group.rank(),
                    static_cast<long long>(elastic::internal::monotonic_ns()), crc);
      say(line);
      if (o.step_sleep.count() > 0) std::this_thread::sleep_for(o.step_sleep);
    }
    char line[160];
    // The crc covers the weights, the value and the object: all of the replicated state.
    std::uint32_t all = elastic::internal::crc32c(w.data(), w.size() * sizeof(float));
    all = elastic::internal::crc32c(&samples_seen, sizeof samples_seen, all);
    all = elastic::internal::crc32c(hist.recent.data(), hist.recent.size() * sizeof(std::uint32_t), all);
    std::snprintf(line, sizeof line, "final step=%llu crc=%08x reason=%s redone=%llu",
                  static_cast<unsigned long long>(loop.completed_steps()), all,
                  std::string(elastic::to_string(loop.reason())).c_str(),
                  static_cast<unsigned long long>(loop.redone_steps()));
    say(line);
    return loop.exit_code();
  } catch (const elastic::error& e) {
    say("error code=" + std::string(elastic::to_string(e.code())) + " " + e.what());
    return 3;
  }
}
