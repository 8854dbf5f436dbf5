// How the ranks of an nccl_group move their communicator from one round to the next: in place
// (revoke -> shrink after departures, grow after newcomers, both when both happened) where every
// rank can, a fresh init otherwise, and the same choice on every rank.
//
// Store keys, under the round's own prefix K (round_change::keys, "P/round/<r>/comm/"):
//   K able/<rank> each survivor's "<standby|-> yes", or "<standby|-> no <why>": whether it holds a
//                 ready standby communicator of exactly the new round (detail/nccl_standby.hpp),
//                 and whether it can take part in place (a communicator NCCL marked with an
//                 asynchronous error, a peer's broken connection say, is refused by
//                 ncclCommShrink, so such a rank says no at once).
//   K path        "standby", "inplace" or "reinit": rank 0's choice. Rank 0 is a survivor whenever
//                 the round has survivors (the rendezvous orders them first), so it can judge: the
//                 standbys when every survivor holds one; in place when every survivor said yes and
//                 the loaded libnccl has the calls needed.
//   K init        the NCCL unique id of a fresh init chosen at once (written before `path`).
//   K grow        the grow id (ncclCommGetUniqueId) rank 0 made after its shrink, for newcomers;
//                 the other survivors wait for it before they call ncclCommGrow.
//   K vote/<rank> "ok", or "fail <why>": each rank's outcome of the in-place path. A rank that
//                 fails votes at once; every rank waiting inside NCCL for it sees the vote within
//                 a few ms, gives its half-made communicator up and votes fail too.
//   K retry       the unique id of the fresh init that follows a failed in-place path.
// Every wait is bounded by the communicator timeout and watches round_change::check (a
// preemption notice, a member departing). No communicator is destroyed on the way: the previous
// one, a shrunk or grown parent, a half-made one, all go to round_change::discard, whose thread
// aborts them while this one builds the next (an abort joins NCCL's threads: hundreds of ms).
//
// Survivors of round r-1 keep their order at the head of round r (rendezvous rank_order), and
// ncclCommShrink closes the gaps in the same order; newcomers come after them, where
// ncclCommGrow puts new ranks. So the rendezvous's ranks and NCCL's agree, and a rank checks it.
#pragma once

#include <elastic/config.hpp>

#if !ELASTIC_WITH_NCCL
#error "elastic/comm/detail/nccl_rebuild.hpp needs NCCL: link elastic::nccl (which sets ELASTIC_WITH_NCCL=1)"
#endif

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <cuda_runtime_api.h>

#include <elastic/comm/nccl.hpp>
#include <elastic/comm/rebuild.hpp>
#include <elastic/error.hpp>
#include <elastic/rendezvous/rendezvous.hpp>

namespace elastic::inline v1::comm::detail {

/// What one rank can do in place for a round change.
struct nccl_plan {
  bool survivor = false;      ///< holds the previous round's communicator, at its rank and size
  std::vector<int> excluded;  ///< previous ranks that did not come back
  int survivors = 0;          ///< members of the next round that survived (survivor's view)
  bool ordered = false;       ///< the survivors keep their order at the head of the next round
  std::string why_not;        ///< non-empty: this rank cannot take part in place, and why

  /// One member gone, nobody new: the change a standby communicator stands in for.
  [[nodiscard]] bool one_departure(int world) const noexcept {
    return survivor && ordered && excluded.size() == 1 && !grow(world);
  }

  [[nodiscard]] bool shrink() const noexcept { return !excluded.empty(); }
  [[nodiscard]] bool grow(int world) const noexcept { return world > survivors; }
  [[nodiscard]] std::string path(int world) const {
    if (shrink() && grow(world)) return "shrink+grow";
    if (shrink()) return "shrink";
    if (grow(world)) return "grow";
    return "kept";
  }
};

/// The index of (id, incarnation) among `round`'s members, or -1.
inline int member_index(const rendezvous::round_info& round, const std::string& id, const std::string& incarnation) {
  for (std::size_t i = 0; i < round.members.size() && i < round.incarnations.size(); ++i) {
    if (round.members[i] == id && round.incarnations[i] == incarnation) return static_cast<int>(i);
  }
  return -1;
}

/// The ranks of `prev` whose (member, incarnation) is not in `next`, in rank order.
inline std::vector<int> departed_ranks(const rendezvous::round_info& prev, const rendezvous::round_info& next) {
  std::vector<int> gone;
  for (int j = 0; j < prev.world_size && static_cast<std::size_t>(j) < prev.members.size() &&
                  static_cast<std::size_t>(j) < prev.incarnations.size();
       ++j) {
    if (member_index(next, prev.members[static_cast<std::size_t>(j)], prev.incarnations[static_cast<std::size_t>(j)]) < 0) {
      gone.push_back(j);
    }
  }
  return gone;
}

/// The plan for a rank holding `comm` (or nothing) as the group goes from `prev` to `next`.
/// Pure: every survivor computes the same excluded list and survivor count from the same rounds.
inline nccl_plan plan_round(const rendezvous::round_info& prev, const rendezvous::round_info& next,
                            const nccl_communicator* comm, const nccl_recovery_calls& calls) {
  nccl_plan p;
  if (comm == nullptr) {
    p.why_not = "no communicator of the previous round";
    return p;
  }
  if (prev.round == 0 || next.round != prev.round + 1 || comm->size() != prev.world_size ||
      comm->rank() != prev.rank || prev.incarnations.size() != prev.members.size()) {
    p.why_not = fmt::format("the communicator is not that of round {} at this rank", next.round - 1);
    return p;
  }
  p.survivor = true;
  // Survivors in their previous rank order; the others of the previous round are excluded.
  p.excluded = departed_ranks(prev, next);
  std::vector<int> kept;
  for (int j = 0; j < prev.world_size; ++j) {
    if (!std::binary_search(p.excluded.begin(), p.excluded.end(), j)) kept.push_back(j);
  }
  if (std::find(p.excluded.begin(), p.excluded.end(), prev.rank) != p.excluded.end()) {
    // Declared gone (a lapsed heartbeat) and back as a new life: a newcomer to the others.
    p.survivor = false;
    p.why_not = fmt::format("this rank left round {} and came back as a new life", prev.round);
    return p;
  }
  p.survivors = static_cast<int>(kept.size());
  for (int i = 0; i < p.survivors; ++i) {
    const int j = kept[static_cast<std::size_t>(i)];
    if (member_index(next, prev.members[j], prev.incarnations[j]) != i) {
      p.why_not = "the round's ranks do not keep the survivors' order at its head";
      return p;
    }
  }
  p.ordered = true;
  if (p.shrink() && calls.shrink && prev.world_size < calls.shrink_from_world) {
    p.why_not = fmt::format("a fresh init of {} ranks is faster than waiting for the revoke a shrink needs "
                            "(shrink from {} ranks; ELASTIC_NCCL_RECOVERY=inplace shrinks at any size)",
                            next.world_size, calls.shrink_from_world);
  } else if (p.shrink() && !calls.shrink) {
    p.why_not = calls.warning.empty() ? "ncclCommShrink is not in the loaded libnccl (2.27+)" : calls.warning;
  } else if (p.grow(next.world_size) && !calls.grow) {
    p.why_not = calls.warning.empty() ? "ncclCommGrow is not in the loaded libnccl (2.29.2+)" : calls.warning;
  } else if (comm->async_error()) {
    p.why_not = "NCCL marked the communicator with an asynchronous error (sticky; a peer's connection broke, say), "
                "which ncclCommShrink refuses";
  } else if (!p.shrink() && !comm->ok()) {
    p.why_not = "the communicator failed with nobody gone (a timeout, a device error): nothing to shrink";
  }
  return p;
}

/// How a rank's communicator is made in each round: the settings of nccl_factory.
struct nccl_settings {
  int device = 0;
  std::chrono::milliseconds timeout{30000};
  cudaStream_t stream = nullptr;
  nccl_options options{};
};

/// One rank's part in one round change (see the file comment). `standby`: this rank's ready
/// standby communicator for the change (detail/nccl_standby.hpp), if it has one.
class nccl_round {
 public:
  nccl_round(round_change<nccl_communicator>& change, const nccl_settings& s,
             std::unique_ptr<nccl_communicator> standby = nullptr)
      : ch_(change), s_(s), world_(change.next.world_size), rank_(change.next.rank), standby_(std::move(standby)) {}

  // A standby not switched to is of no more use; the previous communicator goes first (see
  // nccl_standbys::before), here too when the rebuild failed half way.
  ~nccl_round() {
    ch_.give_up(std::move(ch_.communicator));
    ch_.give_up(std::move(standby_));
  }
  nccl_round(const nccl_round&) = delete;
  nccl_round& operator=(const nccl_round&) = delete;

  /// The next round's communicator, ordered on the GPU after the previous one's last work (its
  /// kernels may still write the buffers both use: a revoke drains them, an abort ends them).
  rebuilt<nccl_communicator> run() {
    std::optional<cuda::event> fence;
    if (ch_.communicator) fence = ch_.communicator->fence();
    rebuilt<nccl_communicator> out = choose();
    if (fence && out.communicator) out.communicator->follow(*fence);
    return out;
  }

 private:
  rebuilt<nccl_communicator> choose() {
    const nccl_plan plan = plan_round(ch_.previous, ch_.next, ch_.communicator.get(), recovery_calls());
    if (standby_ && (!plan.one_departure(world_) || standby_->rank() != rank_ || standby_->size() != world_ ||
                     !standby_->ok())) {
      ch_.give_up(std::move(standby_));
    }
    std::string path;
    std::string why_not = plan.why_not;
    if (plan.survivor && rank_ != 0) ch_.store.set(key("able/" + std::to_string(rank_)), able(plan));
    if (rank_ == 0) {
      bool all_standby = standby_ != nullptr;
      if (plan.survivor) {
        const auto others = survivors_unable(plan.survivors, all_standby);
        if (why_not.empty()) why_not = others;
      }
      path = all_standby ? "standby" : plan.survivor && why_not.empty() ? "inplace" : "reinit";
      if (path == "reinit") publish_id("init");
      ch_.store.set(key("path"), path);
    } else {
      path = wait_for(key("path"), "rank 0's choice of path");
    }
    if (path == "standby") return switch_to_standby();
    if (path != "inplace") return reinit("init", why_not.empty() ? "another rank cannot rebuild in place" : why_not);
    std::string failure;
    std::unique_ptr<nccl_communicator> made;
    try {
      made = in_place(plan);
      ch_.store.set(key("vote/" + std::to_string(rank_)), "ok");
    } catch (const error& e) {
      if (e.code() == errc::interrupted) throw;
      failure = e.message();
      vote_fail(failure);
    }
    if (failure.empty()) {
      if (auto other = votes_failure(); !other) return {std::move(made), plan.path(world_), {}};
      else failure = *other;
    }
    ch_.give_up(std::move(made));
    if (rank_ == 0) publish_id("retry");
    return reinit("retry", failure);
  }

  std::string key(std::string_view leaf) const { return ch_.keys + std::string(leaf); }

  // A survivor's answer to rank 0: "<standby|-> yes", or "<standby|-> no <why>": whether it holds
  // a ready standby for this change, and whether it can take part in place.
  std::string able(const nccl_plan& plan) const {
    const char* standby = standby_ ? "standby " : "- ";
    return plan.why_not.empty() ? std::string(standby) + "yes" : std::string(standby) + "no " + plan.why_not.substr(0, 512);
  }

  // Rank 0 asks every other survivor (ranks 1 .. survivors-1 of the new round) whether it can
  // take part in place: empty when all can, else the first one's reason. `all_standby` stays
  // true while every one of them holds a ready standby.
  std::string survivors_unable(int survivors, bool& all_standby) {
    std::string unable;
    for (int r = 1; r < survivors; ++r) {
      const std::string v = wait_for(key("able/" + std::to_string(r)), "a survivor's readiness");
      const auto space = v.find(' ');
      if (v.compare(0, space, "standby") != 0) all_standby = false;
      const std::string answer = space == std::string::npos ? v : v.substr(space + 1);
      if (unable.empty() && answer != "yes") {
        unable = fmt::format("rank {}: {}", r, answer.size() > 3 ? answer.substr(3) : answer);
      }
    }
    return unable;
  }

  // Every survivor holds a communicator of exactly the new round, built while the previous one
  // was healthy: the previous one goes, the standby takes its place. No NCCL call waits here.
  rebuilt<nccl_communicator> switch_to_standby() {
    if (!standby_) {
      throw error(errc::mismatch, fmt::format("nccl rebuild of round {}: rank 0 chose the standby communicators, "
                                              "but rank {} holds none",
                                              ch_.next.round, rank_));
    }
    ch_.give_up(std::move(ch_.communicator));
    return {std::move(standby_), "standby", {}};
  }

  // The survivors' shrink and grow, or a newcomer's join of the grow.
  std::unique_ptr<nccl_communicator> in_place(const nccl_plan& plan) {
    const creation_check check = [this] { check_votes(); };
    // A newcomer was in no round, or in an older one (the rendezvous ranks it after the
    // survivors); a member of the previous round without its communicator is no newcomer.
    const bool newcomer = ch_.communicator == nullptr &&
                          (ch_.previous.round == 0 || ch_.previous.round + 1 != ch_.next.round);
    if (newcomer) {
      const std::string id = wait_for(key("grow"), "the grow id of rank 0", check);
      return nccl_communicator::join_grown(id, rank_, world_, s_.device, s_.timeout, s_.stream, s_.options, check);
    }
    if (!plan.why_not.empty()) throw error(errc::not_supported, plan.why_not);
    std::unique_ptr<nccl_communicator> c = std::move(ch_.communicator);
    if (plan.shrink()) {
      c->revoke();  // no-op when the group already did; stops in-flight work either way
      std::unique_ptr<nccl_communicator> child = c->shrink(plan.excluded, s_.timeout, check);
      ch_.give_up(std::exchange(c, std::move(child)));  // the parent shares nothing with its child
    }
    if (plan.grow(world_)) {
      // Rank 0 makes the id (ncclCommGetUniqueId also hands it to the parent's boundary ranks,
      // whose ncclCommGrow blocks until it has come); the others wait for it in the store first,
      // so no rank ever blocks inside NCCL on a rank 0 that failed before sending it.
      std::string id;
      if (rank_ == 0) {
        id = c->grow_unique_id();
        ch_.store.set(key("grow"), id);
      } else {
        (void)wait_for(key("grow"), "the grow id of rank 0", check);
      }
      std::unique_ptr<nccl_communicator> child = c->grow(world_, rank_ == 0 ? id : std::string(), s_.timeout, check);
      ch_.give_up(std::exchange(c, std::move(child)));
    }
    if (c->rank() != rank_ || c->size() != world_) {
      throw error(errc::mismatch, fmt::format("nccl rebuild: NCCL made rank {} of {} where round {} says {} of {}",
                                              c->rank(), c->size(), ch_.next.round, rank_, world_));
    }
    return c;
  }

  // A fresh communicator from the unique id rank 0 published under `leaf`. The previous one is
  // aborted meanwhile on the teardown thread; it was revoked when the departure was seen, or its
  // work is stopped by that abort (NCCL < 2.28.7: no revoke) before any cudaFree of the new one's
  // could wait behind it.
  rebuilt<nccl_communicator> reinit(std::string_view leaf, std::string why) {
    ch_.give_up(std::move(ch_.communicator));
    const std::string id = rank_ == 0 && id_ ? *id_ : wait_for(key(leaf), "rank 0's unique id");
    try {
      auto c = std::make_unique<nccl_communicator>(id, rank_, world_, s_.device, s_.timeout, s_.stream, s_.options,
                                                   ch_.check);
      return {std::move(c), "reinit", std::move(why)};
    } catch (const error&) {
      // The root thread of our id would wait forever for the ranks that never came.
      if (rank_ == 0 && id_) release_bootstrap_root(*id_, world_, s_.device);
      throw;
    }
  }

  void publish_id(std::string_view leaf) {
    id_ = nccl_unique_id();
    ch_.store.set(key(leaf), *id_);
  }

  void vote_fail(const std::string& why) {
    try {
      ch_.store.set(key("vote/" + std::to_string(rank_)), "fail " + why.substr(0, 512));
    } catch (const error&) {
      // The others then time out on our vote and fall back all the same.
    }
  }

  // round_change::check, and any rank's vote to give the in-place path up.
  void check_votes() {
    ch_.check();
    for (const auto& [k, v] : ch_.store.list(key("vote/"))) {
      if (v.rfind("fail", 0) == 0) {
        throw error(errc::peer_lost, fmt::format("rank {} gave the in-place rebuild up: {}",
                                                 k.substr(key("vote/").size()), v.substr(std::min<std::size_t>(5, v.size()))));
      }
    }
  }

  // Waits for every rank's vote: nothing when all are "ok", else the first failure.
  std::optional<std::string> votes_failure() {
    const auto deadline = std::chrono::steady_clock::now() + s_.timeout;
    for (int polls = 0;; ++polls) {
      const auto votes = ch_.store.list(key("vote/"));
      for (const auto& [k, v] : votes) {
        if (v.rfind("fail", 0) == 0) return fmt::format("rank {}: {}", k.substr(key("vote/").size()), v.substr(5));
      }
      if (votes.size() >= static_cast<std::size_t>(world_)) return std::nullopt;
      if (std::chrono::steady_clock::now() >= deadline) {
        return fmt::format("only {} of {} ranks voted within {} ms", votes.size(), world_, s_.timeout.count());
      }
      ch_.check();
      std::this_thread::sleep_for(std::chrono::microseconds(polls < 200 ? 500 : 5000));
    }
  }

  // The value of `k`, bounded by the timeout, watching `check` (default: round_change::check).
  std::string wait_for(const std::string& k, std::string_view what, const creation_check& check = {}) {
    const auto deadline = std::chrono::steady_clock::now() + s_.timeout;
    for (;;) {
      if (auto v = ch_.store.get(k)) return *v;
      if (std::chrono::steady_clock::now() >= deadline) {
        throw error(errc::timeout, fmt::format("nccl rebuild of round {}: {} did not come within {} ms ({})",
                                               ch_.next.round, what, s_.timeout.count(), k));
      }
      if (check) check();
      else ch_.check();
      try {
        ch_.store.wait(std::span<const std::string>(&k, 1), std::chrono::milliseconds(5));
      } catch (const error& e) {
        if (e.code() != errc::timeout) throw;
      }
    }
  }

  round_change<nccl_communicator>& ch_;
  const nccl_settings& s_;
  int world_;
  int rank_;
  std::unique_ptr<nccl_communicator> standby_;  // this rank's ready standby for the change, if any
  std::optional<std::string> id_;  // the unique id rank 0 made for a fresh init
};

}  // namespace elastic::inline v1::comm::detail
