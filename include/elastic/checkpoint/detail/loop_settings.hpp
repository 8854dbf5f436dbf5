// How a training_loop fills in and checks its options (from the environment elastic-run sets),
// and the watchdog its step timeout needs.
#pragma once

#include <chrono>
#include <string>

#include <fmt/format.h>

#include <elastic/checkpoint/loop_options.hpp>
#include <elastic/internal/env.hpp>
#include <elastic/internal/names.hpp>
#include <elastic/error.hpp>
#include <elastic/timer/client.hpp>

namespace elastic::inline v1::checkpoint::detail {

/// A switch from the environment: 1 on, 0 or unset off, anything else refused by name.
inline bool env_switch(const char* name) {
  const auto v = internal::env_string(name);
  if (v && *v != "0" && *v != "1") {
    throw error(errc::invalid_argument, fmt::format("{}='{}' is neither 1 (on) nor 0 (off)", name, internal::printable(*v)));
  }
  return v && *v == "1";
}

/// Whether the step deadlines set themselves (never beside a step timeout: a number given
/// wins), and their settings checked.
inline void resolve_auto_timeout(loop_options& o) {
  auto& a = o.auto_timeout;
  if (!a.enabled) a.enabled = env_switch("ELASTIC_AUTO_TIMEOUT");
  if (o.step_timeout.count() > 0) a.enabled = false;
  if (!*a.enabled) return;
  const auto bad = [](const std::string& what) {
    throw error(errc::invalid_argument, "training_loop: auto_timeout." + what);
  };
  if (a.min_samples < 1 || a.min_samples > a.window) bad("min_samples must be 1 to window");
  if (a.update_every < 1) bad("update_every must be at least 1 step");
  if (!(a.multiple >= 1.5 && a.multiple <= 1000)) bad("multiple must be 1.5 to 1000");
  if (a.floor.count() < 1 || a.ceiling < a.floor) bad("floor must be at least 1 ms and ceiling at least floor");
  if (!(a.kill_multiple >= 1 && a.kill_multiple <= 1e6)) bad("kill_multiple must be 1 to 1e6");
  if (!a.kill_floor) {
    a.kill_floor = internal::env_seconds_in("ELASTIC_AUTO_KILL_FLOOR", std::chrono::milliseconds(1),
                                            std::chrono::hours(24 * 7), "the warning's own deadline")
                       .value_or(std::chrono::minutes(5));
  }
  if (a.kill_floor->count() < 0) bad("kill_floor must not be negative");
}

/// Options with what the environment fills in, every value checked.
inline loop_options resolve_loop_options(loop_options o) {
  namespace env = elastic::internal;
  using std::chrono::milliseconds;
  if (o.max_overhead < 0 || o.max_overhead >= 1) {
    throw error(errc::invalid_argument, "training_loop: max_overhead is a fraction in [0, 1)");
  }
  if (o.step_timeout.count() < 0) {
    throw error(errc::invalid_argument, "training_loop: step_timeout is negative; use 0 for no timeout");
  }
  if (o.step_timeout.count() == 0) {
    o.step_timeout = env::env_seconds_in("ELASTIC_STEP_TIMEOUT", milliseconds(1), milliseconds(1'000'000'000),
                                         "no timeout")
                         .value_or(milliseconds(0));
  }
  resolve_auto_timeout(o);
  if (!(o.straggler_threshold == 0 || (o.straggler_threshold >= 1.1 && o.straggler_threshold <= 1000))) {
    throw error(errc::invalid_argument, "training_loop: straggler_threshold must be 0 (off) or 1.1 to 1000");
  }
  if (!o.evict_stragglers) o.evict_stragglers = env_switch("ELASTIC_EVICT_STRAGGLERS");
  if (o.grace && o.grace->count() < 0) throw error(errc::invalid_argument, "training_loop: grace is negative");
  if (!o.grace) {
    o.grace = env::env_seconds_in("ELASTIC_GRACE", milliseconds(1), std::chrono::hours(24), "no final checkpoint")
                  .value_or(std::chrono::seconds(25));
  }
  if (o.group) return o;  // rank and world size are the group's
  const bool rank_from_env = o.rank < 0, world_from_env = o.world_size < 0;
  if (world_from_env) o.world_size = static_cast<int>(env::env_int("ELASTIC_WORLD_SIZE", 1, 65536).value_or(1));
  if (rank_from_env) o.rank = static_cast<int>(env::env_int("ELASTIC_RANK", 0, 65535).value_or(0));
  if (o.world_size < 1 || o.rank >= o.world_size) {
    auto shown = [](bool from_env, const char* var, const char* opt, int v) {
      return from_env ? fmt::format("{}={}", var, v) : fmt::format("loop_options::{} {}", opt, v);
    };
    throw error(errc::invalid_argument,
                fmt::format("training_loop: {} is not below {}: a rank is 0 to the world size - 1; fix either",
                            shown(rank_from_env, "ELASTIC_RANK", "rank", o.rank),
                            shown(world_from_env, "ELASTIC_WORLD_SIZE", "world_size", o.world_size)));
  }
  return o;
}

/// A step timeout nobody enforces is a silent hang: with ELASTIC_WATCHDOG set, the watchdog
/// must be there. (Unset: scopes are no-ops, and one timer_unwatched event says so.)
inline void check_watchdog(std::chrono::milliseconds step_timeout, bool automatic = false) {
  if (step_timeout.count() <= 0 && !automatic) return;
  const auto name = internal::env_string("ELASTIC_WATCHDOG");
  if (!name || timer::client::current() != nullptr) return;
  try {
    timer::client::attach(*name);
  } catch (const error& e) {
    throw error(e.code(), fmt::format("ELASTIC_WATCHDOG='{}' cannot be attached ({}), so the step timeout ({}) "
                                      "would not be enforced: start the watchdog (elastic-run hosts one), fix "
                                      "ELASTIC_WATCHDOG, or unset it to run unwatched",
                                      internal::printable(*name), e.message(),
                                      automatic ? std::string("automatic") : fmt::format("{} ms", step_timeout.count())),
                e.os_code());
  }
}

}  // namespace elastic::inline v1::checkpoint::detail
