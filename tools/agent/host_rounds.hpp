// The rounds of hosts for --restart-mode all (torchrun's way): which hosts' workers train
// together, this host's rank among them, and where the round's rank 0 serves torch's store
// (MASTER_ADDR:MASTER_PORT, a port fresh for each round, so a worker of the last round still
// shutting down never meets the new one's store).
//
// One host (--nnodes 1): decided at once, without a store. Several: the launchers are the
// participants of a rendezvous of their own (the library's, under the key prefix /elastic-hosts,
// so the workers' own rendezvous of the same run is never mixed in), made on a thread: the
// supervision loop never waits for the store. The loop asks for a round and is woken (eventfd)
// when it is there, when the round it is in changed (a host gone, a host waiting to join while
// the round has room, another host starting the next round after a failure there), or when no
// round can form (the error ends the run).
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "async_store.hpp"
#include "launch_options.hpp"
#include <elastic/checkpoint/preemption.hpp>
#include <elastic/error.hpp>
#include <elastic/events.hpp>
#include <elastic/internal/tcp.hpp>
#include <elastic/internal/unique_fd.hpp>
#include <elastic/rendezvous/open_store.hpp>
#include <elastic/rendezvous/rendezvous.hpp>

namespace elastic::agent {

namespace detail {

/// A TCP port free on `addr` right now (listened on and released, as torchrun picks one).
inline std::uint16_t free_port(const std::string& addr) { return internal::tcp::listen_on(addr).second; }

/// The network interface that holds `addr` ("" when none does, or `addr` is a name): what
/// torch's Gloo is told to use (GLOO_SOCKET_IFNAME) so that its workers listen where the other
/// hosts reach this one, not where the host name happens to resolve (often 127.0.1.1).
inline std::string interface_of(const std::string& addr) {
  in6_addr want6{};
  in_addr want4{};
  const bool v4 = ::inet_pton(AF_INET, addr.c_str(), &want4) == 1;
  const bool v6 = !v4 && ::inet_pton(AF_INET6, addr.c_str(), &want6) == 1;
  if (!v4 && !v6) return {};
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  std::unique_ptr<ifaddrs, decltype(&::freeifaddrs)> guard(list, &::freeifaddrs);
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    if (v4 && i->ifa_addr->sa_family == AF_INET &&
        reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == want4.s_addr) {
      return i->ifa_name;
    }
    if (v6 && i->ifa_addr->sa_family == AF_INET6 &&
        std::memcmp(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr, &want6, sizeof(want6)) == 0) {
      return i->ifa_name;
    }
  }
  return {};
}

}  // namespace detail

class host_rounds {
 public:
  /// A round as this host sees it.
  struct round {
    std::int64_t number = 0;
    std::size_t rank = 0;   ///< GROUP_RANK
    std::size_t world = 1;  ///< GROUP_WORLD_SIZE
    std::string master_addr;
    std::uint16_t master_port = 0;
  };

  /// `participant`: this launcher's id among the hosts; `events`: where the rendezvous says what
  /// it does.
  host_rounds(const launch_options& o, std::string participant, event_log events)
      : s_(std::make_shared<shared>(o, std::move(participant), std::move(events))) {}

  host_rounds(const host_rounds&) = delete;
  host_rounds& operator=(const host_rounds&) = delete;

  ~host_rounds() { stop(false); }

  /// Readable when a round, a change or an error is there to take.
  [[nodiscard]] int wake_fd() const noexcept { return s_->wake.get(); }

  /// Asks for the next round (the first at the first call). One host: there at once.
  void request() {
    std::lock_guard lk(s_->mu);
    if (s_->opts.max_nodes == 1) {
      s_->ready = round{.number = ++s_->single_rounds,
                        .rank = 0,
                        .world = 1,
                        .master_addr = s_->opts.host_addr,
                        .master_port = detail::free_port(s_->opts.host_addr)};
      s_->ring();
      return;
    }
    if (!thread_.joinable()) thread_ = std::thread([s = s_] { serve(*s); });
    s_->wanted = true;
    s_->in_round = false;
    s_->change.clear();  // of the round left
    s_->cv.notify_all();
  }

  std::optional<round> take_round() {
    s_->drain();
    std::lock_guard lk(s_->mu);
    return std::exchange(s_->ready, std::nullopt);
  }
  /// Why the round this host is in changed (empty: it did not).
  std::string take_change() {
    std::lock_guard lk(s_->mu);
    return std::exchange(s_->change, std::string());
  }
  /// Why no round can be had (empty: nothing went wrong).
  std::string take_error() {
    std::lock_guard lk(s_->mu);
    return std::exchange(s_->error, std::string());
  }

  /// Leaves the rounds; `done`: this host's workers finished (the others take it as no failure).
  /// A join in progress is interrupted; a store that does not answer is left to its thread,
  /// which is abandoned after a few seconds (the process exits without waiting for it).
  void stop(bool done) noexcept {
    if (!thread_.joinable()) return;
    std::unique_lock lk(s_->mu);
    s_->leave_done = done;
    s_->stopping = true;
    s_->cv.notify_all();
    // A join or next round waiting for other hosts ends at a notice (errc::interrupted): the
    // launcher is ending, which is one for this process.
    if (checkpoint::preemption_handler::requested() == 0) checkpoint::preemption_handler::request(SIGTERM);
    if (s_->cv.wait_for(lk, std::chrono::seconds(5), [&] { return s_->finished; })) {
      lk.unlock();
      thread_.join();
    } else {
      lk.unlock();
      detail::store_thread_abandoned.store(true);
      thread_.detach();
    }
  }

 private:
  struct shared {
    shared(const launch_options& o, std::string p, event_log e)
        : opts(o), participant(std::move(p)), events(std::move(e)), wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
      if (!wake) throw os_error("eventfd for the rounds of hosts");
    }
    void ring() noexcept {
      const std::uint64_t one = 1;
      (void)!::write(wake.get(), &one, sizeof(one));
    }
    void drain() noexcept {
      std::uint64_t n = 0;
      (void)!::read(wake.get(), &n, sizeof(n));
    }

    const launch_options opts;
    const std::string participant;
    const event_log events;
    internal::unique_fd wake;
    std::mutex mu;
    std::condition_variable cv;
    bool wanted = false;
    bool in_round = false;
    bool stopping = false;
    bool finished = false;
    bool leave_done = false;
    std::size_t round_world = 0;
    std::int64_t single_rounds = 0;
    std::optional<round> ready;
    std::string change;
    std::string error;
  };

  static rendezvous::rendezvous_options options_of(const shared& s) {
    rendezvous::rendezvous_options r;
    r.run_id = s.opts.run_id;
    r.min_ranks = static_cast<int>(s.opts.min_nodes);
    r.max_ranks = static_cast<int>(s.opts.max_nodes);
    r.participant_id = s.participant;
    r.peer_address = s.opts.host_addr;
    r.key_prefix = "/elastic-hosts";  // never the workers' own rendezvous of the same run
    r.events = s.events;
    return r;
  }

  /// Why a membership change ends this host's round ("" when it does not): a host that left
  /// on purpose (its workers finished) does not.
  static std::string reason(const rendezvous::membership_change& ch, std::size_t round_world, std::size_t max_nodes) {
    std::vector<std::string> gone;
    for (const auto& d : ch.departed) {
      if (std::find(ch.left.begin(), ch.left.end(), d) == ch.left.end()) gone.push_back(d);
    }
    if (ch.self_lost) return "this host's own membership lapsed (it was cut off or frozen)";
    if (ch.round_advanced) return "another host started the next round (a worker failed there)";
    if (!gone.empty()) return fmt::format("host {} is gone", fmt::join(gone, ", "));
    if (!ch.joining.empty() && round_world < max_nodes) {
      return fmt::format("host {} is waiting to join", fmt::join(ch.joining, ", "));
    }
    return {};
  }

  /// The thread: joins rounds when asked, and watches the one it is in.
  static void serve(shared& s) {
    std::unique_ptr<rendezvous::store> store;
    std::unique_ptr<rendezvous::rendezvous> rdzv;
    const std::string addr = s.opts.host_addr;
    const auto make_bootstrap = [addr](const rendezvous::round_info&) {
      return fmt::format("{}\n{}", addr, detail::free_port(addr));
    };
    auto fail = [&](std::string why) {
      std::lock_guard lk(s.mu);
      s.error = std::move(why);
      s.ring();
    };
    try {
      store = rendezvous::open_store(s.opts.rdzv);
      rdzv = std::make_unique<rendezvous::rendezvous>(*store, options_of(s));
      bool joined = false;
      for (;;) {
        bool want = false;
        {
          std::unique_lock lk(s.mu);
          s.cv.wait_for(lk, poll_period, [&] { return s.wanted || s.stopping; });
          if (s.stopping) break;
          want = std::exchange(s.wanted, false);
        }
        if (want) {
          const auto info = joined ? rdzv->next_round(make_bootstrap) : rdzv->join(make_bootstrap);
          joined = true;
          const auto nl = info.bootstrap.find('\n');
          if (nl == std::string::npos) {
            throw error(errc::corrupt, fmt::format("round {} of the hosts: the leader's MASTER_ADDR/PORT record is damaged",
                                                   info.round));
          }
          round r{.number = info.round,
                  .rank = static_cast<std::size_t>(info.rank),
                  .world = static_cast<std::size_t>(info.world_size),
                  .master_addr = info.bootstrap.substr(0, nl),
                  .master_port = static_cast<std::uint16_t>(std::stoul(info.bootstrap.substr(nl + 1)))};
          std::lock_guard lk(s.mu);
          s.ready = std::move(r);
          s.in_round = true;
          s.round_world = static_cast<std::size_t>(info.world_size);
          s.ring();
          continue;
        }
        std::size_t world = 0;
        {
          std::lock_guard lk(s.mu);
          if (!s.in_round) continue;
          world = s.round_world;
        }
        if (auto why = reason(rdzv->poll(), world, s.opts.max_nodes); !why.empty()) {
          std::lock_guard lk(s.mu);
          if (!s.in_round || s.wanted) continue;  // the loop left that round meanwhile
          s.change = std::move(why);
          s.in_round = false;
          s.ring();
        }
      }
    } catch (const error& e) {
      fail(e.message());
    } catch (const std::exception& e) {
      fail(fmt::format("the rounds of hosts: {}", e.what()));
    }
    bool done = false;
    {
      std::lock_guard lk(s.mu);
      done = s.leave_done;
    }
    if (rdzv) rdzv->leave(done);
    std::lock_guard lk(s.mu);
    s.finished = true;
    s.cv.notify_all();
  }

  /// How often the round this host is in is looked at: a few store reads per host per period.
  static constexpr std::chrono::milliseconds poll_period{200};

  std::shared_ptr<shared> s_;
  std::thread thread_;
};

}  // namespace elastic::agent
