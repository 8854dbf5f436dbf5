// How an elastic group gets each round's communicator: from a plain communicator_factory (a new
// one every round), or from a rebuilder, which is handed the previous one (round_change) and
// hands the next back (rebuilt): the way a backend that can repair a communicator in place
// (NCCL's revoke, shrink and grow) avoids building every round from scratch.
//
//   struct my_factory {
//     elastic::comm::rebuilt<my_comm> rebuild(elastic::comm::round_change<my_comm>& change) const;
//   };
//   elastic::comm::elastic_group<my_comm> group(store, opts, my_factory{});
//
// A factory that is a plain communicator_factory (gloo_factory) gets none of this: the group
// destroys the previous communicator and builds the next from the round's bootstrap. The round's
// check still runs while it connects: the store waits of a Gloo connect call it (detail::
// connecting_round_check), so a member of the new round lost meanwhile ends the connect at once.
#pragma once

#include <concepts>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include <elastic/rendezvous/rendezvous.hpp>
#include <elastic/rendezvous/store.hpp>

namespace elastic::inline v1::comm {

/// The communicator of each round, made from the round's outcome (rank, world size, bootstrap).
template <class Comm>
using communicator_factory = std::function<std::unique_ptr<Comm>(rendezvous::store&, const rendezvous::round_info&)>;

/// The group's move from one round to the next, as one rank sees it.
template <class Comm>
struct round_change {
  rendezvous::store& store;                ///< the store the rendezvous runs on
  const rendezvous::round_info& previous;  ///< this rank's previous round (round 0: it had none)
  const rendezvous::round_info& next;      ///< the round just formed, and this rank's place in it
  /// This rank's communicator of `previous`, when it has one: revoked when a peer departed,
  /// broken when a collective failed, healthy when only newcomers came. Null for a newcomer.
  std::unique_ptr<Comm> communicator;
  /// A store key prefix that belongs to this round's rebuild alone (it ends with '/').
  std::string keys;
  /// Call it between polls: throws errc::interrupted on a preemption notice, and errc::peer_lost
  /// when a member of `next` has departed (the round cannot complete). Never empty.
  std::function<void()> check;
  /// Hands a communicator the rebuild has no more use for (the previous one, a shrunk parent) to
  /// the group's teardown thread and returns at once: its teardown (an NCCL abort joins NCCL's
  /// threads, hundreds of ms) stays off the critical path. Empty: destroy it in place.
  std::function<void(std::unique_ptr<Comm>)> discard;

  /// Gives `c` up by discard, or destroys it here where there is none.
  void give_up(std::unique_ptr<Comm> c) const {
    if (discard) discard(std::move(c));
    else c.reset();
  }
};

/// What a rebuild produced: the next round's communicator and how it was made.
template <class Comm>
struct rebuilt {
  std::unique_ptr<Comm> communicator;
  /// "reinit" (built from scratch), "shrink", "grow" or "shrink+grow": the group_rebuilt event's
  /// `path`.
  std::string path = "reinit";
  /// Why a rebuilder that can work in place did not (the group_rebuilt event's `reason`).
  std::string reason;
};

/// A factory that rebuilds from the previous round's communicator.
template <class R, class Comm>
concept communicator_rebuilder = requires(const R& r, round_change<Comm>& change) {
  { r.rebuild(change) } -> std::same_as<rebuilt<Comm>>;
};

namespace detail {

/// The round_change::check of the round whose communicator a plain factory is connecting on this
/// thread (null otherwise): a factory has no place for it, the waits inside its connect do.
inline thread_local const std::function<void()>* connecting_round_check = nullptr;

/// Runs the check of the round being connected on this thread, if any: throws as it does.
inline void check_connecting_round() {
  if (connecting_round_check != nullptr && *connecting_round_check) (*connecting_round_check)();
}

/// A plain factory as a rebuild: a new communicator every round, the previous one unused; the
/// round's check is there for the waits of its connect (check_connecting_round()).
template <class Comm>
std::function<rebuilt<Comm>(round_change<Comm>&)> as_rebuild_fn(communicator_factory<Comm> make) {
  if (!make) return {};
  return [make = std::move(make)](round_change<Comm>& c) {
    struct scope {
      const std::function<void()>* outer;
      ~scope() { connecting_round_check = outer; }
    } restore{std::exchange(connecting_round_check, &c.check)};
    return rebuilt<Comm>{make(c.store, c.next), "reinit", {}};
  };
}

}  // namespace detail

}  // namespace elastic::inline v1::comm
