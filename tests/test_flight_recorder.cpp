// The flight recorder (comm/detail/flight_recorder.hpp) and the culprit it points at
// (comm/detail/flight_culprit.hpp): real processes record, are killed, and are read from outside;
// under elastic-run, a 4-rank group where one rank hangs before a collective names that rank.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "support/catch.hpp"
#include "support/launched_run.hpp"
#include "support/planted_shm.hpp"
#include "support/process.hpp"

#include <elastic/comm/detail/flight_culprit.hpp>
#include <elastic/comm/detail/flight_recorder.hpp>
#include <elastic/comm/detail/group_flight.hpp>
#include <elastic/error.hpp>
#include <elastic/rendezvous/shm_store.hpp>

namespace cd = elastic::comm::detail;
using namespace std::chrono_literals;

namespace {

bool shm_exists(const std::string& name) {
  struct stat st {};
  return ::stat(("/dev/shm/" + name).c_str(), &st) == 0;
}

/// A child that records round `round` as rank `rank` of `world`: `done` collectives that
/// complete, then (when `inside`) one more it never leaves; it then says so on its pipe and
/// waits to be killed.
struct recording_child {
  pid_t pid = -1;
  std::string name;
  recording_child(const std::string& run, std::int64_t round, int rank, int world, int done, bool inside) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(fds[0]);
      {
        cd::flight_recorder rec(run);
        rec.begin_round(round, rank, world);
        for (int i = 0; i < done; ++i) {
          rec.enter(i % 2 ? "broadcast" : "allreduce", 4096);
          rec.leave(true);
        }
        if (inside) rec.enter("allreduce", 4096);
        const char c = 'r';
        (void)!::write(fds[1], &c, 1);
        for (;;) ::pause();  // killed here: the recorder's destructor never runs
      }
    }
    ::close(fds[1]);
    char c = 0;
    REQUIRE(::read(fds[0], &c, 1) == 1);
    ::close(fds[0]);
    name = cd::flight_name(run, pid);
  }
  void kill() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
  }
  ~recording_child() {
    kill();
    ::shm_unlink(("/" + name).c_str());
  }
};

std::string run_name(const char* base) { return std::string(base) + "-" + std::to_string(::getpid()); }

/// The flight objects of run `run` in /dev/shm.
std::vector<std::string> flight_objects(const std::string& run) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const auto n = e.path().filename().string();
    if (n.rfind(cd::flight_prefix(run), 0) == 0) out.push_back(n);
  }
  return out;
}

/// Runs `f` in a child process and returns its exit code, or -1 when it did not end within
/// `timeout` (it is killed then): a reader that blocks fails the test instead of hanging it.
int bounded_child(const std::function<int()>& f, std::chrono::milliseconds timeout = 5s) {
  const pid_t pid = elastic::test::fork_child(f);
  REQUIRE(pid >= 0);
  const auto until = std::chrono::steady_clock::now() + timeout;
  int st = 0;
  while (::waitpid(pid, &st, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= until) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      return -1;
    }
    std::this_thread::sleep_for(5ms);
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/// Writes a flight object `name` by hand, as a process that lies would: its head says `pid`,
/// rank `rank` of `world` in `round`, and one collective #`index` it is inside.
void forge_flight(const std::string& name, long pid, std::int64_t round, int rank, std::int64_t world,
                  std::uint64_t index) {
  const int fd = ::shm_open(("/" + name).c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, static_cast<off_t>(cd::flight_bytes)) == 0);
  void* p = ::mmap(nullptr, cd::flight_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  REQUIRE(p != MAP_FAILED);
  {
    const cd::flight_mapping map(p, cd::flight_bytes);
    auto& h = map.head();
    h.version = cd::flight_version;
    h.capacity = cd::flight_capacity;
    h.pid = pid;
    h.round.store(round);
    h.rank.store(rank);
    h.world.store(world);
    h.entered.store(index);
    auto& s = map.slot(0, index);
    s.round.store(round);
    s.rank.store(rank);
    s.world.store(world);
    s.op[0].store(0x6563756465726c6cull);  // "llreduce": any 16 bytes
    s.op[1].store(0x4141414141414141ull);
    s.bytes.store(~0ull);
    s.entered_ns.store(1);
    s.outcome.store(0);
    s.index.store(index);
    h.magic.store(cd::flight_magic);
  }
}

/// Sets the world of every collective on record in the flight object `name` to `world` (the
/// object of a live process, which goes on writing it).
void claim_world(const std::string& name, std::int64_t world) {
  const int fd = ::shm_open(("/" + name).c_str(), O_RDWR, 0);
  REQUIRE(fd >= 0);
  void* p = ::mmap(nullptr, cd::flight_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  REQUIRE(p != MAP_FAILED);
  const cd::flight_mapping map(p, cd::flight_bytes);
  map.head().world.store(world);
  for (unsigned area = 0; area < 2; ++area)
    for (std::uint64_t k = 1; k <= cd::flight_capacity; ++k) map.slot(area, k).world.store(world);
}

/// The records of run `run` once `count` of them are in a round: their rounds by name.
std::vector<std::pair<std::string, std::int64_t>> wait_for_rounds(const std::string& run, std::size_t count,
                                                                  std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::vector<std::pair<std::string, std::int64_t>> out;
    for (const auto& n : flight_objects(run)) {
      try {
        if (const auto l = cd::read_flight(n); l && l->round >= 0) out.emplace_back(n, l->round);
      } catch (const elastic::error&) {
      }
    }
    if (out.size() >= count || std::chrono::steady_clock::now() >= until) return out;
    std::this_thread::sleep_for(5ms);
  }
}

/// The peak resident memory of process `pid` in kB (VmHWM), or -1.
long peak_kb(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

}  // namespace

TEST_CASE("a killed process's collectives are read back from outside it") {
  recording_child child(run_name("fr-killed"), 3, 2, 4, 5, true);
  auto check = [&] {
    const auto log = cd::read_flight(child.name);
    REQUIRE(log);
    CHECK(log->pid == child.pid);
    CHECK(log->rank == 2);
    CHECK(log->world == 4);
    CHECK(log->round == 3);
    REQUIRE(log->entries.size() == 6);
    for (std::size_t i = 0; i < 5; ++i) {
      CHECK(log->entries[i].index == i + 1);
      CHECK(log->entries[i].outcome == cd::flight_outcome::done);
      CHECK(log->entries[i].left_ns >= log->entries[i].entered_ns);
    }
    CHECK(log->entries[1].op == "broadcast");
    const auto& last = log->entries.back();
    CHECK(last.index == 6);
    CHECK(last.op == "allreduce");
    CHECK(last.bytes == 4096);
    CHECK(last.rank == 2);
    CHECK(last.outcome == cd::flight_outcome::inside);
    CHECK(last.left_ns == 0);
  };
  check();
  const pid_t was = child.pid;
  child.kill();
  CHECK(shm_exists(child.name));  // what a killed process recorded outlives it
  {
    const auto log = cd::read_flight(child.name);
    REQUIRE(log);
    CHECK(log->pid == was);
    CHECK(log->entries.back().outcome == cd::flight_outcome::inside);
  }
}

TEST_CASE("a recorder that ends normally leaves nothing behind") {
  const std::string run = run_name("fr-normal");
  std::string name;
  {
    cd::flight_recorder rec(run);
    name = rec.name();
    CHECK(shm_exists(name));
    rec.begin_round(1, 0, 1);
    rec.enter("barrier", 0);
    rec.leave(true);
  }
  CHECK_FALSE(shm_exists(name));
  CHECK_FALSE(cd::read_flight(name));
}

TEST_CASE("the round before a rebuild stays readable while the next one records") {
  const std::string run = run_name("fr-rounds");
  cd::flight_recorder rec(run);
  rec.begin_round(1, 1, 4);
  for (int i = 0; i < 10; ++i) {
    rec.enter("allreduce", 8);
    rec.leave(i != 9);  // the last one failed: a peer did not come
  }
  rec.begin_round(2, 0, 3);
  for (int i = 0; i < 100; ++i) {  // more than a ring holds
    rec.enter("allreduce", 8);
    rec.leave(true);
  }
  const auto log = cd::read_flight(rec.name());
  REQUIRE(log);
  CHECK(log->round == 2);
  CHECK(log->rank == 0);
  std::vector<const cd::flight_entry*> one, two;
  for (const auto& e : log->entries) (e.round == 1 ? one : two).push_back(&e);
  REQUIRE(one.size() == 10);
  CHECK(one.back()->index == 10);
  CHECK(one.back()->rank == 1);
  CHECK(one.back()->world == 4);
  CHECK(one.back()->outcome == cd::flight_outcome::failed);
  REQUIRE(two.size() == cd::flight_capacity);
  CHECK(two.front()->index == 100 - cd::flight_capacity + 1);
  CHECK(two.back()->index == 100);
  CHECK(two.back()->world == 3);
}

TEST_CASE("an object that is not a flight recorder of this version is not read") {
  const std::string name = cd::flight_name(run_name("fr-junk"), 1);
  const int fd = ::shm_open(("/" + name).c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  REQUIRE(fd >= 0);
  SECTION("too short") { REQUIRE(::write(fd, "junk", 4) == 4); }
  SECTION("garbage of the right size") {
    std::vector<char> junk(cd::flight_bytes, 'x');
    REQUIRE(::write(fd, junk.data(), junk.size()) == static_cast<ssize_t>(junk.size()));
  }
  ::close(fd);
  CHECK_FALSE(cd::read_flight(name));
  CHECK_FALSE(cd::read_flight(cd::flight_name("no-such-run", 1)));
  ::shm_unlink(("/" + name).c_str());
}

TEST_CASE("a FIFO, socket or device planted under a flight record's name is refused without blocking the reader") {
  for (const auto kind : elastic::test::plantable_kinds()) {
    const std::string what = elastic::test::planted_words(kind);
    INFO(what);
    const elastic::test::planted_shm planted(cd::flight_name(run_name("fr-planted"), 4194302), kind);
    // In a child: today's reader waits forever in the open of a FIFO.
    const int code = bounded_child([&] {
      try {
        return cd::read_flight(planted.name()) ? 1 : 2;
      } catch (const elastic::error& e) {
        return e.code() == elastic::errc::unsafe_path &&
                       std::string(e.what()).find(planted.path() + " is " + what) != std::string::npos
                   ? 0
                   : 3;
      }
    });
    CHECK(code == 0);  // -1: blocked; 2: not refused; 3: refused without saying what is there
    CHECK(planted.intact());
  }
}

TEST_CASE("of four processes, the rank that never entered collective #k is named") {
  const std::string run = run_name("fr-culprit");
  // Ranks 0, 1 and 3 wait inside #6; rank 2 left #5 and never came (hung in its own code).
  std::vector<std::unique_ptr<recording_child>> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(std::make_unique<recording_child>(run, 7, r, 4, 5, r != 2));
  std::vector<cd::flight_log> logs;
  for (const auto& c : ranks) {
    auto l = cd::read_flight(c->name);
    REQUIRE(l);
    logs.push_back(std::move(*l));
  }
  const auto rep = cd::find_culprit(logs, 7);
  REQUIRE(rep);
  CHECK(rep->culprits == std::vector<int>{2});
  CHECK(rep->index == 6);
  CHECK(rep->op == "allreduce");
  CHECK(rep->inside == std::vector<int>{0, 1, 3});
  CHECK(rep->ranks[2].pid == ranks[2]->pid);
  CHECK(rep->ranks[2].index == 5);
  const std::string text = rep->text(elastic::internal::monotonic_ns());
  INFO(text);
  CHECK(text.find("rank 2 never entered collective #6 (allreduce") != std::string::npos);
  CHECK(text.find("rank 0: inside #6 allreduce") != std::string::npos);
  CHECK_FALSE(cd::find_culprit(logs, 8));  // no record of that round
}

TEST_CASE("a culprit is named only where some rank was behind the others") {
  auto entry = [](int rank, std::uint64_t index, cd::flight_outcome o) {
    cd::flight_entry e;
    e.round = 4;
    e.rank = rank;
    e.world = 3;
    e.index = index;
    e.op = "allreduce";
    e.outcome = o;
    return e;
  };
  auto log_of = [](long pid, std::vector<cd::flight_entry> es) {
    cd::flight_log l;
    l.pid = pid;
    l.round = 4;
    l.entries = std::move(es);
    return l;
  };
  SECTION("every rank entered the newest collective: nobody to blame") {
    const std::vector<cd::flight_log> logs{log_of(1, {entry(0, 9, cd::flight_outcome::inside)}),
                                           log_of(2, {entry(1, 9, cd::flight_outcome::failed)}),
                                           log_of(3, {entry(2, 9, cd::flight_outcome::inside)})};
    CHECK_FALSE(cd::find_culprit(logs, 4));
  }
  SECTION("a rank with no record is blamed only when the caller says it should have one") {
    const std::vector<cd::flight_log> logs{log_of(1, {entry(0, 9, cd::flight_outcome::inside)}),
                                           log_of(3, {entry(2, 9, cd::flight_outcome::inside)})};
    CHECK_FALSE(cd::find_culprit(logs, 4));
    const auto rep = cd::find_culprit(logs, 4, true);
    REQUIRE(rep);
    CHECK(rep->culprits == std::vector<int>{1});
    CHECK(rep->text(0).find("rank 1: no collective of this round on record") != std::string::npos);
  }
  SECTION("ranks that left #k failed are not culprits; the two behind are") {
    const std::vector<cd::flight_log> logs{log_of(1, {entry(0, 8, cd::flight_outcome::done)}),
                                           log_of(2, {entry(1, 9, cd::flight_outcome::failed)}),
                                           log_of(3, {entry(2, 7, cd::flight_outcome::done)})};
    const auto rep = cd::find_culprit(logs, 4);
    REQUIRE(rep);
    CHECK(rep->culprits == std::vector<int>{0, 2});
    CHECK(rep->failed == std::vector<int>{1});
    CHECK(rep->text(0).find("ranks 0,2 never entered collective #9") != std::string::npos);
  }
}

TEST_CASE("through the store, the next round names the rank that wrote nothing while the others were in #k") {
  const std::string name = run_name("fr-store");
  elastic::rendezvous::shm_store::remove(name);
  elastic::rendezvous::shm_store store(name);
  elastic::test::temp_dir dir;
  const auto log = elastic::event_log::to_file(dir.file("events.jsonl"));
  const std::int64_t now = elastic::internal::monotonic_ns();
  // Round 3 of 4: ranks 0 and 3 failed in #12, rank 1 was still inside it, rank 2 wrote nothing.
  cd::publish_last_collective(store, "/P", 3, 0, 4, {12, "allreduce", cd::flight_outcome::failed, now - 2'000'000'000, now});
  cd::publish_last_collective(store, "/P", 3, 1, 4, {12, "allreduce", cd::flight_outcome::inside, now - 2'000'000'000, 0});
  cd::publish_last_collective(store, "/P", 3, 3, 4, {12, "allreduce", cd::flight_outcome::failed, now - 2'000'000'000, now});
  const auto logs = cd::read_last_collectives(store, "/P", 3);
  REQUIRE(logs.size() == 3);
  cd::report_culprit(store, "/P", 3, log);
  const auto found = elastic::test::events_named(dir.file("events.jsonl"), "group_culprit");
  REQUIRE(found.size() == 1);
  INFO(found.front());
  CHECK(found.front().find("\"source\":\"group\"") != std::string::npos);
  CHECK(found.front().find("\"culprits\":\"2\"") != std::string::npos);
  CHECK(found.front().find("\"collective\":12") != std::string::npos);
  CHECK(found.front().find("rank 2: no collective of this round on record") != std::string::npos);
  // A round everyone reported from the same collective has no culprit; nor has one nobody wrote.
  cd::report_culprit(store, "/P", 4, log);
  CHECK(elastic::test::events_named(dir.file("events.jsonl"), "group_culprit").size() == 1);
  elastic::rendezvous::shm_store::remove(name);
}

#if defined(ELASTIC_RUN_TOOL) && defined(ELASTIC_DIGITS_TRAIN)
TEST_CASE("under elastic-run, a 4-rank group where one rank hangs before collective #k names that rank") {
  elastic::test::temp_dir dir;
  // Worker 1 hangs in step 40 before its allreduce; the others wait in it until their collective
  // timeout (1 s: a third of the step timeout), then the watchdog kills worker 1 at 3 s.
  elastic::test::launched_run l(ELASTIC_RUN_TOOL, "fr-hang",
                                {"--nproc-per-node", "4", "--min-ranks", "2", "--max-restarts", "3", "--step-timeout", "3"},
                                {ELASTIC_DIGITS_TRAIN, "--steps", "60", "--every", "25", "--step-sleep-ms", "15", "--ckpt",
                                 dir.file("ckpt"), "--hang-rank", "1", "--hang-at", "40"});
  const int code = l.finish(120s);
  const std::string err = l.err();
  const std::string& run = l.run;
  INFO(err);
  REQUIRE(code >= 0);
  CHECK(code == 0);
  const auto found = elastic::test::events_named(l.dir.path() + "/" + run + "/events.jsonl", "group_culprit");
  REQUIRE_FALSE(found.empty());
  INFO(found.front());
  CHECK(found.front().find("\"culprits\":\"1\"") != std::string::npos);
  CHECK(found.front().find("\"source\":\"launcher\"") != std::string::npos);
  // The group says the same through the store (its rank 0, once the survivors rebuilt).
  bool from_group = false;
  for (const auto& f : found) from_group = from_group || (f.find("\"source\":\"group\"") != std::string::npos &&
                                                          f.find("\"culprits\":\"1\"") != std::string::npos);
  CHECK(from_group);
  CHECK(found.front().find("\"op\":\"allreduce\"") != std::string::npos);
  CHECK(err.find("culprit          round 1: rank 1 never entered collective #") != std::string::npos);
  // The records of the run are gone with it: the killed worker's too.
  CHECK(flight_objects(run).empty());
}

namespace {

/// As in the test above, worker 1 of 4 hangs before an allreduce and is killed by the watchdog,
/// only later (step 150: some seconds of training first, to look at the records meanwhile).
struct hanging_run {
  static std::vector<std::string> options() {
    return {"--nproc-per-node", "4", "--min-ranks", "2", "--max-restarts", "3", "--step-timeout", "3"};
  }
  elastic::test::temp_dir dir;
  elastic::test::launched_run l;
  explicit hanging_run(const std::string& tag)
      : l(ELASTIC_RUN_TOOL, tag, options(),
          {ELASTIC_DIGITS_TRAIN, "--steps", "400", "--every", "100", "--step-sleep-ms", "15", "--ckpt", dir.file("ckpt"),
           "--hang-rank", "1", "--hang-at", "150"}) {}
};

}  // namespace

TEST_CASE("under elastic-run, forged flight records neither cost the launcher memory nor get healthy ranks blamed") {
  // Meanwhile a process that is no worker of the run lies in a record of the run (rank 0, far
  // ahead, in a world of a million), and a healthy worker's record is made to claim a world of
  // a million.
  hanging_run h("fr-forged");
  auto& l = h.l;
  const auto rounds = wait_for_rounds(l.run, 4, 60s);
  REQUIRE(rounds.size() == 4);
  const std::int64_t round = rounds.front().second;
  auto liar = elastic::test::child_process::spawn({"/bin/sleep", "600"});
  const std::string forged = cd::flight_name(l.run, liar.pid());
  forge_flight(forged, liar.pid(), round, 0, 1'000'000, 1'000'000);
  // A healthy rank's record (not rank 1's: the hung one's record is what names it).
  std::string healthy;
  for (const auto& [name, r] : rounds) {
    const auto log = cd::read_flight(name);
    if (log && log->rank != 1 && log->rank != 0) healthy = name;
  }
  REQUIRE_FALSE(healthy.empty());
  claim_world(healthy, 1'000'000);
  const std::string events = l.dir.path() + "/" + l.run + "/events.jsonl";
  std::vector<std::string> from_launcher;
  const auto until = std::chrono::steady_clock::now() + 90s;
  while (from_launcher.empty() && std::chrono::steady_clock::now() < until) {
    for (const auto& f : elastic::test::events_named(events, "group_culprit"))
      if (f.find("\"source\":\"launcher\"") != std::string::npos) from_launcher.push_back(f);
    std::this_thread::sleep_for(10ms);
  }
  const long peak = peak_kb(l.proc.pid());
  const int code = l.finish(120s);
  const std::string err = l.err();
  INFO(err.substr(0, 8000));
  CHECK(code == 0);
  REQUIRE_FALSE(from_launcher.empty());
  for (const auto& f : from_launcher) {
    INFO(f.substr(0, 2000));
    CHECK(f.find("\"culprits\":\"1\"") != std::string::npos);  // nobody healthy blamed
    CHECK(f.find("\"world_size\":4") != std::string::npos);
    CHECK(f.size() < 16384);
  }
  // Today's launcher builds a record per claimed rank (hundreds of MB) and writes them all out.
  CHECK(peak > 0);
  CHECK(peak < 100 * 1024);
  CHECK(elastic::test::slurp(events).size() < (4u << 20));
  ::shm_unlink(("/" + forged).c_str());
}

TEST_CASE("under elastic-run, a second launcher of the same run leaves the first one's live records alone") {
  hanging_run h("fr-second");
  auto& first = h.l;
  const auto rounds = wait_for_rounds(first.run, 4, 60s);
  REQUIRE(rounds.size() == 4);
  // The same run id on the same host: refused (the run's store is held), and nothing else.
  elastic::test::temp_dir other;
  elastic::test::launched_run second(ELASTIC_RUN_TOOL, "fr-second", hanging_run::options(),
                                     {ELASTIC_DIGITS_TRAIN, "--steps", "10", "--ckpt", other.file("ckpt")});
  REQUIRE(second.run == first.run);
  const int refused = second.finish(60s);
  INFO(second.err());
  CHECK(refused != 0);
  CHECK(second.err().find("already running") != std::string::npos);
  for (const auto& [name, round] : rounds) CHECK(shm_exists(name));  // the live workers' records
  // And the first launcher still names the hung rank from them.
  const int code = first.finish(120s);
  INFO(first.err());
  CHECK(code == 0);
  bool named = false;
  for (const auto& f : elastic::test::events_named(first.dir.path() + "/" + first.run + "/events.jsonl", "group_culprit"))
    named = named || (f.find("\"source\":\"launcher\"") != std::string::npos && f.find("\"culprits\":\"1\"") != std::string::npos);
  CHECK(named);
  CHECK(flight_objects(first.run).empty());
}
#endif
