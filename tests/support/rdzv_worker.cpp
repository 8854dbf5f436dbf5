// A participant of a rendezvous, for the multi-process tests. It reports on stdout, one line per
// event, so the test can read what each participant saw:
//
//   rdzv_worker STORE RUN MIN MAX ID MODE [--hb MS] [--hb-timeout MS] [--last-call MS]
//                                         [--join-timeout MS] [--poll MS] [--life MS]
//                                         [--peer-silence MS]
//     STORE  an shm store's name, or a store URL (shm://NAME, etcd://HOST:PORT)
//     ID     the participant id, or - for the default (HOST:PID:RANDOM)
//     MODE   once: join one round, report it, leave (exit 0)
//            stay: join, then poll every --poll MS; on a change report it and form the next
//                  round; leave after --life MS (exit 0)
//
//   round N rank R world W members A,B,C bootstrap B     a round this participant is in
//   change departed=A,B joining=C advanced=0|1 lost=0|1  what poll() saw
//   error CODE MESSAGE                                   join() failed (exit 3; 75 when a
//                                                        preemption notice, SIGTERM, cut it short)
//
// The leader's bootstrap is "boot:<leader id>:<round>". Events go to ELASTIC_EVENTS when set.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include <elastic/checkpoint/preemption.hpp>
#include <elastic/rendezvous/open_store.hpp>
#include <elastic/rendezvous/rendezvous.hpp>
#include <elastic/rendezvous/shm_store.hpp>

namespace {

void say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

std::string round_line(const elastic::rendezvous::round_info& r) {
  return fmt::format("round {} rank {} world {} members {} bootstrap {}", r.round, r.rank, r.world_size,
                     elastic::rendezvous::detail::join_names(r.members), r.bootstrap);
}

}  // namespace

int main(int argc, char** argv) {
  using std::chrono::milliseconds;
  namespace rdzv = elastic::rendezvous;
  if (argc < 7) {
    std::fprintf(stderr, "usage: rdzv_worker STORE RUN MIN MAX ID once|stay [options]\n");
    return 2;
  }
  rdzv::rendezvous_options o;
  o.run_id = argv[2];
  o.min_ranks = static_cast<int>(elastic::internal::parse_integer(argv[3]).value_or(0));
  o.max_ranks = static_cast<int>(elastic::internal::parse_integer(argv[4]).value_or(0));
  if (std::string_view(argv[5]) != "-") o.participant_id = argv[5];
  const std::string mode = argv[6];
  o.heartbeat_interval = milliseconds(100);
  o.heartbeat_timeout = milliseconds(500);
  o.last_call_timeout = milliseconds(200);
  o.join_timeout = milliseconds(10000);
  milliseconds poll(20), life(60000);
  for (int i = 7; i + 1 < argc; i += 2) {
    const std::string_view k = argv[i];
    const milliseconds v(std::strtol(argv[i + 1], nullptr, 10));
    if (k == "--hb") o.heartbeat_interval = v;
    else if (k == "--hb-timeout") o.heartbeat_timeout = v;
    else if (k == "--last-call") o.last_call_timeout = v;
    else if (k == "--join-timeout") o.join_timeout = v;
    else if (k == "--poll") poll = v;
    else if (k == "--life") life = v;
    else if (k == "--peer-silence") {
      o.peer_silence_timeout = v;
      o.peer_heartbeat_interval = std::min(o.peer_heartbeat_interval, v / 4);
    }
    else {
      std::fprintf(stderr, "rdzv_worker: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (!std::getenv("ELASTIC_EVENTS")) o.events = elastic::event_log();
  const std::string id = o.participant_id;
  auto boot = [](const rdzv::round_info& r) { return fmt::format("boot:{}:{}", r.leader, r.round); };
  try {
    const elastic::preemption_handler notices;  // SIGTERM: a notice the rendezvous honours
    const std::string_view where = argv[1];
    std::unique_ptr<rdzv::store> store;
    if (where.find("://") != std::string_view::npos) store = rdzv::open_store(where);
    else store = std::make_unique<rdzv::shm_store>(argv[1]);
    rdzv::rendezvous rv(*store, o);
    say(round_line(rv.join(boot)));
    if (mode == "once") return 0;
    const auto until = std::chrono::steady_clock::now() + life;
    while (std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(poll);
      const auto ch = rv.poll();
      if (!ch.any()) continue;
      say(fmt::format("change departed={} joining={} advanced={} lost={}", rdzv::detail::join_names(ch.departed),
                      rdzv::detail::join_names(ch.joining), ch.round_advanced ? 1 : 0, ch.self_lost ? 1 : 0));
      say(round_line(rv.next_round(boot)));
    }
    return 0;
  } catch (const elastic::error& e) {
    say(fmt::format("error {} {}", elastic::to_string(e.code()), e.what()));
    return e.code() == elastic::errc::interrupted ? elastic::exit_preempted : 3;
  }
}
