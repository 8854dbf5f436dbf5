// The LibTorch adapters (elastic/torch.hpp) with real libtorch modules and optimizers, real
// checkpoints on disk and real Gloo groups of threads over an shm:// store: a module and an
// optimizer (with the state libtorch creates lazily) restored bit for bit, gradients reduced as
// DDP does, the fixed-order reduction whose bits do not depend on the world size, and the data
// position across world sizes.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <elastic/checkpoint.hpp>
#include <elastic/comm/gloo_group.hpp>
#include <elastic/rendezvous/shm_store.hpp>
#include <elastic/torch.hpp>

#include "support/catch.hpp"
#include "support/errors.hpp"
#include "support/process.hpp"
#include "support/threads.hpp"

using elastic::errc;
using elastic::test::error_of;
namespace ck = elastic::checkpoint;
namespace comm = elastic::comm;
namespace lt = elastic::libtorch;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct net : torch::nn::Module {
  net() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(bn(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

/// A net initialised from `seed`: libtorch's generator is one per process, so threads (ranks here)
/// take turns seeding it and drawing from it.
std::unique_ptr<net> seeded_net(std::uint64_t seed) {
  static std::mutex m;
  std::lock_guard lk(m);
  torch::manual_seed(seed);
  return std::make_unique<net>();
}

/// A fixed synthetic batch: `n` samples of 6 features, 3 classes.
std::pair<torch::Tensor, torch::Tensor> data(std::int64_t n, std::uint64_t seed = 3) {
  torch::manual_seed(seed);
  return {torch::randn({n, 6}), torch::randint(0, 3, {n})};
}

void train_step(net& m, torch::optim::Optimizer& opt, const torch::Tensor& x, const torch::Tensor& y) {
  opt.zero_grad();
  torch::nn::functional::cross_entropy(m.forward(x), y).backward();
  opt.step();
}

/// Every parameter and buffer, concatenated as bytes: equal means the same bits.
std::vector<std::uint8_t> bits(const torch::nn::Module& m) {
  std::vector<std::uint8_t> out;
  auto add = [&](const torch::Tensor& t) {
    const auto c = t.contiguous();
    const auto* p = static_cast<const std::uint8_t*>(c.data_ptr());
    out.insert(out.end(), p, p + c.numel() * c.element_size());
  };
  for (const auto& p : m.parameters()) add(p);
  for (const auto& b : m.buffers()) add(b);
  return out;
}

ck::checkpointer_options opts(const std::string& dir) {
  ck::checkpointer_options o;
  o.dir = dir;
  o.rank = 0;
  o.world_size = 1;
  o.run_id = "torch-test";
  o.events = elastic::event_log{};
  return o;
}

/// Trains `m` with `opt` for steps [from, to) on the fixed batch.
void train(net& m, torch::optim::Optimizer& opt, int from, int to) {
  const auto [x, y] = data(32);
  for (int s = from; s < to; ++s) train_step(m, opt, x, y);
}

/// A state of `m` and `opt`, as a trainer registers them.
ck::state registered(net& m, torch::optim::Optimizer& opt) {
  ck::state st;
  lt::add_module(st, "model", m);
  lt::add_optimizer(st, "optim", opt);
  return st;
}

/// The optimizer case: `make(model)` builds the optimizer; a run of 6 steps against one that is
/// checkpointed after 3, restored into a fresh model and optimizer, and trained 3 more.
template <class Make>
void resumes_bit_for_bit(Make make) {
  torch::manual_seed(1);
  net a;
  auto opt_a = make(a);
  train(a, *opt_a, 0, 6);

  elastic::test::temp_dir dir;
  {
    torch::manual_seed(1);
    net b;
    auto opt_b = make(b);
    auto st = registered(b, *opt_b);
    ck::checkpointer c(st, opts(dir.path()));
    train(b, *opt_b, 0, 3);
    c.snapshot(3);
    c.wait_durable();
  }
  torch::manual_seed(99);  // other initial weights: the restore must overwrite them all
  net r;
  auto opt_r = make(r);
  auto st = registered(r, *opt_r);
  ck::checkpointer c(st, opts(dir.path()));
  const auto m = c.restore();
  REQUIRE(m);
  CHECK(m->step == 3);
  CHECK_FALSE(opt_r->state().empty());  // the lazily created state came back
  train(r, *opt_r, 3, 6);
  CHECK(bits(r) == bits(a));
}

// Catch2 v2's assertions are not thread-safe: inside a rank's thread they take this lock, and a
// failed requirement ends the thread's body with an exception on_threads collects (Catch's own
// would leave the thread and end the process).
std::mutex& catch_mu() {
  static std::mutex m;
  return m;
}
#define RANK_CHECK(...)                    \
  do {                                     \
    std::lock_guard lk_(catch_mu());       \
    CHECK(__VA_ARGS__);                    \
  } while (0)
#define RANK_CHECK_FALSE(...)              \
  do {                                     \
    std::lock_guard lk_(catch_mu());       \
    CHECK_FALSE(__VA_ARGS__);              \
  } while (0)
#define RANK_REQUIRE(...)                                                         \
  do {                                                                            \
    if (!(__VA_ARGS__)) throw std::runtime_error("requirement failed: " #__VA_ARGS__); \
  } while (0)

/// error_of for a rank's thread: what `f` threw, or an exception on_threads collects.
template <class F>
elastic::error rank_error_of(F&& f) {
  if (auto e = elastic::test::caught(std::forward<F>(f))) return *e;
  throw std::runtime_error("expected an elastic::error");
}

using group_body = std::function<void(comm::gloo_group&)>;

/// `n` ranks, each a thread with its own gloo_group over one shm:// store, running `body`.
void on_group(int n, const group_body& body) {
  const std::string store_name = elastic::test::unique_name("torch");
  elastic::rendezvous::shm_store store(store_name);
  comm::group_options go;
  go.rendezvous.run_id = "torch-test";
  go.rendezvous.min_ranks = n;
  go.rendezvous.max_ranks = n;
  go.events = elastic::event_log{};
  const auto errors = elastic::test::on_threads(n, [&](int) {
    comm::gloo_group g(store, go, comm::gloo_factory(std::chrono::seconds(20)));
    g.join();
    body(g);
    g.barrier();
  });
  elastic::rendezvous::shm_store::remove(store_name);
  for (const auto& e : errors) FAIL_CHECK(e);
}

}  // namespace

TEST_CASE("a module and SGD with momentum (created lazily) resume bit for bit", "[torch]") {
  resumes_bit_for_bit([](net& m) {
    return std::make_unique<torch::optim::SGD>(m.parameters(),
                                               torch::optim::SGDOptions(0.05).momentum(0.9).dampening(0.1));
  });
}

TEST_CASE("Adam's moments and step count resume bit for bit", "[torch]") {
  resumes_bit_for_bit([](net& m) {
    return std::make_unique<torch::optim::Adam>(m.parameters(), torch::optim::AdamOptions(0.01).weight_decay(0.001));
  });
}

TEST_CASE("a learning rate changed during the run comes back with the optimizer", "[torch]") {
  torch::manual_seed(1);
  net m;
  torch::optim::SGD opt(m.parameters(), torch::optim::SGDOptions(0.1));
  ck::state st;
  lt::add_optimizer(st, "optim", opt);
  const auto* e = st.find("optim");
  REQUIRE(e);
  static_cast<torch::optim::SGDOptions&>(opt.param_groups()[0].options()).lr(0.001);  // a schedule's step
  std::vector<std::byte> saved;
  e->save(saved);
  static_cast<torch::optim::SGDOptions&>(opt.param_groups()[0].options()).lr(0.5);
  e->load(saved);
  CHECK(opt.param_groups()[0].options().get_lr() == 0.001);
}

TEST_CASE("restoring a snapshot from before the first step drops the momentum created since", "[torch]") {
  torch::manual_seed(1);
  net m;
  torch::optim::SGD opt(m.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  ck::state st;
  lt::add_optimizer(st, "optim", opt);
  std::vector<std::byte> before;
  st.find("optim")->save(before);
  train(m, opt, 0, 2);
  REQUIRE_FALSE(opt.state().empty());
  st.find("optim")->load(before);
  CHECK(opt.state().empty());
}

TEST_CASE("an optimizer snapshot of another shape or corrupt bytes is refused and changes nothing", "[torch]") {
  torch::manual_seed(1);
  net m;
  torch::optim::SGD opt(m.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  train(m, opt, 0, 1);
  ck::state st;
  lt::add_optimizer(st, "optim", opt);
  std::vector<std::byte> good;
  st.find("optim")->save(good);

  torch::nn::Linear small(6, 2);  // 2 parameters, not 6
  torch::optim::SGD other(small->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  ck::state st2;
  lt::add_optimizer(st2, "other", other);
  const auto e = error_of([&] { st2.find("other")->load(good); });
  CHECK(e.code() == errc::mismatch);
  CHECK(contains(e.what(), "param group 0 held 6 parameters"));

  auto bad = good;
  bad.resize(bad.size() / 2);
  const auto size_before = opt.state().size();
  const auto c = error_of([&] { st.find("optim")->load(bad); });
  CHECK(c.code() == errc::corrupt);
  CHECK(opt.state().size() == size_before);
  const std::vector<std::byte> junk(100, std::byte{0x5a});
  CHECK(error_of([&] { st.find("optim")->load(junk); }).code() == errc::corrupt);
}

TEST_CASE("tensors the state cannot point at are refused with their name", "[torch]") {
  ck::state st;
  const auto t = torch::zeros({4, 5}).t();  // a transposed view: not contiguous
  auto e = error_of([&] { lt::add_tensor(st, "w", t); });
  CHECK(e.code() == errc::invalid_argument);
  CHECK(contains(e.what(), "'w'"));
  CHECK(contains(e.what(), "contiguous"));
  e = error_of([&] { lt::add_tensor(st, "c", torch::zeros({3}, torch::kComplexFloat)); });
  CHECK(e.code() == errc::not_supported);
  e = error_of([&] { lt::add_tensor(st, "u", torch::Tensor()); });
  CHECK(e.code() == errc::invalid_argument);
  net m;
  CHECK(lt::add_module(st, "m", m) == 6 + 3);  // 6 parameters; running mean, var and batch count
  CHECK(st.find("m/param/fc1.weight")->shape == std::vector<std::uint64_t>{16, 6});
  CHECK(st.find("m/buffer/bn.num_batches_tracked")->type == ck::dtype::i64);
}

TEST_CASE("gradient_reducer averages the ranks' gradients as one process would", "[torch]") {
  const auto [x, y] = data(48);
  auto owned = seeded_net(5);
  auto& whole = *owned;
  whole.eval();  // batch statistics would differ per share; running ones do not
  torch::nn::functional::cross_entropy(whole.forward(x), y).backward();
  std::vector<torch::Tensor> expected;
  for (const auto& p : whole.parameters()) expected.push_back(p.grad().clone());

  std::vector<std::vector<std::uint8_t>> got(4);
  on_group(4, [&](comm::gloo_group& g) {
    auto owned = seeded_net(5);
    auto& m = *owned;
    m.eval();
    lt::gradient_reducer grads(g, m, {.bucket_bytes = 256});  // several buckets
    RANK_CHECK(grads.buckets() > 1);
    const auto share = torch::arange(g.rank(), 48, 4);
    // The mean over 12 samples; the world's mean of those is the mean over all 48.
    torch::nn::functional::cross_entropy(m.forward(x.index_select(0, share)), y.index_select(0, share)).backward();
    RANK_REQUIRE(grads.allreduce());
    std::size_t i = 0;
    std::vector<std::uint8_t> mine;
    for (const auto& p : m.parameters()) {
      RANK_CHECK(torch::allclose(p.grad(), expected[i++], 1e-5, 1e-6));
      const auto* b = static_cast<const std::uint8_t*>(p.grad().data_ptr());
      mine.insert(mine.end(), b, b + p.grad().numel() * 4);
    }
    got[static_cast<std::size_t>(g.rank())] = mine;
  });
  for (const auto& r : got) CHECK(r == got[0]);  // every rank holds the same bits
}

TEST_CASE("gradient_reducer: a gradient some ranks lack counts as zeros and one all lack stays undefined", "[torch]") {
  on_group(3, [](comm::gloo_group& g) {
    auto a = torch::ones({4}, torch::requires_grad());
    auto b = torch::ones({2}, torch::requires_grad());
    auto unused = torch::ones({3}, torch::requires_grad());
    lt::gradient_reducer grads(g, std::vector<torch::Tensor>{a, b, unused});
    (a * 3).sum().backward();
    if (g.rank() == 0) (b * 6).sum().backward();  // only rank 0 takes this branch
    RANK_REQUIRE(grads.allreduce());
    RANK_CHECK(torch::equal(a.grad(), torch::full({4}, 3.0f)));
    RANK_CHECK(torch::equal(b.grad(), torch::full({2}, 2.0f)));  // (6 + 0 + 0) / 3
    RANK_CHECK_FALSE(unused.grad().defined());
  });
}

TEST_CASE("gradient_reducer refuses a module moved after it was made, and integer parameters", "[torch]") {
  on_group(1, [](comm::gloo_group& g) {
    net m;
    lt::gradient_reducer grads(g, m);
    m.to(torch::kDouble);  // new memory for every parameter
    for (auto& p : m.parameters()) p.mutable_grad() = torch::zeros_like(p);
    const auto e = rank_error_of([&] { (void)grads.allreduce(); });
    RANK_CHECK(e.code() == errc::invalid_argument);
    RANK_CHECK(contains(e.what(), "no longer where it was"));
    const auto ints = torch::zeros({2}, torch::kLong);
    RANK_CHECK(rank_error_of([&] { lt::gradient_reducer r(g, std::vector<torch::Tensor>{ints}); }).code() ==
          errc::invalid_argument);
  });
}

TEST_CASE("fixed_order_reducer gives the same bits with 4, 3, 2 and 1 ranks", "[torch]") {
  // 8 micro-batches of a 64-sample global batch; each rank computes the ones the world gives it.
  const auto [x, y] = data(64, 11);
  auto run = [&](int world) {
    std::vector<std::uint8_t> out;
    on_group(world, [&](comm::gloo_group& g) {
      auto owned = seeded_net(7);
      auto& m = *owned;
      m.eval();
      torch::optim::SGD opt(m.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      lt::fixed_order_reducer grads(g, m, 8);
      for (int step = 0; step < 3; ++step) {
        for (const auto mb : grads.micro_batches()) {
          opt.zero_grad();
          const auto rows = torch::arange(static_cast<std::int64_t>(mb) * 8, static_cast<std::int64_t>(mb) * 8 + 8);
          torch::nn::functional::cross_entropy(m.forward(x.index_select(0, rows)), y.index_select(0, rows)).backward();
          grads.keep(mb);
        }
        RANK_REQUIRE(grads.allreduce());
        opt.step();
      }
      if (g.rank() == 0) out = bits(m);
    });
    return out;
  };
  torch::set_num_threads(1);
  const auto one = run(1);
  REQUIRE_FALSE(one.empty());
  CHECK(run(4) == one);
  CHECK(run(3) == one);
  CHECK(run(2) == one);
}

TEST_CASE("fixed_order_reducer refuses micro-batches that are not this rank's", "[torch]") {
  on_group(2, [](comm::gloo_group& g) {
    auto w = torch::ones({2}, torch::requires_grad());
    lt::fixed_order_reducer grads(g, std::vector<torch::Tensor>{w}, 4);
    const auto mine = grads.micro_batches();
    RANK_CHECK(mine == std::vector<std::size_t>{static_cast<std::size_t>(g.rank()), static_cast<std::size_t>(g.rank()) + 2});
    (w * 2).sum().backward();
    grads.keep(mine[0]);  // one of its two: the other is missing
    const auto e = rank_error_of([&] { (void)grads.allreduce(); });
    RANK_CHECK(e.code() == errc::invalid_argument);
    RANK_CHECK(contains(e.what(), "did not keep micro-batch"));
    RANK_CHECK(rank_error_of([&] { grads.keep(4); }).code() == errc::invalid_argument);
  });
}

TEST_CASE("a module moved after add_module is refused at the next snapshot, naming the tensor", "[torch]") {
  auto owned = seeded_net(3);
  auto& m = *owned;
  elastic::test::temp_dir dir;
  ck::state st;
  lt::add_module(st, "model", m);
  ck::checkpointer c(st, opts(dir.path()));
  c.snapshot(1);  // in place: fine
  c.wait_durable();
  m.to(torch::kDouble);  // every parameter and buffer gets new memory
  const auto e = error_of([&] { c.snapshot(2); });
  CHECK(e.code() == errc::invalid_argument);
  CHECK(contains(e.what(), "'model/param/fc1.weight'"));
  CHECK(contains(e.what(), "register the module after moving it"));
}
