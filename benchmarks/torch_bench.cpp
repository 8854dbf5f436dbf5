// What the LibTorch adapters (elastic/torch.hpp) cost a training step, against the bare libtorch
// loop measured in the same run: the MLP of examples/torch_mnist.cpp (784-64-10, batch 64, one
// CPU thread), each variant timed over the same number of steps.
//   BM_step/bare            zero_grad, forward, backward, SGD step: the limit
//   BM_step/ddp_world1      + gradient_reducer over a Gloo group of one, data_position, and a
//                           training_loop checkpointing every 25 steps (async, to --dir)
//   BM_step/fixed8_world1   the same with fixed_order_reducer, 8 micro-batches of 8
//   BM_reduce/ddp_ranks2, BM_reduce/fixed8_ranks2
//                           2 ranks (threads, one Gloo group each): the gradients' reduction
//                           alone, per step, DDP-style against fixed-order (8x the bytes)
// Counters: step_us (per step), vs_bare (the ratio to the bare step, same run), vs_ddp (the
// fixed order's reduction against the DDP-style one, same run).
#include <chrono>
#include <cstdint>
#include <latch>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <elastic/checkpoint.hpp>
#include <elastic/comm/gloo_group.hpp>
#include <elastic/rendezvous/shm_store.hpp>
#include <elastic/torch.hpp>

#include "bench_common.hpp"

namespace {

constexpr int steps = 300;
constexpr std::int64_t batch = 64, samples = 4096;
double bare_step_us = 0;  // measured first, in this run
double ddp_reduce_us = 0;  // the DDP-style reduction on 2 ranks, the fixed order's peer
elastic::bench::scratch_dir* scratch = nullptr;

struct mlp : torch::nn::Module {
  torch::nn::Linear fc1{register_module("fc1", torch::nn::Linear(784, 64))};
  torch::nn::Linear fc2{register_module("fc2", torch::nn::Linear(64, 10))};
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::relu(fc1(x))); }
};

struct dataset {
  torch::Tensor x = torch::rand({samples, 784}), y = torch::randint(0, 10, {samples});
};

std::unique_ptr<mlp> seeded_mlp() {
  static std::mutex m;
  std::lock_guard lk(m);
  torch::manual_seed(1);
  return std::make_unique<mlp>();
}

float loss_on(mlp& m, const dataset& d, const std::vector<std::uint64_t>& rows) {
  std::vector<std::int64_t> r(rows.begin(), rows.end());
  const auto idx = torch::tensor(r);
  const auto l = torch::nn::functional::cross_entropy(m.forward(d.x.index_select(0, idx)), d.y.index_select(0, idx));
  l.backward();
  return l.item<float>();
}

/// Gloo groups of `n` ranks on threads over one shm:// store, each running `body(group)`.
template <class Body>
void on_group(int n, Body body) {
  const std::string name = "torch-bench-" + std::to_string(::getpid());
  elastic::rendezvous::shm_store store(name);
  elastic::comm::group_options go;
  go.rendezvous.run_id = "torch-bench";
  go.rendezvous.min_ranks = go.rendezvous.max_ranks = n;
  go.events = elastic::event_log{};
  std::vector<std::jthread> ts;
  for (int i = 0; i < n; ++i) {
    ts.emplace_back([&] {
      elastic::comm::gloo_group g(store, go, elastic::comm::gloo_factory(std::chrono::seconds(30), "127.0.0.1"));
      g.join();
      body(g);
      (void)g.barrier();
    });
  }
  ts.clear();
  elastic::rendezvous::shm_store::remove(name);
}

/// Sets the iteration's time and step_us; `base` (0: none yet) gives the ratio counter `name`.
void report(benchmark::State& state, double seconds, double base, const char* name) {
  const double us = seconds * 1e6 / steps;
  state.SetIterationTime(seconds);
  state.counters["step_us"] = us;
  if (base > 0) state.counters[name] = us / base;
}

void BM_step_bare(benchmark::State& state) {
  torch::set_num_threads(1);
  const dataset d;
  auto m = seeded_mlp();
  torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  elastic::data_position pos({.samples = samples, .global_batch = batch, .seed = 7});
  for (auto _ : state) {
    const auto t0 = elastic::bench::clock_type::now();
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      loss_on(*m, d, pos.batch());
      opt.step();
      pos.advance();
    }
    const double t = elastic::bench::since(t0);
    bare_step_us = t * 1e6 / steps;
    report(state, t, bare_step_us, "vs_bare");
  }
}

/// The adapter's step in a world of one, with a training_loop checkpointing every 25 steps.
template <bool fixed>
void BM_step_adapter(benchmark::State& state) {
  torch::set_num_threads(1);
  const dataset d;
  for (auto _ : state) {
    double t = 0;
    on_group(1, [&](elastic::comm::gloo_group& g) {
      auto m = seeded_mlp();
      torch::optim::SGD opt(m->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
      elastic::checkpoint::state st;
      elastic::libtorch::add_module(st, "model", *m);
      elastic::libtorch::add_optimizer(st, "optim", opt);
      elastic::data_position pos({.samples = samples, .global_batch = batch, .seed = 7});
      pos.add_to(st);
      const auto dir = scratch->fresh(fixed ? "fixed" : "ddp");
      elastic::training_loop loop({.dir = dir, .steps = steps, .every_steps = 25, .handle_signals = false,
                                   .rank = 0, .world_size = 1, .run_id = "torch-bench",
                                   .events = elastic::event_log{}, .group = &g},
                                  st);
      elastic::libtorch::gradient_reducer ddp(g, *m);
      elastic::libtorch::fixed_order_reducer fo(g, *m, 8);
      const auto t0 = elastic::bench::clock_type::now();
      for (auto& step : loop) {
        if constexpr (fixed) {
          for (const auto mb : fo.micro_batches()) {
            opt.zero_grad();
            loss_on(*m, d, pos.micro_batch(mb, 8));
            fo.keep(mb);
          }
          if (!fo.allreduce()) continue;
        } else {
          opt.zero_grad();
          loss_on(*m, d, pos.batch());
          if (!ddp.allreduce()) continue;
        }
        step.before_update();
        opt.step();
        pos.advance();
      }
      t = elastic::bench::since(t0);
    });
    report(state, t, bare_step_us, "vs_bare");
  }
}

/// The reduction alone on 2 ranks, per step: DDP-style (the gradients once) or fixed order (8
/// micro-batches' worth).
template <bool fixed>
void BM_reduce_ranks2(benchmark::State& state) {
  torch::set_num_threads(1);
  const dataset d;
  for (auto _ : state) {
    double t = 0;
    on_group(2, [&](elastic::comm::gloo_group& g) {
      auto m = seeded_mlp();
      elastic::libtorch::gradient_reducer ddp(g, *m);
      elastic::libtorch::fixed_order_reducer fo(g, *m, 8);
      elastic::data_position pos({.samples = samples, .global_batch = batch, .seed = 7});
      loss_on(*m, d, pos.batch());  // gradients to reduce
      (void)g.barrier();
      const auto t0 = elastic::bench::clock_type::now();
      for (int s = 0; s < steps; ++s) {
        if constexpr (fixed) {
          for (const auto mb : fo.micro_batches()) fo.keep(mb);
          (void)fo.allreduce();
        } else {
          (void)ddp.allreduce();
        }
      }
      if (g.rank() == 0) t = elastic::bench::since(t0);
    });
    if (!fixed) ddp_reduce_us = t * 1e6 / steps;
    report(state, t, ddp_reduce_us, "vs_ddp");
  }
}

}  // namespace

BENCHMARK(BM_step_bare)->Name("BM_step/bare")->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_step_adapter<false>)->Name("BM_step/ddp_world1")->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_step_adapter<true>)->Name("BM_step/fixed8_world1")->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_reduce_ranks2<false>)->Name("BM_reduce/ddp_ranks2")->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_reduce_ranks2<true>)->Name("BM_reduce/fixed8_ranks2")->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  elastic::bench::scratch_dir dir(argc, argv, "torch_bench");
  scratch = &dir;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
