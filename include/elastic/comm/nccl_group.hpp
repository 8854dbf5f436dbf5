// An elastic group over NCCL. Link elastic::nccl.
//
//   elastic::comm::nccl_group group(store, {.rendezvous = {.min_ranks = 2, .max_ranks = 8}},
//                                   elastic::comm::nccl_factory(local_rank, 30s, stream));
//
// The group hands each round's change to nccl_factory::rebuild() with the previous communicator
// (comm/rebuild.hpp), which repairs it in place where it can (detail/nccl_rebuild.hpp):
//   - departures: the communicator was revoked when the departure was seen (so no collective
//     waits for the dead peer), then ncclCommShrink drops the dead ranks (path "shrink");
//   - newcomers: ncclCommGrow adds them (path "grow"); both at once: "shrink+grow";
//   - otherwise, or when any rank's in-place step fails (NCCL refuses to shrink a parent that
//     carries a network error, say), every rank falls back to a fresh init from a unique id rank 0
//     makes for that round (path "reinit", with the `reason` in the group_rebuilt event);
//   - with standbys (nccl_standby::max_world), after each round every rank builds in the
//     background one communicator per possible single departure; when exactly one member goes and
//     nobody comes, the survivors switch to the one without it (path "standby"), which needs no
//     NCCL call at all (detail/nccl_standby.hpp).
// Which calls are used depends on the libnccl the process runs with (detail::recovery_calls():
// shrink 2.27, revoke 2.28.7, grow 2.29.2; 2.28.3..2.28.8 re-initialise only).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include <cuda_runtime_api.h>

#include <elastic/comm/detail/nccl_rebuild.hpp>
#include <elastic/comm/detail/nccl_standby.hpp>
#include <elastic/comm/detail/nccl_warm_up.hpp>
#include <elastic/comm/elastic_group.hpp>
#include <elastic/comm/nccl.hpp>
#include <elastic/comm/rebuild.hpp>
#include <elastic/error.hpp>
#include <elastic/internal/env.hpp>

namespace elastic::inline v1::comm {

using nccl_group = elastic_group<nccl_communicator>;

/// The round leader's bootstrap blob for an nccl_group: a marker only. The group makes NCCL unique
/// ids itself, when a round needs a fresh init: an id made for a round that shrinks instead would
/// leave NCCL's bootstrap root thread waiting forever in the leader.
inline rendezvous::bootstrap_fn nccl_bootstrap() {
  return [](const rendezvous::round_info&) { return std::string("nccl"); };
}

/// Standby communicators (detail/nccl_standby.hpp): after each round of up to `max_world` ranks,
/// every rank builds world-1 more communicators in the background (each the round's members but
/// one), so that one member's death is a switch instead of an init. They cost NCCL's memory per
/// communicator and the build's work beside training: benchmarks/README.md, "Standby
/// communicators", has the measurements.
struct nccl_standby {
  /// Largest world size that gets standbys; below 2, none. Unset: $ELASTIC_NCCL_STANDBY (a
  /// number), else 0.
  std::optional<int> max_world;

  /// max_world, or what the environment says (an unreadable value is errc::invalid_argument).
  [[nodiscard]] int resolved() const {
    if (max_world) return *max_world;
    return static_cast<int>(internal::env_int("ELASTIC_NCCL_STANDBY", 0, 1 << 20).value_or(0));
  }
};

/// Each round's communicator on CUDA device `device`, its collectives on `stream` (nullptr: a
/// stream of its own, ordered after the legacy default stream) and bounded by `timeout`, which
/// also bounds each step of a rebuild. One factory per group: its standbys are that group's.
/// With ELASTIC_NCCL_WARM_UP=1, making one starts loading NCCL's device code on a thread of its
/// own, so that the first round's init does not wait for it (detail/nccl_warm_up.hpp: what it
/// saves, and why it is off by default).
class nccl_factory {
 public:
  nccl_factory(int device, std::chrono::milliseconds timeout, cudaStream_t stream = nullptr, nccl_options options = {},
               nccl_standby standby = {})
      : s_{device, timeout, stream, options},
        standbys_(std::make_shared<detail::nccl_standbys>(standby.resolved())),
        warm_up_(detail::nccl_warm_up::enabled() ? std::make_shared<detail::nccl_warm_up>(device) : nullptr) {}

  /// A fresh communicator for a round whose bootstrap is an nccl_unique_id() (for groups built
  /// with a bootstrap_fn of one's own and this factory as a plain communicator_factory).
  std::unique_ptr<nccl_communicator> operator()(rendezvous::store&, const rendezvous::round_info& r) const {
    return std::make_unique<nccl_communicator>(r.bootstrap, r.rank, r.world_size, s_.device, s_.timeout, s_.stream,
                                               s_.options);
  }

  /// The group's rebuild: a standby where every survivor holds one, in place where every rank
  /// can, a fresh init otherwise; then the next round's standbys start building.
  rebuilt<nccl_communicator> rebuild(round_change<nccl_communicator>& change) const {
    std::vector<std::unique_ptr<nccl_communicator>> spare;  // standbys of no use now
    struct give_up_spare {  // after the previous communicator, whatever happens (see before())
      round_change<nccl_communicator>& ch;
      std::vector<std::unique_ptr<nccl_communicator>>& spare;
      ~give_up_spare() {
        ch.give_up(std::move(ch.communicator));
        for (auto& c : spare) ch.give_up(std::move(c));
      }
    } later{change, spare};
    auto made = detail::nccl_round(change, s_, standbys_->before(change, spare)).run();
    if (made.communicator) standbys_->after(change, *made.communicator, s_);
    return made;
  }

  /// How many standby communicators of the current round are ready on this rank.
  [[nodiscard]] int standbys_ready() const { return standbys_->ready(); }

 private:
  detail::nccl_settings s_;
  std::shared_ptr<detail::nccl_standbys> standbys_;  // shared by the copies the group keeps
  std::shared_ptr<detail::nccl_warm_up> warm_up_;     // likewise; null when turned off
};

static_assert(communicator_rebuilder<nccl_factory, nccl_communicator>);

}  // namespace elastic::inline v1::comm
