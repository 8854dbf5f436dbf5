// A worker as elastic-run starts it, set up in one line: the store its environment names, the
// elastic group over it, and the training loop's options with the group attached.
//
//   elastic::comm::worker<elastic::comm::gloo_communicator> w({.run_id = "mnist"}, elastic::comm::gloo_factory);
//   elastic::training_loop loop(w.loop_options({.dir = "ckpt", .steps = 1000, .every_steps = 50}), st);
//   ... w.group().rank(), w.group().size(), w.group().allreduce(...) ...
//
// (comm/gloo_worker.hpp has the Gloo one: elastic::comm::gloo_worker w;) What it reads, each value
// checked (a malformed one is an error naming it, never a silent default): ELASTIC_RDZV (the store
// URL; unset: a world of one with a private store nothing else opens), ELASTIC_MIN_RANKS and
// ELASTIC_MAX_RANKS through the rendezvous, ELASTIC_RUN_ID (else the options' run_id), and
// ELASTIC_STEP_TIMEOUT, from which the collective timeout is derived (a third of it, at least
// 200 ms: a hung peer costs the group no more than its kill), 30 min without one (see
// worker_options::collective_timeout_default).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include <elastic/checkpoint/loop_options.hpp>
#include <elastic/comm/elastic_group.hpp>
#include <elastic/comm/group_options.hpp>
#include <elastic/error.hpp>
#include <elastic/internal/env.hpp>
#include <elastic/rendezvous/detail/resolve_options.hpp>
#include <elastic/rendezvous/open_store.hpp>
#include <elastic/rendezvous/shm_store.hpp>

namespace elastic::inline v1::comm {

/// The worker environment (docs/design.md), every value checked.
struct worker_env {
  std::optional<std::string> rdzv;  ///< ELASTIC_RDZV; none: a world of one with a store of its own
  int min_ranks = 1, max_ranks = 1;  ///< ELASTIC_MIN_RANKS/MAX_RANKS (or _NODES), in ranks
  long restart_count = 0;            ///< ELASTIC_RESTART_COUNT: how many times this slot was restarted
  std::optional<long> local_rank;    ///< ELASTIC_LOCAL_RANK: this worker's slot on its host
  std::chrono::milliseconds step_timeout{0};  ///< ELASTIC_STEP_TIMEOUT; 0: none

  static worker_env read() {
    worker_env s;
    s.rdzv = internal::env_string("ELASTIC_RDZV");
    // The rendezvous' own rule for which name counts (the older _NODES ones are still read).
    const char* min_var = rendezvous::detail::bound_variable("ELASTIC_MIN_RANKS", "ELASTIC_MIN_NODES");
    const char* max_var = rendezvous::detail::bound_variable("ELASTIC_MAX_RANKS", "ELASTIC_MAX_NODES");
    s.min_ranks = static_cast<int>(internal::env_int(min_var, 1, 65536).value_or(1));
    s.max_ranks = static_cast<int>(internal::env_int(max_var, 1, 65536).value_or(s.min_ranks));
    if (s.min_ranks > s.max_ranks) {
      throw error(errc::invalid_argument, fmt::format("{}={} is above {}={}: the group needs MIN <= MAX; fix either",
                                                      min_var, s.min_ranks, max_var, s.max_ranks));
    }
    if (!s.rdzv && s.min_ranks > 1) {
      throw error(errc::invalid_argument,
                  fmt::format("{}={} needs ELASTIC_RDZV, a store the other ranks reach (elastic-run sets it): set it, "
                              "or unset {} to train alone",
                              min_var, s.min_ranks, min_var));
    }
    s.restart_count = static_cast<long>(internal::env_int("ELASTIC_RESTART_COUNT", 0, 1'000'000'000).value_or(0));
    if (const auto l = internal::env_int("ELASTIC_LOCAL_RANK", 0, 65535)) s.local_rank = static_cast<long>(*l);
    s.step_timeout = internal::env_seconds_in("ELASTIC_STEP_TIMEOUT", std::chrono::milliseconds(1),
                                              std::chrono::milliseconds(1'000'000'000), "no timeout")
                         .value_or(std::chrono::milliseconds(0));
    return s;
  }
};

struct worker_options {
  /// The run id when ELASTIC_RUN_ID is unset (elastic-run sets it); a worker alone (no
  /// ELASTIC_RDZV) needs none.
  std::string run_id{};
  /// The group's options; run_id, and min/max ranks left 0, come from the environment.
  group_options group{};
  /// Bound on each collective; 0: derived from ELASTIC_STEP_TIMEOUT as above.
  std::chrono::milliseconds collective_timeout{0};
  /// The bound when neither is given: how long a rank waits for a slower peer. Long, as
  /// torch.distributed's default: a hung peer is killed at its step deadline and a vanished one
  /// noticed by the heartbeats, either of which ends the wait sooner, while a short bound would
  /// fail every step of a healthy job whose ranks' step times differ by more than it.
  std::chrono::milliseconds collective_timeout_default{std::chrono::minutes(30)};
};

/// `make(collective_timeout)` gives the group's communicator factory (gloo_factory, say).
template <class Comm>
class worker {
 public:
  using factory_maker = std::function<communicator_factory<Comm>(std::chrono::milliseconds)>;

  worker(worker_options o, const factory_maker& make)
      : env_(worker_env::read()),
        store_(open()),
        timeout_(collective_timeout_of(o)),
        group_(*store_, group_options_of(o), make(timeout_)) {}

  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;

  [[nodiscard]] rendezvous::store& store() noexcept { return *store_; }
  [[nodiscard]] elastic_group<Comm>& group() noexcept { return group_; }
  [[nodiscard]] std::chrono::milliseconds collective_timeout() const noexcept { return timeout_; }
  [[nodiscard]] const worker_env& env() const noexcept { return env_; }

  /// `o` with this worker's group attached, for a training_loop.
  [[nodiscard]] checkpoint::loop_options loop_options(checkpoint::loop_options o) {
    o.group = &group_;
    return o;
  }

 private:
  std::unique_ptr<rendezvous::store> open() {
    if (env_.rdzv) return rendezvous::open_store(*env_.rdzv);
    // A world of one: a store nobody else opens; its name goes at once (the mapping stays), so
    // nothing is left in /dev/shm even if the process is SIGKILLed.
    const std::string name = fmt::format("elastic-worker-{}", ::getpid());
    auto s = std::make_unique<rendezvous::shm_store>(name);
    rendezvous::shm_store::remove(name);
    return s;
  }

  std::chrono::milliseconds collective_timeout_of(const worker_options& o) const {
    if (o.collective_timeout.count() < 0) {
      throw error(errc::invalid_argument, "worker: collective_timeout must be >= 0 (0: from ELASTIC_STEP_TIMEOUT)");
    }
    if (o.collective_timeout.count() > 0) return o.collective_timeout;
    if (env_.step_timeout.count() > 0) return std::max(std::chrono::milliseconds(200), env_.step_timeout / 3);
    if (o.collective_timeout_default.count() <= 0) {
      throw error(errc::invalid_argument, "worker: collective_timeout_default must be > 0");
    }
    return o.collective_timeout_default;
  }
  group_options group_options_of(const worker_options& o) const {
    group_options g = o.group;
    if (g.rendezvous.run_id.empty() && !internal::env_string("ELASTIC_RUN_ID")) g.rendezvous.run_id = o.run_id;
    // Alone, on a store of its own, a run needs no name; in a shared store it does (refused).
    if (g.rendezvous.run_id.empty() && !env_.rdzv && !internal::env_string("ELASTIC_RUN_ID")) {
      g.rendezvous.run_id = "alone";
    }
    return g;
  }

  worker_env env_;
  std::unique_ptr<rendezvous::store> store_;
  std::chrono::milliseconds timeout_;
  elastic_group<Comm> group_;
};

}  // namespace elastic::inline v1::comm
