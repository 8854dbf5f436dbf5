// A libtorch trainer made elastic: an MLP (784-64-10) on MNIST-format data, under elastic-run.
//
//   elastic-run --nproc-per-node 4 --min-ranks 2 -- torch_mnist --data mnist --ckpt ckpt
//
// The real MNIST files (train-images-idx3-ubyte, ...) are read from --data when they are there;
// otherwise files of the same format with synthetic digits are written there first (and the
// program says so). What makes it elastic, each marked "elastic:" below: the worker from
// elastic-run's environment, the module, the optimizer (its momentum, which libtorch creates at
// the first step) and the data position in the checkpoint state, and the gradients reduced over
// the group in a fixed order of micro-batches, so that a run disturbed by kills, hangs,
// preemptions and a changing world ends with the very weights of an undisturbed one.
//
// Fault injection for the demo: see injected_faults.hpp (--kill-rank R --kill-at S, ...).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include <elastic/checkpoint.hpp>
#include <elastic/comm/gloo_worker.hpp>
#include <elastic/crc32c.hpp>
#include <elastic/torch.hpp>

#include "injected_faults.hpp"

namespace {

struct options {
  std::string data = "mnist", ckpt = "mnist-ckpt";
  std::uint64_t steps = 300, every = 25, global_batch = 64, micro_batches = 8;
  long step_sleep_ms = 0;
  examples::injected_faults faults;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "torch_mnist: %s\nusage: torch_mnist [--data DIR] [--ckpt DIR] [--steps N] [--every N] "
               "[--global-batch N] [--micro-batches N] [--step-sleep-ms MS] %s\n",
               why.c_str(), examples::injected_faults::usage);
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
      if (end == v.c_str() || *end != '\0' || x < 0) usage("'" + v + "' is not a count (" + a + ")");
      return x;
    };
    if (a == "--data") o.data = v;
    else if (a == "--ckpt") o.ckpt = v;
    else if (a == "--steps") o.steps = static_cast<std::uint64_t>(n());
    else if (a == "--every") o.every = static_cast<std::uint64_t>(n());
    else if (a == "--global-batch") o.global_batch = static_cast<std::uint64_t>(n());
    else if (a == "--micro-batches") o.micro_batches = static_cast<std::uint64_t>(n());
    else if (a == "--step-sleep-ms") o.step_sleep_ms = static_cast<long>(n());
    else if (!o.faults.take(a, v, [&] { return static_cast<long>(n()); })) usage("unknown option " + a);
  }
  if (o.micro_batches == 0 || o.micro_batches > o.global_batch) usage("--micro-batches must be 1 .. --global-batch");
  if (o.faults.marks.empty()) o.faults.marks = o.ckpt;
  return o;
}

/// Writes MNIST-format files (IDX, big-endian) of synthetic digits into `dir` unless the real
/// ones are there: ten noisy stroke patterns, 28x28. Every worker writes the same bytes, each
/// file renamed into place whole, so workers starting together do not trip over each other.
bool ensure_data(const std::string& dir) {
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(dir) / "train-images-idx3-ubyte")) return false;
  fs::create_directories(dir);
  std::mt19937 g(2024);
  std::vector<std::uint8_t> proto(10 * 28 * 28, 0);
  for (int c = 0; c < 10; ++c) {
    for (int k = 0; k < 6; ++k) {  // six strokes per class
      int r = 4 + static_cast<int>(g() % 20), col = 4 + static_cast<int>(g() % 20);
      const int dr = static_cast<int>(g() % 3) - 1, dc = static_cast<int>(g() % 3) - 1;
      for (int t = 0; t < 12; ++t, r = std::clamp(r + dr, 2, 25), col = std::clamp(col + dc, 2, 25)) {
        for (int a = -1; a <= 1; ++a)
          for (int b = -1; b <= 1; ++b) proto[static_cast<std::size_t>(c * 784 + (r + a) * 28 + col + b)] = 255;
      }
    }
  }
  auto write = [&](const std::string& name, int count, bool images) {
    std::vector<std::uint8_t> bytes;
    auto be32 = [&](std::uint32_t x) {
      for (int s = 24; s >= 0; s -= 8) bytes.push_back(static_cast<std::uint8_t>(x >> s));
    };
    be32(images ? 2051 : 2049);
    be32(static_cast<std::uint32_t>(count));
    if (images) be32(28), be32(28);
    for (int i = 0; i < count; ++i) {
      const int c = i % 10;
      if (!images) {
        bytes.push_back(static_cast<std::uint8_t>(c));
        continue;
      }
      // Each sample its class's pattern shifted by up to 4 pixels, faded, and noisy.
      const int dr = static_cast<int>(g() % 9) - 4, dc = static_cast<int>(g() % 9) - 4;
      const int ink = 96 + static_cast<int>(g() % 160);
      for (int r = 0; r < 28; ++r) {
        for (int col = 0; col < 28; ++col) {
          const int sr = r - dr, sc = col - dc;
          const bool on = sr >= 0 && sr < 28 && sc >= 0 && sc < 28 && proto[static_cast<std::size_t>(c * 784 + sr * 28 + sc)];
          const int noise = static_cast<int>(g() % 161) - 80;
          bytes.push_back(static_cast<std::uint8_t>(std::clamp((on ? ink : 0) + noise, 0, 255)));
        }
      }
    }
    const auto tmp = fs::path(dir) / (name + ".tmp-" + std::to_string(::getpid()));
    std::ofstream(tmp, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                               static_cast<std::streamsize>(bytes.size()));
    fs::rename(tmp, fs::path(dir) / name);
  };
  // Labels first, the train images last: their presence says the set is whole.
  write("train-labels-idx1-ubyte", 60000, false);  // the sizes libtorch's reader insists on
  write("t10k-labels-idx1-ubyte", 10000, false);
  write("t10k-images-idx3-ubyte", 10000, true);
  write("train-images-idx3-ubyte", 60000, true);
  return true;
}

struct mlp : torch::nn::Module {
  torch::nn::Linear fc1{register_module("fc1", torch::nn::Linear(784, 64))};
  torch::nn::Linear fc2{register_module("fc2", torch::nn::Linear(64, 10))};
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2(torch::relu(fc1(((x - 0.1307) / 0.3081).view({-1, 784}))));
  }
};

std::uint32_t weights_crc(const torch::nn::Module& m) {
  std::vector<std::byte> all;
  for (const auto& p : m.parameters()) {
    const auto* b = static_cast<const std::byte*>(p.data_ptr());
    all.insert(all.end(), b, b + p.numel() * p.element_size());
  }
  return elastic::crc32c(all);
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  try {
    torch::set_num_threads(1);  // the same bits for a micro-batch on every rank (see fixed_order.hpp)
    const bool synthetic = ensure_data(o.data);
    auto train = torch::data::datasets::MNIST(o.data, torch::data::datasets::MNIST::Mode::kTrain);
    auto test = torch::data::datasets::MNIST(o.data, torch::data::datasets::MNIST::Mode::kTest);

    torch::manual_seed(1234);  // the same initial weights on every rank
    mlp model;
    torch::optim::SGD opt(model.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

    // elastic: the worker elastic-run started (store, group, settings), the state to checkpoint,
    // where in the data the run is, and the gradients' reduction.
    elastic::comm::gloo_worker worker({.run_id = "mnist"});
    auto& group = worker.group();
    elastic::checkpoint::state st;
    elastic::libtorch::add_module(st, "model", model);
    elastic::libtorch::add_optimizer(st, "optim", opt);
    elastic::data_position data({.samples = *train.size(), .global_batch = o.global_batch, .seed = 7});
    data.add_to(st);
    elastic::libtorch::fixed_order_reducer grads(group, model, o.micro_batches);
    elastic::training_loop loop(worker.loop_options({.dir = o.ckpt, .steps = o.steps, .every_steps = o.every}), st);

    long slot = worker.env().local_rank.value_or(-1);
    std::size_t rebuilds = 0;
    for (auto& step : loop) {
      if (slot < 0) slot = group.rank();
      if (group.rank() == 0 && group.rebuilds() != rebuilds) {
        std::printf("%d ranks from step %llu (%s data, epoch %llu)\n", group.size(),
                    static_cast<unsigned long long>(step.index()), synthetic ? "SYNTHETIC" : "MNIST",
                    static_cast<unsigned long long>(data.epoch()));
      }
      rebuilds = group.rebuilds();
      float loss = 0;
      for (const auto m : grads.micro_batches()) {  // elastic: this rank's share of the global batch
        const auto batch = elastic::libtorch::batch_of(train, data.micro_batch(m, o.micro_batches));
        opt.zero_grad();
        const auto l = torch::nn::functional::cross_entropy(model.forward(batch.data), batch.target);
        l.backward();
        loss += l.item<float>();
        grads.keep(m);
      }
      const std::jthread killer = o.faults.before_collective(slot, step.index());
      if (!grads.allreduce()) continue;  // elastic: a peer failed; the loop rebuilds and redoes the step
      step.before_update();
      opt.step();
      data.advance();
      if (group.rank() == 0 && ((step.index() + 1) % 100 == 0 || step.index() + 1 == o.steps)) {
        torch::NoGradGuard no_grad;
        const auto right = model.forward(test.images()).argmax(1).eq(test.targets()).sum().item<std::int64_t>();
        std::printf("step %4llu/%llu  ranks %d  loss %.3f  test accuracy %.1f%%\n",
                    static_cast<unsigned long long>(step.index() + 1), static_cast<unsigned long long>(o.steps),
                    group.size(), loss, 100.0 * static_cast<double>(right) / static_cast<double>(*test.size()));
      }
      std::fflush(stdout);
      if (o.step_sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o.step_sleep_ms));
    }
    if (group.rank() == 0) {
      std::printf("%s at step %llu: weights crc32c %08x\n",
                  loop.reason() != elastic::loop_reason::preempted ? "finished"
                  : loop.final_checkpoint_written() ? "preempted (checkpoint written)"
                                                    : "preempted (no final checkpoint: the newest committed step stands)",
                  static_cast<unsigned long long>(loop.completed_steps()), weights_crc(model));
    }
    return loop.exit_code();
  } catch (const elastic::error& e) {
    std::fprintf(stderr, "torch_mnist: %s\n", e.what());
    return 1;
  } catch (const c10::Error& e) {  // libtorch's own (the dataset's reader, say)
    std::fprintf(stderr, "torch_mnist: %s\n", e.what_without_backtrace());
    return 1;
  }
}
