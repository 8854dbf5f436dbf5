// One process of rendezvous_scale: it hosts one or more participants of a run's rendezvous over
// etcd, each with its own etcd_store (its own connections, its own lease) and its own rendezvous
// object on its own thread, so that etcd sees as many independent clients as there are
// participants. Each participant does what an elastic_group does with its rendezvous: join(),
// then the membership watcher's poll() every --poll-ms (comm/group_options.hpp's poll_interval,
// a fixed delay between polls as internal::periodic_thread sleeps), and next_round() as soon as a
// poll sees any change. It uses the library's public API only (join, poll, next_round), so the
// benchmark measures whatever rendezvous.hpp does.
//
//   rendezvous_participant [--store=URL] --run=ID --min=M --max=N --ids=A,B,... --go=FILE
//                          [--poll-ms=50] [--hb-interval-ms=500] [--hb-timeout-ms=2000]
//                          [--last-call-ms=30000] [--join-timeout-ms=600000] [--sample-ms=250]
//                          [--report=PREFIX]
//
// As elastic-run's worker (rendezvous_scale --launcher), one launcher per host: without --store it
// takes the launcher's store relay from ELASTIC_RDZV; --ids=A,B;C,D gives each worker slot its
// own participants (ELASTIC_LOCAL_RANK picks the group); --report=PREFIX sends the lines below to
// the file PREFIX<local rank> instead of stdout (the launcher's console is not the driver's). A
// restarted worker (ELASTIC_RESTART_COUNT > 0, the benchmark's SIGKILLed victim) only sleeps: a
// participant the benchmark killed stays gone.
//
// It reports on stdout, one line each (CLOCK_MONOTONIC nanoseconds, comparable across processes):
//   ready PID                         every store and rendezvous object is made
//   round ID ROUND WORLD T_NS         participant ID completed join()/next_round() at T_NS
//   noticed ID ROUND T_NS             its poll() in ROUND saw a change at T_NS (before next_round())
//   requests BUCKET TOTAL             HTTP requests all of this process's stores sent so far, read
//                                     at the tick BUCKET * sample-ms (ticks aligned on the clock,
//                                     so every process reads at the same instants)
//   error ID MESSAGE                  join()/next_round() threw: that participant stops
// Participants wait for the file --go to exist before joining (the driver's start line). The
// process dies with its parent (PR_SET_PDEATHSIG): the driver SIGKILLs it at the end anyway.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <elastic/internal/env.hpp>
#include <elastic/internal/file.hpp>
#include <elastic/internal/unique_fd.hpp>
#include <elastic/rendezvous/etcd_store.hpp>
#include <elastic/rendezvous/relay_store.hpp>
#include <elastic/rendezvous/rendezvous.hpp>

namespace {

namespace rdzv = elastic::rendezvous;
using std::chrono::milliseconds;

std::mutex out_mu;
elastic::internal::unique_fd report_fd;  // the --report file; stdout without one
void say(const std::string& line) {
  std::lock_guard lk(out_mu);
  elastic::internal::write_all_best_effort(report_fd ? report_fd.get() : STDOUT_FILENO, line + '\n');
}

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct participant {
  std::unique_ptr<rdzv::store> store;
  rdzv::etcd_store* etcd = nullptr;  // the store when it is etcd's client itself (not a relay)
  std::unique_ptr<rdzv::rendezvous> rdzv;
  std::string id;
};

void run(participant& p, milliseconds poll_every) {
  try {
    auto info = p.rdzv->join();
    say(fmt::format("round {} {} {} {}", p.id, info.round, info.world_size, now_ns()));
    for (;;) {
      std::this_thread::sleep_for(poll_every);
      rdzv::membership_change ch;
      try {
        ch = p.rdzv->poll();
      } catch (const elastic::error&) {
        continue;  // the watcher reports a store that does not answer and polls again
      }
      if (!ch.any()) continue;
      say(fmt::format("noticed {} {} {}", p.id, info.round, now_ns()));
      info = p.rdzv->next_round();
      say(fmt::format("round {} {} {} {}", p.id, info.round, info.world_size, now_ns()));
    }
  } catch (const std::exception& e) {
    std::string msg = e.what();
    for (auto& c : msg)
      if (c == '\n') c = ' ';
    say(fmt::format("error {} {}", p.id, msg));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const pid_t parent = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) return 1;

  std::string store_url, run_id, go, ids, report;
  long long min_ranks = 0, max_ranks = 0, poll_ms = 50, hb_interval_ms = 500, hb_timeout_ms = 2000,
            last_call_ms = 30000, join_timeout_ms = 600000, sample_ms = 250;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto eq = a.find('=');
    const auto key = a.substr(0, eq);
    const std::string value(eq == std::string_view::npos ? std::string_view() : a.substr(eq + 1));
    auto number = [&](long long& out) {
      const auto n = elastic::internal::parse_integer(value);
      if (!n || *n <= 0) {
        std::fprintf(stderr, "rendezvous_participant: %s needs a positive number\n", std::string(key).c_str());
        std::exit(2);
      }
      out = *n;
    };
    if (key == "--store") store_url = value;
    else if (key == "--run") run_id = value;
    else if (key == "--go") go = value;
    else if (key == "--ids") ids = value;
    else if (key == "--report") report = value;
    else if (key == "--min") number(min_ranks);
    else if (key == "--max") number(max_ranks);
    else if (key == "--poll-ms") number(poll_ms);
    else if (key == "--hb-interval-ms") number(hb_interval_ms);
    else if (key == "--hb-timeout-ms") number(hb_timeout_ms);
    else if (key == "--last-call-ms") number(last_call_ms);
    else if (key == "--join-timeout-ms") number(join_timeout_ms);
    else if (key == "--sample-ms") number(sample_ms);
    else {
      std::fprintf(stderr, "rendezvous_participant: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (store_url.empty()) store_url = elastic::internal::env_string("ELASTIC_RDZV").value_or("");
  if (store_url.empty() || run_id.empty() || go.empty() || ids.empty() || max_ranks == 0) {
    std::fprintf(stderr, "usage: rendezvous_participant [--store=URL] --run=ID --min=M --max=N --ids=A,B --go=FILE\n");
    return 2;
  }
  // Under elastic-run: this slot's group of ids, and nothing at all once restarted.
  const long slot = elastic::internal::env_index_or_none("ELASTIC_LOCAL_RANK").value_or(0);
  if (ids.find(';') != std::string::npos) {
    std::vector<std::string> groups;
    std::istringstream in(ids);
    for (std::string g; std::getline(in, g, ';');) groups.push_back(g);
    if (static_cast<std::size_t>(slot) >= groups.size()) {
      std::fprintf(stderr, "rendezvous_participant: no group of --ids for ELASTIC_LOCAL_RANK=%ld\n", slot);
      return 2;
    }
    ids = groups[static_cast<std::size_t>(slot)];
  }
  if (elastic::internal::env_index_or_none("ELASTIC_RESTART_COUNT").value_or(0) > 0) {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // the launcher ends us
  }
  if (!report.empty()) {
    const std::string path = report + std::to_string(slot);
    report_fd = elastic::internal::unique_fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    if (!report_fd) {
      std::fprintf(stderr, "rendezvous_participant: cannot open %s\n", path.c_str());
      return 2;
    }
  }

  std::vector<participant> ps;
  for (std::size_t from = 0; from <= ids.size();) {
    const auto comma = std::min(ids.find(',', from), ids.size());
    participant p;
    p.id = ids.substr(from, comma - from);
    rdzv::rendezvous_options o;
    o.run_id = run_id;
    o.participant_id = p.id;
    o.min_ranks = static_cast<int>(min_ranks);
    o.max_ranks = static_cast<int>(max_ranks);
    o.heartbeat_interval = milliseconds(hb_interval_ms);
    o.heartbeat_timeout = milliseconds(hb_timeout_ms);
    o.last_call_timeout = milliseconds(last_call_ms);
    o.join_timeout = milliseconds(join_timeout_ms);
    o.events = elastic::event_log{};  // no events file: nothing but the store's own traffic
    if (store_url.starts_with("relay://")) {
      p.store = std::make_unique<rdzv::relay_store>(store_url.substr(8));
    } else {
      auto e = std::make_unique<rdzv::etcd_store>(store_url);
      p.etcd = e.get();
      p.store = std::move(e);
    }
    p.rdzv = std::make_unique<rdzv::rendezvous>(*p.store, std::move(o));
    ps.push_back(std::move(p));
    from = comma + 1;
  }
  // The request counter, read at ticks aligned on the monotonic clock, for the driver to add up
  // across processes tick by tick; from before the start line, so the driver has every tick of
  // the first round.
  std::jthread sampler([&ps, step = sample_ms * 1'000'000](std::stop_token st) {
    for (std::int64_t bucket = now_ns() / step + 1; !st.stop_requested(); ++bucket) {
      std::this_thread::sleep_until(std::chrono::steady_clock::time_point(std::chrono::nanoseconds(bucket * step)));
      std::uint64_t total = 0;
      for (const auto& p : ps) total += p.etcd ? p.etcd->requests() : 0;  // a relay's are the driver's to count
      say(fmt::format("requests {} {}", bucket, total));
    }
  });
  say(fmt::format("ready {}", ::getpid()));
  // The driver's start line; bounded by the driver, which SIGKILLs us when it gives up.
  while (!std::filesystem::exists(go)) std::this_thread::sleep_for(milliseconds(1));

  std::vector<std::jthread> threads;
  for (auto& p : ps) threads.emplace_back([&p, poll_ms] { run(p, milliseconds(poll_ms)); });
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));  // the driver SIGKILLs us
}
