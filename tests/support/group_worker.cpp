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
//   store scheme=<shm|etcd|relay>       (the store's URL scheme: relay under elastic-run with etcd)
//   joined round=R rank=r world=W t=<ns>
//   step=N world=W rank=r t=<CLOCK_MONOTONIC ns> crc=<crc32c of the weights>   (N steps done)
//   rebuilt round=R world=W rank=r cause=<...> noticed=<ns> met=<ns> connected=<ns> resynced=<ns>
//   killing t=<ns>                      (--kill-self-at, --die-at: just before the SIGKILL)
//   perturbed step=N rank=r             (--perturb-after I: this rank, not rank 0 of the full group
//                                        (--max), flipped a bit of a weight after step I's update;
//                                        N = I + 1 steps done)
//   stopping t=<ns>                     (--stop-self-at: just before the SIGSTOP)
//   stopping round=R t=<ns>             (--stop-in-connect-round R: just before the SIGSTOP, when
//                                        round R formed and before its communicator connects)
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

#include "regression_job.hpp"

namespace {

using namespace std::chrono_literals;
using elastic::test::job_options;
using elastic::test::say;

std::unique_ptr<elastic::rendezvous::store> open_store(const job_options& o, std::chrono::milliseconds unavailable) {
#if ELASTIC_WITH_ETCD
  elastic::rendezvous::etcd_options eo;
  eo.unavailable_timeout = unavailable;
  eo.request_timeout = 2s;
  return elastic::rendezvous::open_store(o.store, eo);
#else
  (void)unavailable;
  return elastic::rendezvous::open_store(o.store);
#endif
}

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
  std::chrono::milliseconds unavailable{30000};  // how long the etcd store may be away
  // --shard 1: also a fixed slice (add_shard), which a group refuses; --shard 2: moments
  // partitioned across the group (add_partitioned), ZeRO-1 style.
  long long shard = 0;
  long long stop_in_connect = 0;  // a hang in the connect of this round's communicator
  long long perturb_after = -1;   // a rank other than 0 diverges after this step (a resync must mend it)
  long long resync_mode = 0;      // group_options::resync, as its number (1: broadcast)
  const job_options o = elastic::test::parse_job_options(argc, argv, "elastic_group_worker", {},
                                                         [&](const std::string& name, long long v) {
                                                           if (name == "--shard") {
                                                             shard = v;
                                                             return true;
                                                           }
                                                           if (name == "--resync-mode") {
                                                             resync_mode = v;
                                                             return true;
                                                           }
                                                           if (name == "--perturb-after") {
                                                             perturb_after = v;
                                                             return true;
                                                           }
                                                           if (name == "--stop-in-connect-round") {
                                                             stop_in_connect = v;
                                                             return true;
                                                           }
                                                           if (name != "--unavailable-ms") return false;
                                                           unavailable = std::chrono::milliseconds(v);
                                                           return true;
                                                         });
  namespace comm = elastic::comm;
  try {
    auto store = open_store(o, unavailable);
    say("store scheme=" + o.store.substr(0, o.store.find("://")));
    const elastic::test::dataset data(o.dim, 20);
    std::vector<float> w(o.dim, 0.0f);
    std::uint64_t samples_seen = 0;
    history hist;
    elastic::checkpoint::state st;
    st.add("w", w).add_value("samples_seen", samples_seen).add_object("history", hist);
    std::vector<float> moments(shard == 1 ? 16 : 0);
    if (shard == 1) st.add_shard("moments", std::span<float>(moments), 0, 16);
    // Partitioned: registered as a world of one; the group gives each rank its slice at the join.
    if (shard == 2) st.add_partitioned("moments", moments, o.dim, 0, 1);

    comm::communicator_factory<comm::gloo_communicator> connect =
        [gloo = comm::gloo_factory(o.timeout), stop_in_connect](elastic::rendezvous::store& s,
                                                              const elastic::rendezvous::round_info& r) {
          if (r.round == stop_in_connect) {
            elastic::test::say("stopping round=" + std::to_string(r.round) +
                               " t=" + std::to_string(elastic::internal::monotonic_ns()));
            ::raise(SIGSTOP);
          }
          return gloo(s, r);
        };
    comm::group_options go = elastic::test::group_options_of(o);
    go.resync = static_cast<comm::resync_mode>(resync_mode);
    comm::gloo_group group(*store, go, std::move(connect));
    elastic::training_loop loop({.dir = o.dir,
                                 .steps = o.steps,
                                 .every_steps = o.every,
                                 .keep_last = 3,
                                 .step_timeout = o.step_timeout,
                                 .group = &group},
                                st);
    std::vector<std::int64_t> grad(o.dim);
    std::size_t rebuilds_seen = 0;
    bool announced = false;
    for (auto& step : loop) {
      elastic::test::report_group(group, announced, rebuilds_seen);
      const std::uint64_t idx = step.index();
      std::fill(grad.begin(), grad.end(), 0);
      elastic::test::local_gradient(data, w, idx, o.batch, group.rank(), group.size(), grad.data());
      std::jthread killer = elastic::test::inject_faults(o, idx, group.size() == o.max ? group.rank() : -2);
      if (!group.allreduce(std::span<std::int64_t>(grad), comm::reduce_op::sum)) continue;  // redone on the new group
      step.before_update();
      elastic::test::apply_gradient(w, grad.data(), o.batch);
      if (shard == 2) {  // this rank's slice of the moments, from the whole gradient
        const std::size_t lo = st.find("moments")->shard->offset;
        for (std::size_t k = 0; k < moments.size(); ++k) {
          moments[k] = 0.9f * moments[k] + static_cast<float>(static_cast<double>(grad[lo + k]) / 1e6);
        }
      }
      const auto crc = elastic::internal::crc32c(w.data(), w.size() * sizeof(float));
      samples_seen += o.batch;
      hist.recent.push_back(crc);
      if (hist.recent.size() > 8) hist.recent.erase(hist.recent.begin());
      elastic::test::report_step(idx + 1, group.size(), group.rank(), crc);
      if (perturb_after >= 0 && idx == static_cast<std::uint64_t>(perturb_after) && group.rank() != 0 &&
          group.size() == o.max) {
        // One bit of one weight, after the update (so before any rebuild that comes next): only
        // rank 0's state, broadcast at the resync, can mend it.
        std::uint32_t bits;
        std::memcpy(&bits, &w[o.dim / 2], sizeof bits);
        bits ^= 1u << 20;
        std::memcpy(&w[o.dim / 2], &bits, sizeof bits);
        say("perturbed step=" + std::to_string(idx + 1) + " rank=" + std::to_string(group.rank()));
      }
      if (o.step_sleep.count() > 0) std::this_thread::sleep_for(o.step_sleep);
    }
    char line[160];
    // The crc covers the weights, the value and the object: all of the replicated state.
    std::uint32_t all = elastic::internal::crc32c(w.data(), w.size() * sizeof(float));
    all = elastic::internal::crc32c(&samples_seen, sizeof samples_seen, all);
    all = elastic::internal::crc32c(hist.recent.data(), hist.recent.size() * sizeof(std::uint32_t), all);
    std::uint32_t moments_crc = 0;
    if (shard == 2 && loop.reason() == elastic::loop_reason::finished) {
      // The whole buffer, each rank adding its slice to zeros: exact in float.
      std::vector<float> whole(o.dim, 0.0f);
      const std::size_t lo = st.find("moments")->shard->offset;
      std::copy(moments.begin(), moments.end(), whole.begin() + static_cast<std::ptrdiff_t>(lo));
      if (!group.allreduce(std::span<float>(whole), comm::reduce_op::sum)) throw elastic::error(elastic::errc::aborted, "gather failed");
      moments_crc = elastic::internal::crc32c(whole.data(), whole.size() * sizeof(float));
    }
    std::snprintf(line, sizeof line, "final step=%llu crc=%08x reason=%s redone=%llu moments=%08x",
                  static_cast<unsigned long long>(loop.completed_steps()), all,
                  std::string(elastic::to_string(loop.reason())).c_str(),
                  static_cast<unsigned long long>(loop.redone_steps()), moments_crc);
    say(line);
    return loop.exit_code();
  } catch (const elastic::error& e) {
    say("error code=" + std::string(elastic::to_string(e.code())) + " " + e.what());
    return 3;
  }
}
