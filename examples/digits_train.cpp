// Elastic data-parallel training of a real small model on a real small dataset, on CPUs: an MLP
// (64-32-10) classifying the UCI handwritten digits (8x8 images, 1797 samples; the copy Debian
// ships in python3-sklearn, see scripts/fetch_digits.sh). Meant to run under elastic-run:
//
//   elastic-run --nproc-per-node 4 --nnodes 2:4 -- digits_train --data digits.csv --ckpt ckpt
//
// Every rank takes its share of each global batch, the gradients are summed over a gloo_group
// and the training_loop checkpoints (rank 0) and resumes. Ranks may die, hang or come back: the
// group rebuilds and the loop redoes the step, so the job goes on with whoever is there.
//
// Gradients are summed in 2^-24 fixed point (int64): integer sums do not depend on the order or
// on how many ranks there are, so a disturbed run ends with the very weights of an undisturbed
// one, which the demo checks.
//
// --zero1 1 shards the optimizer ZeRO-1 style: each rank keeps only its slice of the momentum
// (state::add_partitioned), updates its slice of the parameters, and the slices are gathered
// by a second collective (each rank adds its slice to zeros: exact). After a rebuild the group
// moves each rank its new slice of the momentum, from memory, or from the newest checkpoint
// when a slice died with its rank. The weights are the same bits as without it.
//
// Fault injection for the demo, by worker slot (ELASTIC_LOCAL_RANK, else the first rank it got),
// each once per slot and checkpoint directory (a file beside it, CKPT.injected-*, remembers it
// across the slot's restarts), at the first step at or past S the slot runs (examples/injected_faults.hpp):
//   --kill-rank R --kill-at S    worker R SIGKILLs itself in the middle of step S's allreduce
//   --kill-together R1,R2 --kill-together-at S
//                                workers R1 and R2 both do, in step S (with --zero1 and 3
//                                workers, a rank and the successor that holds its replica)
//   --hang-rank R --hang-at S    worker R stops making progress in step S (the watchdog kills it)
//   --slow-rank R --slow-factor F
//                                worker R sleeps F times --step-sleep-ms in each step of its first
//                                life (a straggler: elastic-run reports it, --evict-stragglers
//                                restarts it)
//
// Without a --data file it trains on a synthetic stand-in (and says so).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <elastic/checkpoint.hpp>
#include <elastic/comm/gloo_worker.hpp>
#include <elastic/crc32c.hpp>

#include "injected_faults.hpp"

namespace {

using namespace std::chrono_literals;
constexpr int in = 64, hidden = 32, classes = 10, batch = 64;
constexpr std::size_t params = in * hidden + hidden + hidden * classes + classes;
constexpr double scale = 16777216.0;  // 2^24

struct options {
  std::string data, ckpt = "digits-ckpt";
  std::uint64_t steps = 600, every = 25;
  long step_sleep_ms = 0;
  long slow_rank = -1;
  double slow_factor = 1;
  bool zero1 = false;
  examples::injected_faults faults;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "digits_train: %s\nusage: digits_train [--data digits.csv] [--ckpt DIR|s3://BUCKET/PREFIX] [--steps N]\n"
               "                    [--every N] [--fault-marks PATH]\n"
               "                    [--step-sleep-ms MS] [--kill-rank R --kill-at S] [--hang-rank R --hang-at S]\n"
               "                    [--kill-together R1,R2 --kill-together-at S] [--zero1 1]\n"
               "                    [--slow-rank R --slow-factor F]\n",
               why.c_str());
  std::exit(2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage("missing value for " + a);
    const std::string v = argv[++i];
    auto n = [&] {
      char* end = nullptr;
      const long long x = std::strtoll(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0') usage("'" + v + "' is not a number (" + a + ")");
      return x;
    };
    if (a == "--data") o.data = v;
    else if (a == "--ckpt") o.ckpt = v;
    else if (a == "--steps") o.steps = static_cast<std::uint64_t>(n());
    else if (a == "--every") o.every = static_cast<std::uint64_t>(n());
    else if (a == "--step-sleep-ms") o.step_sleep_ms = static_cast<long>(n());
    else if (o.faults.take(a, v, [&] { return static_cast<long>(n()); })) continue;
    else if (a == "--zero1") o.zero1 = n() != 0;
    else if (a == "--slow-rank") o.slow_rank = static_cast<long>(n());
    else if (a == "--slow-factor") o.slow_factor = std::atof(v.c_str());
    else usage("unknown option " + a);
  }
  if (o.faults.marks.empty()) o.faults.marks = o.ckpt;
  return o;
}

/// Images as 64 features in [0, 1] and labels 0..9.
struct dataset {
  std::vector<float> x;
  std::vector<int> y;
  bool real = false;
  [[nodiscard]] std::size_t size() const { return y.size(); }
};

/// sklearn's digits.csv: 64 pixel values (0..16) then the label, comma-separated.
dataset load(const std::string& path) {
  dataset d;
  if (!path.empty()) {
    std::ifstream f(path);
    if (!f) throw elastic::error(elastic::errc::not_found, "digits_train: cannot open --data " + path);
    for (std::string line; std::getline(f, line);) {
      if (line.empty()) continue;
      std::stringstream ss(line);
      std::string cell;
      std::vector<float> row;
      while (std::getline(ss, cell, ',')) row.push_back(std::strtof(cell.c_str(), nullptr));
      if (row.size() != in + 1) {
        throw elastic::error(elastic::errc::corrupt, "digits_train: a line of " + path + " has " +
                                                         std::to_string(row.size()) + " fields, want 65");
      }
      for (int k = 0; k < in; ++k) d.x.push_back(row[k] / 16.0f);
      d.y.push_back(static_cast<int>(row[in]));
    }
    d.real = true;
    return d;
  }
  // A synthetic stand-in: 10 noisy prototypes.
  std::mt19937 g(11);
  std::uniform_real_distribution<float> u(0, 1);
  std::vector<float> proto(classes * in);
  for (auto& p : proto) p = u(g) > 0.6f ? 1.0f : 0.0f;
  for (int i = 0; i < 1797; ++i) {
    const int c = i % classes;
    for (int k = 0; k < in; ++k) d.x.push_back(std::clamp(proto[c * in + k] + (u(g) - 0.5f) * 0.6f, 0.0f, 1.0f));
    d.y.push_back(c);
  }
  return d;
}

/// Views of the flat parameter vector.
struct mlp {
  float* w1;  // [hidden][in]
  float* b1;
  float* w2;  // [classes][hidden]
  float* b2;
  explicit mlp(float* p) : w1(p), b1(w1 + in * hidden), w2(b1 + hidden), b2(w2 + hidden * classes) {}
};

/// Forward and backward for one sample; adds its fixed-point gradient to `grad`. Returns the loss.
float sample_gradient(const float* p, const float* x, int label, std::int64_t* grad) {
  const mlp m(const_cast<float*>(p));
  float h[hidden], logits[classes], prob[classes];
  for (int j = 0; j < hidden; ++j) {
    float s = m.b1[j];
    for (int k = 0; k < in; ++k) s += m.w1[j * in + k] * x[k];
    h[j] = s > 0 ? s : 0;
  }
  float mx = -1e30f;
  for (int c = 0; c < classes; ++c) {
    float s = m.b2[c];
    for (int j = 0; j < hidden; ++j) s += m.w2[c * hidden + j] * h[j];
    logits[c] = s;
    mx = std::max(mx, s);
  }
  float z = 0;
  for (int c = 0; c < classes; ++c) z += (prob[c] = std::exp(logits[c] - mx));
  for (auto& q : prob) q /= z;
  const float loss = -std::log(std::max(prob[label], 1e-12f));
  auto add = [](std::int64_t& g, float v) { g += std::llround(static_cast<double>(v) * scale); };
  std::int64_t* gw1 = grad;
  std::int64_t* gb1 = gw1 + in * hidden;
  std::int64_t* gw2 = gb1 + hidden;
  std::int64_t* gb2 = gw2 + hidden * classes;
  float dh[hidden] = {};
  for (int c = 0; c < classes; ++c) {
    const float d = prob[c] - (c == label ? 1.0f : 0.0f);
    add(gb2[c], d);
    for (int j = 0; j < hidden; ++j) {
      add(gw2[c * hidden + j], d * h[j]);
      dh[j] += d * m.w2[c * hidden + j];
    }
  }
  for (int j = 0; j < hidden; ++j) {
    if (h[j] <= 0) continue;
    add(gb1[j], dh[j]);
    for (int k = 0; k < in; ++k) add(gw1[j * in + k], dh[j] * x[k]);
  }
  return loss;
}

int predict(const float* p, const float* x) {
  const mlp m(const_cast<float*>(p));
  float h[hidden];
  for (int j = 0; j < hidden; ++j) {
    float s = m.b1[j];
    for (int k = 0; k < in; ++k) s += m.w1[j * in + k] * x[k];
    h[j] = s > 0 ? s : 0;
  }
  int best = 0;
  float best_v = -1e30f;
  for (int c = 0; c < classes; ++c) {
    float s = m.b2[c];
    for (int j = 0; j < hidden; ++j) s += m.w2[c * hidden + j] * h[j];
    if (s > best_v) best_v = s, best = c;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  try {
    const dataset data = load(o.data);
    const std::size_t n_test = data.size() / 6, n_train = data.size() - n_test;  // the last sixth is held out
    // The parameters, initialized the same on every rank, and the momentum: replicated, or with
    // --zero1 this rank's slice of it (a world of one until the group says otherwise).
    std::vector<float> p(params), velocity(o.zero1 ? 0 : params, 0.0f);
    {
      std::mt19937 g(1234);
      std::normal_distribution<float> n(0.0f, 1.0f);
      const mlp m(p.data());
      for (int i = 0; i < in * hidden; ++i) m.w1[i] = n(g) * std::sqrt(2.0f / in);
      for (int i = 0; i < hidden * classes; ++i) m.w2[i] = n(g) * std::sqrt(2.0f / hidden);
    }
    elastic::checkpoint::state st;
    st.add("params", p);
    if (o.zero1) {
      st.add_partitioned("velocity", velocity, params, 0, 1);
    } else {
      st.add("velocity", velocity);
    }
    std::vector<float> gathered(o.zero1 ? params : 0), next_velocity;

    // The store, the group and the settings elastic-run gives (comm/worker.hpp), every one
    // checked. How long a rank waits in a collective for a peer before the group rebuilds
    // without it: a third of --step-timeout (the library orders the watchdog's deadlines after
    // it, so waiting ranks are never killed), so a hang costs the group no more than its kill.
    elastic::comm::worker_options wo;
    wo.run_id = "digits";
    wo.group.rendezvous.heartbeat_interval = 200ms;
    wo.group.rendezvous.heartbeat_timeout = 2s;
    wo.group.rendezvous.last_call_timeout = 500ms;
    wo.collective_timeout_default = 10s;  // its steps take milliseconds
    elastic::comm::gloo_worker worker(wo);
    auto& group = worker.group();

    elastic::training_loop loop(
        worker.loop_options({.dir = o.ckpt, .steps = o.steps, .every_steps = o.every, .keep_last = 2}), st);
    std::vector<std::int64_t> grad(params);
    std::vector<std::uint32_t> order(n_train);
    std::size_t rebuilds = 0;
    bool said_hello = false;
    long slot = worker.env().local_rank.value_or(-1);
    int slow = -1;  // -1: not decided yet; 1: this life is the injected straggler
    for (auto& step : loop) {
      const int rank = group.rank(), world = group.size();
      if (!said_hello && rank == 0) {
        std::printf("training an MLP %d-%d-%d on %s (%zu train / %zu test), %d ranks, from step %llu of %llu\n", in,
                    hidden, classes, data.real ? "the UCI digits" : "SYNTHETIC digits (no --data given)", n_train,
                    n_test, world, static_cast<unsigned long long>(step.index()),
                    static_cast<unsigned long long>(o.steps));
      }
      said_hello = true;
      if (slot < 0) slot = rank;
      if (group.rebuilds() != rebuilds) {
        rebuilds = group.rebuilds();
        const auto& r = group.last_recovery();
        if (rank == 0) {
          std::printf("group rebuilt: round %lld, %d ranks (%s); back to training %.0f ms after noticing\n",
                      static_cast<long long>(r.round), r.world_size, r.cause.c_str(),
                      (r.resynced_ns - r.noticed_ns) / 1e6);
        }
      }
      const std::uint64_t s = step.index();
      // The global batch of step s: a fixed shuffle per epoch, the same on every rank.
      const std::uint64_t first = s * batch, epoch = first / n_train;
      std::mt19937 g(static_cast<std::uint32_t>(epoch + 1));
      for (std::size_t i = 0; i < n_train; ++i) order[i] = static_cast<std::uint32_t>(i);
      std::shuffle(order.begin(), order.end(), g);
      std::fill(grad.begin(), grad.end(), 0);
      float loss = 0;
      for (int j = rank; j < batch; j += world) {
        const std::uint32_t i = order[(first + static_cast<std::uint64_t>(j)) % n_train];
        loss += sample_gradient(p.data(), &data.x[i * in], data.y[i], grad.data());
      }
      const std::jthread killer = o.faults.before_collective(slot, s);
      if (!group.allreduce(std::span<std::int64_t>(grad), elastic::comm::reduce_op::sum)) continue;  // redone
      constexpr float lr = 0.05f, momentum = 0.9f;
      if (o.zero1) {
        // This rank's slice of the update, gathered by a second collective; the state changes
        // only once both succeeded, so a failed step leaves every slice as of this step.
        const std::size_t lo = st.find("velocity")->shard->offset;
        next_velocity.resize(velocity.size());
        std::fill(gathered.begin(), gathered.end(), 0.0f);
        for (std::size_t i = 0; i < velocity.size(); ++i) {
          const std::size_t k = lo + i;
          next_velocity[i] = momentum * velocity[i] + static_cast<float>(static_cast<double>(grad[k]) / scale / batch);
          gathered[k] = p[k] - lr * next_velocity[i];
        }
        if (!group.allreduce(std::span<float>(gathered), elastic::comm::reduce_op::sum)) continue;  // redone
        step.before_update();
        // Copied, not swapped: the state's entries point at these vectors' storage.
        std::copy(next_velocity.begin(), next_velocity.end(), velocity.begin());
        std::copy(gathered.begin(), gathered.end(), p.begin());
      } else {
        step.before_update();
        for (std::size_t k = 0; k < params; ++k) {
          velocity[k] = momentum * velocity[k] + static_cast<float>(static_cast<double>(grad[k]) / scale / batch);
          p[k] -= lr * velocity[k];
        }
      }
      if (rank == 0 && ((s + 1) % 100 == 0 || s + 1 == o.steps)) {
        std::size_t right = 0;
        for (std::size_t i = n_train; i < data.size(); ++i) right += predict(p.data(), &data.x[i * in]) == data.y[i];
        std::printf("step %4llu/%llu  ranks %d  rank-0 batch loss %.3f  test accuracy %.1f%%\n",
                    static_cast<unsigned long long>(s + 1), static_cast<unsigned long long>(o.steps), world,
                    loss / static_cast<float>((batch + world - 1 - rank) / world),
                    100.0 * static_cast<double>(right) / static_cast<double>(n_test));
      }
      std::fflush(stdout);
      if (slot == o.slow_rank && slow < 0) slow = o.faults.first_time("slow", slot) ? 1 : 0;
      const double pace = slow == 1 ? o.slow_factor : 1.0;  // a straggler's first life
      if (o.step_sleep_ms > 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(static_cast<long>(static_cast<double>(o.step_sleep_ms) * 1e3 * pace)));
      }
    }
    if (group.rank() == 0) {
      std::printf("%s at step %llu: weights crc32c %08x\n",
                  loop.reason() != elastic::loop_reason::preempted ? "finished"
                  : loop.final_checkpoint_written() ? "preempted (checkpoint written)"
                                                    : "preempted (no final checkpoint: the newest committed step stands)",
                  static_cast<unsigned long long>(loop.completed_steps()),
                  elastic::crc32c(std::as_bytes(std::span(p))));
    }
    return loop.exit_code();
  } catch (const elastic::error& e) {
    std::fprintf(stderr, "digits_train: %s\n", e.what());
    return 1;
  }
}
