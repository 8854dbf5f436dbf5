// The run timeline (tools/agent/run_timeline.hpp): events files drawn as one HTML page. The
// renderer on recorded and crafted events (a disturbed run with a stack dump, hostile strings,
// malformed lines, an empty file, relaunches, wrapped workers, several hosts, a crowded run),
// elastic-report on real files, and elastic-run writing the page at the end of real runs that
// fail, are interrupted or are told where to write it. What a browser shows of these pages is
// tests/test_timeline_browser.py.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "agent/options.hpp"
#include "agent/run_timeline.hpp"
#include "support/catch.hpp"
#include "support/launched_run.hpp"
#include "support/process.hpp"

namespace {

using namespace std::chrono_literals;
using elastic::test::child_process;
using elastic::test::slurp;
using elastic::test::temp_dir;
namespace tl = elastic::agent::timeline;

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

bool contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

const std::string data_dir = ELASTIC_TIMELINE_DATA;

tl::event_set read(const std::vector<std::pair<std::string, std::string>>& inputs) {
  tl::event_reader r;
  for (const auto& [name, text] : inputs) r.add(name, text);
  return std::move(r).finish();
}

std::string page_of(const tl::event_set& set) {
  return tl::render_page(tl::build_model(set), set, {.generator = "test", .notes = {}});
}

std::vector<std::string> row_labels(const tl::model& m) {
  std::vector<std::string> out;
  for (const auto& r : m.rows) out.push_back(r.label);
  return out;
}

std::size_t marks_of(const tl::model& m, tl::mark_kind k) {
  std::size_t n = 0;
  for (const auto& mk : m.marks) n += mk.kind == k ? mk.count : 0;
  return n;
}

/// One events line at `s` seconds into the day, as the library writes them.
std::string line(double s, const std::string& name, const std::string& host, long pid, const std::string& fields,
                 std::string_view run = "r") {
  const int whole = static_cast<int>(s);
  return fmt::format(R"({{"ts":"2026-11-25T10:{:02}:{:02}.{:06}Z","event":"{}","run_id":"{}","host":"{}","pid":{}{}{}}})",
                     whole / 60, whole % 60, static_cast<int>((s - whole) * 1e6), name, run, host, pid,
                     fields.empty() ? "" : ",", fields) +
         "\n";
}

}  // namespace

TEST_CASE("every string from the events reaches the page as text, never as markup") {
  const auto set = read({{"hostile.jsonl", slurp(data_dir + "/hostile.jsonl")}});
  const std::string page = page_of(set);
  // The events hold </script>, <img onerror>, <svg onload>, <script> in names, keys, hosts,
  // scopes, stack text and messages: none of it is markup here.
  CHECK(count(page, "</script>") == 2);  // the data block's and the script's own
  CHECK(count(page, "<script") == 2);
  CHECK_FALSE(contains(page, "<img"));
  CHECK_FALSE(contains(page, "<svg onload"));
  CHECK_FALSE(contains(page, "<b>step"));
  CHECK_FALSE(contains(page, "<!--"));
  CHECK(contains(page, "&lt;img src=x onerror="));
  CHECK(contains(page, "&lt;/pre&gt;&lt;/details&gt;&lt;img src=x onerror="));
  // The data block says the same strings, escaped for JSON, and reads back to them.
  const auto begin = page.find("<script type=\"application/json\" id=\"events-data\">");
  REQUIRE(begin != std::string::npos);
  const auto start = page.find('>', begin) + 1;
  const std::string block = page.substr(start, page.find("</script>", start) - start);
  CHECK_FALSE(contains(block, "<"));
  const auto data = tl::json::parse(block);
  bool found_scope = false;
  for (const auto& e : data.elements()) {
    found_scope = found_scope || tl::text_field(e, "scope").find("</title><script>") != std::string::npos;
  }
  CHECK(found_scope);
}

TEST_CASE("lines that are not events are skipped and counted, and the rest is still drawn") {
  const auto set = read({{"hostile.jsonl", slurp(data_dir + "/hostile.jsonl")}});
  // Not JSON, cut short, an array, no ts, an unreadable ts, a number for a name, nested past
  // the parser's depth, binary junk.
  CHECK(set.malformed == 8);
  CHECK(set.first_skipped.size() == 8);
  CHECK(set.first_skipped.front().source == "hostile.jsonl");
  const auto m = tl::build_model(set);
  CHECK(m.facts.watchdog_kills == 1);
  CHECK(m.kills.size() == 1);
  CHECK(contains(m.kills.front().stack_text, "in hang() at a.cpp:1"));
  CHECK(m.facts.outcomes.size() == 2);  // two hosts: one launcher ended, one did not
  const std::string page = page_of(set);
  CHECK(contains(page, "malformed lines skipped: 8"));
  CHECK(contains(page, "hostile.jsonl:4</td>"));
}

TEST_CASE("an empty events file gives a page that says there are no events") {
  for (const std::string text : {"", "\n  \n\t\n"}) {
    const auto set = read({{"events.jsonl", text}});
    const std::string page = page_of(set);
    CHECK(contains(page, "id=\"no-events\""));
    CHECK(contains(page, "There are no events to draw in events.jsonl"));
    CHECK_FALSE(contains(page, "<svg id=\"timeline\""));
  }
  const auto set = read({{"junk.jsonl", "not an event\n{}\n"}});
  CHECK(set.malformed == 2);
  CHECK(contains(page_of(set), "2 of them malformed"));
}

TEST_CASE("a recorded disturbed run draws a lane per slot, its restarts, the kill with its stack dump, rounds and checkpoints") {
  const auto set = read({{"disturbed_run.jsonl", slurp(data_dir + "/disturbed_run.jsonl")}});
  CHECK(set.malformed == 0);
  const auto m = tl::build_model(set);
  const auto labels = row_labels(m);
  CHECK(labels == std::vector<std::string>{"group dev2", "checkpoints", "vm · elastic-run", "vm · slot 0", "vm · slot 1",
                                           "vm · slot 2"});
  CHECK(m.facts.slots == 3);
  CHECK(m.facts.lives == 7);
  CHECK(m.facts.restarts == 4);
  CHECK(marks_of(m, tl::mark_kind::restart) == 4);
  CHECK(m.facts.failures == 4);
  CHECK(marks_of(m, tl::mark_kind::exit_killed) == 3);
  CHECK(marks_of(m, tl::mark_kind::exit_watchdog) == 1);
  CHECK(marks_of(m, tl::mark_kind::exit_ok) == 3);
  // The kill, on the hung slot's lane, with the stack dump taken just before it.
  REQUIRE(m.kills.size() == 1);
  CHECK(m.kills[0].id == "kill-1");
  CHECK(m.kills[0].where == "vm · slot 1");
  CHECK(contains(m.kills[0].summary, "scope 'step'"));
  CHECK(contains(m.kills[0].stack_heading, "2 threads, complete"));
  CHECK(contains(m.kills[0].stack_text, "hang_forever() at /work/main/examples/digits_train.cpp:212"));
  for (const auto& mk : m.marks) {
    if (mk.kind == tl::mark_kind::kill || mk.kind == tl::mark_kind::stack) {
      CHECK(mk.ref == "kill-1");
      CHECK(m.rows[mk.row].label == "vm · slot 1");
    }
  }
  // Seven rounds: a formation, then each loss and each return.
  REQUIRE(m.rounds.size() == 7);
  CHECK(m.rounds[0].first_of_run);
  CHECK(m.facts.rebuilds == 6);
  std::vector<std::pair<std::int64_t, std::int64_t>> worlds;
  for (const auto& r : m.rounds) worlds.emplace_back(r.world_before, r.world);
  CHECK(worlds == std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 3}, {3, 2}, {2, 3}, {3, 2}, {2, 3}, {3, 2}, {2, 3}});
  CHECK(m.rounds[5].rendezvous_ms > 400);  // the hang: the survivors waited out the hung rank
  CHECK(contains(m.rounds[5].cause, "did not answer in time"));
  // Checkpoints, and the culprit, the straggler and the new deadlines as notes.
  CHECK(m.checkpoints.size() == 16);
  CHECK(m.facts.newest_checkpoint == 300);
  CHECK(m.facts.culprits == 1);
  CHECK(m.facts.stragglers == 1);
  CHECK(m.facts.deadline_updates == 1);
  bool culprit_on_hung_lane = false;
  for (const auto& mk : m.marks) {
    culprit_on_hung_lane = culprit_on_hung_lane || (mk.kind == tl::mark_kind::culprit && m.rows[mk.row].label == "vm · slot 1");
  }
  CHECK(culprit_on_hung_lane);
  const std::string page = page_of(set);
  CHECK(contains(page, "<span id=\"outcome\" class=\"good\">finished</span>"));
  CHECK(contains(page, "<details class=\"kill\" id=\"kill-1\" open>"));
  CHECK(count(page, "class=\"m m-checkpoint\"") == 16);
  CHECK(contains(page, "data-step=\"300\""));
}

TEST_CASE("a relaunched group counts its rounds from 1 again, and each round is its own") {
  std::string text;
  for (long launcher : {100L, 200L}) {
    const double t0 = launcher == 100 ? 0 : 30;
    const long w = launcher + 1;
    text += line(t0, "launcher_start", "h", launcher, "");
    text += line(t0 + 0.1, "worker_start", "h", launcher, fmt::format(R"("slot":0,"worker_pid":{},"restart_count":0)", w));
    for (int round = 1; round <= 2; ++round) {
      text += line(t0 + round, "rendezvous_round_closed", "h", w,
                   fmt::format(R"("rank":0,"round":{},"world_size":1,"members":"h.{}:0","participant":"h.{}:0")", round,
                               launcher, launcher));
      text += line(t0 + round + 0.1, round == 1 ? "group_formed" : "group_rebuilt", "h", w,
                   fmt::format(R"("rank":0,"round":{},"world_size":1,"cause":"{}","rendezvous_ms":5,"connect_ms":5)", round,
                               round == 1 ? "join" : "allreduce failed"));
      text += line(t0 + round + 0.2, "group_resynced", "h", w, fmt::format(R"("rank":0,"round":{},"step":{})", round, round * 10));
    }
    text += line(t0 + 5, "worker_exit", "h", launcher, fmt::format(R"("slot":0,"worker_pid":{},"code":75,"signal":null)", w));
    text += line(t0 + 5.1, "launcher_end", "h", launcher, R"("exit_code":75,"outcome":"preempted")");
  }
  const auto m = tl::build_model(read({{"events.jsonl", text}}));
  REQUIRE(m.rounds.size() == 4);
  CHECK(m.rounds[0].first_of_run);
  CHECK(m.rounds[2].first_of_run);  // the relaunch formed again
  CHECK(m.rounds[2].round == 1);
  CHECK(*m.rounds[2].closed > *m.rounds[1].resynced);
  CHECK(m.facts.rebuilds == 2);
  // One lane for the slot across both launches; two lives on it, both preempted.
  CHECK(row_labels(m) == std::vector<std::string>{"group r", "h · elastic-run", "h · slot 0"});
  CHECK(m.lives.size() == 2);
  CHECK(m.lives[1].kind == tl::span_kind::life_preempted);
  CHECK(m.facts.launchers == 2);
  CHECK(m.facts.outcomes == std::vector<std::string>{"preempted"});
}

TEST_CASE("a wrapper's trainer is drawn on its slot's lane, named by its rendezvous participant id") {
  std::string text = line(0, "launcher_start", "h", 100, "");
  text += line(0.1, "worker_start", "h", 100, R"("slot":1,"worker_pid":101,"restart_count":0)");
  // pid 555 is the trainer a shell script (pid 101) started: it logs before it joins.
  text += line(0.2, "checkpoint_restore", "h", 555, R"("rank":0,"step":40)");
  text += line(0.3, "rendezvous_join", "h", 555, R"("rank":0,"participant":"h.100:1")");
  text += line(0.9, "some_new_event", "h", 555, R"("rank":0,"detail":"x")");
  const auto m = tl::build_model(read({{"events.jsonl", text}}));
  std::size_t on_slot = 0;
  for (const auto& mk : m.marks) on_slot += m.rows[mk.row].label == "h · slot 1" ? 1 : 0;
  CHECK(on_slot == 2);  // the restore and the event this code does not know
  CHECK(marks_of(m, tl::mark_kind::other) == 1);
  CHECK(row_labels(m) == std::vector<std::string>{"h · elastic-run", "h · slot 1"});
}

TEST_CASE("a finding every rank reports (a straggler, new deadlines, a culprit) is drawn once") {
  std::string text = line(0, "launcher_start", "h", 1, "");
  for (int slot = 0; slot < 3; ++slot) {
    const long pid = 10 + slot;
    text += line(0.1, "worker_start", "h", 1, fmt::format(R"("slot":{},"worker_pid":{},"restart_count":0)", slot, pid));
    text += line(0.2, "rendezvous_round_closed", "h", pid,
                 fmt::format(R"("rank":{},"round":1,"world_size":3,"members":"h.1:2,h.1:0,h.1:1","participant":"h.1:{}")",
                             (slot + 1) % 3, slot));
    // As the loop logs them: the same agreed deadlines, each rank's own quantiles.
    text += line(1 + slot * 0.01, "timeouts_updated", "h", pid,
                 fmt::format(R"("rank":{},"step":50,"step_timeout_ms":812.5,"checkpoint_step_timeout_ms":2400,"p50_ms":{})",
                             slot, 10 + slot));
    text += line(2 + slot * 0.01, "straggler", "h", pid,
                 fmt::format(R"("rank":{},"straggler_rank":2,"step":75,"ratio":3.5,"compute_ms":{})", slot, 30 + slot));
  }
  // The launcher's and the group's report of one culprit: rank 0 of the round is slot 2.
  text += line(3, "group_culprit", "h", 1, R"("source":"launcher","round":1,"collective":9,"op":"allreduce","culprits":"0","culprit_pids":"12")");
  text += line(3.1, "group_culprit", "h", 10, R"("rank":0,"source":"group","round":1,"collective":9,"op":"allreduce","culprits":"0")");
  text += line(4, "straggler_evicted", "h", 11, R"("rank":1,"step":90,"round":1)");
  const auto m = tl::build_model(read({{"events.jsonl", text}}));
  CHECK(m.facts.deadline_updates == 1);
  CHECK(m.facts.stragglers == 1);
  CHECK(m.facts.culprits == 1);
  std::map<std::string, std::vector<std::string>> where;
  for (const auto& mk : m.marks) where[std::string(tl::class_of(mk.kind))].push_back(m.rows[mk.row].label + ":" + mk.label);
  CHECK(where["timeouts"] == std::vector<std::string>{"group r:step ≤ 812 ms"});
  // Group rank 2 in round 1 is slot 1 (members h.1:2, h.1:0, h.1:1), whoever reports it.
  CHECK(where["straggler"] == std::vector<std::string>{"h · slot 1:slow r2 ×3.5", "h · slot 1:evicted"});
  CHECK(where["culprit"] == std::vector<std::string>{"group r:culprit r0", "h · slot 2:#9 allreduce"});
}

TEST_CASE("several hosts' files are drawn on one page in time order, each host with its lanes") {
  std::string a = line(0, "launcher_start", "alpha", 10, "") +
                  line(0.1, "worker_start", "alpha", 10, R"("slot":0,"worker_pid":11,"restart_count":0)") +
                  line(4, "worker_exit", "alpha", 10, R"("slot":0,"worker_pid":11,"code":0,"signal":null)") +
                  line(4.1, "launcher_end", "alpha", 10, R"("exit_code":0,"outcome":"finished")");
  std::string b = line(1, "launcher_start", "beta", 10, "") +
                  line(1.1, "worker_start", "beta", 10, R"("slot":0,"worker_pid":11,"restart_count":0)") +
                  line(2, "worker_exit", "beta", 10, R"("slot":0,"worker_pid":11,"code":null,"signal":"SIGKILL")");
  // A second launcher on alpha while the first runs (two "hosts" on one machine).
  a += line(0.5, "launcher_start", "alpha", 20, "") +
       line(0.6, "worker_start", "alpha", 20, R"("slot":0,"worker_pid":21,"restart_count":0)");
  const auto set = read({{"alpha.jsonl", a}, {"beta.jsonl", b}});
  for (std::size_t i = 1; i < set.events.size(); ++i) CHECK(set.events[i - 1].t <= set.events[i].t);
  const auto m = tl::build_model(set);
  CHECK(row_labels(m) == std::vector<std::string>{"alpha · elastic-run", "alpha · slot 0", "alpha #20 · elastic-run",
                                                  "alpha #20 · slot 0", "beta · elastic-run", "beta · slot 0"});
  // Same pids on two hosts are two processes.
  REQUIRE(m.lives.size() == 3);
  CHECK(m.facts.outcomes.size() == 3);
  CHECK(contains(page_of(set), "alpha.jsonl, beta.jsonl"));
}

TEST_CASE("a crowded run is thinned to what a browser draws at once, and the page says so") {
  std::string text = line(0, "launcher_start", "h", 1, "");
  text += line(0, "worker_start", "h", 1, R"("slot":0,"worker_pid":2,"restart_count":0)");
  for (int i = 0; i < 30000; ++i) {
    text += line(0.001 + i * 0.002, "checkpoint_commit", "h", 2, fmt::format(R"("rank":0,"step":{},"bytes":1)", i));
    if (i % 4 == 0) text += line(0.0015 + i * 0.002, "straggler", "h", 2, fmt::format(R"("rank":0,"ratio":2,"step":{})", i));
    if (i % 10 == 0) text += line(0.0016 + i * 0.002, "checkpoint_part", "h", 2, R"("rank":1)");
  }
  const auto set = read({{"events.jsonl", text}});
  CHECK(set.dropped == 3000);  // one per rank and step: counted only
  const auto m = tl::build_model(set);
  CHECK(m.marks.size() <= tl::max_marks);
  CHECK_FALSE(m.caps.empty());
  CHECK(m.checkpoints.size() == 30000);
  CHECK(m.data.size() <= 6000);
  const std::string page = page_of(set);
  CHECK(contains(page, "marks were merged"));
  CHECK(page.size() < std::size_t(12) << 20);
}

TEST_CASE("the default page is beside the events file") {
  CHECK(elastic::agent::default_timeline_path("logs/job7/events.jsonl") == "logs/job7/timeline.html");
  CHECK(elastic::agent::default_timeline_path("/x/job7.jsonl") == "/x/job7.timeline.html");
  CHECK(elastic::agent::default_timeline_path("events") == "events.timeline.html");
}

// elastic-report --------------------------------------------------------------------------------

namespace {

/// Runs `sh -c SCRIPT` with elastic-report as $R; its exit code (or -1).
int shell(const std::string& script, const temp_dir& dir) {
  auto p = child_process::spawn({"/bin/sh", "-c", "cd \"$D\" && " + script},
                                {{"R", ELASTIC_REPORT_TOOL}, {"D", dir.path()}, {"DATA", data_dir}});
  const auto code = p.exit_code(60s);
  return code.value_or(-1);
}

}  // namespace

TEST_CASE("elastic-report writes the page beside the events file, from several files or stdin") {
  temp_dir dir;
  std::filesystem::create_directories(dir.file("job"));
  std::filesystem::copy_file(data_dir + "/disturbed_run.jsonl", dir.file("job/events.jsonl"));
  CHECK(shell("$R job/events.jsonl 2>err", dir) == 0);
  const std::string page = slurp(dir.file("job/timeline.html"));
  CHECK(contains(page, "<svg id=\"timeline\""));
  CHECK(contains(slurp(dir.file("err")), "job/timeline.html: 155 events from 155 lines (0 malformed lines skipped)"));

  CHECK(shell("$R job/events.jsonl \"$DATA/hostile.jsonl\" -o both.html 2>err", dir) == 0);
  CHECK(contains(slurp(dir.file("both.html")), "<span id=\"run-id\">hostile, dev2</span>"));
  CHECK(contains(slurp(dir.file("err")), "8 malformed lines skipped"));

  CHECK(shell("cat job/events.jsonl | $R - -o - > out.html 2>err", dir) == 0);
  CHECK(contains(slurp(dir.file("out.html")), "Lines read from stdin: 155"));
}

TEST_CASE("elastic-report refuses a missing input, its input as output, and no input, with exit 2") {
  temp_dir dir;
  std::filesystem::copy_file(data_dir + "/disturbed_run.jsonl", dir.file("events.jsonl"));
  CHECK(shell("$R missing.jsonl 2>err", dir) == 2);
  CHECK(contains(slurp(dir.file("err")), "cannot open missing.jsonl"));
  CHECK(shell("$R events.jsonl -o ./events.jsonl 2>err", dir) == 2);
  CHECK(contains(slurp(dir.file("err")), "is one of the events files"));
  CHECK(shell("$R 2>err", dir) == 2);
  CHECK(shell("$R events.jsonl -o no/such/dir/x.html 2>err", dir) == 0);  // made, like --log-dir
  CHECK(shell("$R --help >out", dir) == 0);
  CHECK(contains(slurp(dir.file("out")), "-o,--output FILE"));
}

// elastic-run -----------------------------------------------------------------------------------

namespace {

struct run_result {
  int code = -1;
  std::string err;
};

/// elastic-run with logs under `dir` and `options`, running the agent test worker `mode`; with
/// `term`, a SIGTERM once every worker has written its pid file.
run_result launch(const temp_dir& dir, const std::string& run, std::vector<std::string> options,
                  std::vector<std::string> mode, bool term = false) {
  std::vector<std::string> argv{"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>>\"$ERR\"", ELASTIC_RUN_TOOL, "--run-id",
                                run + "-" + std::to_string(::getpid()), "--log-dir", dir.file("logs"), "--quiet"};
  argv.insert(argv.end(), options.begin(), options.end());
  argv.push_back("--");
  argv.push_back(ELASTIC_AGENT_WORKER);
  argv.insert(argv.end(), mode.begin(), mode.end());
  auto p = child_process::spawn(argv, {{"ERR", dir.file(run + ".err")}});
  if (term) {
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < until &&
           !(std::filesystem::exists(dir.file("pid.0")) && std::filesystem::exists(dir.file("pid.1")))) {
      std::this_thread::sleep_for(10ms);
    }
    std::this_thread::sleep_for(100ms);
    p.kill(SIGTERM);
  }
  const auto st = p.wait_for(60s);
  run_result r;
  r.code = st && WIFEXITED(*st) ? WEXITSTATUS(*st) : -1;
  r.err = slurp(dir.file(run + ".err"));
  std::cerr << r.err;
  return r;
}

std::string logs(const temp_dir& dir, const std::string& run) {
  return dir.file("logs/" + run + "-" + std::to_string(::getpid()));
}

}  // namespace

TEST_CASE("elastic-run writes its timeline beside the events file when the run fails, and names it") {
  temp_dir dir;
  const auto r = launch(dir, "tlfail", {"--nproc-per-node", "2", "--max-restarts", "0", "--grace", "5"}, {"crash-always"});
  CHECK(r.code == 1);
  const std::string page_path = logs(dir, "tlfail") + "/timeline.html";
  CHECK(contains(r.err, "  timeline         " + page_path + "\n"));
  const std::string page = slurp(page_path);
  CHECK(contains(page, "id=\"outcome\" class=\"bad\">failed: worker 0 exited with code 3"));
  CHECK(contains(page, "· slot 0</text>"));
  CHECK(contains(page, "· slot 1</text>"));
  CHECK(contains(page, "class=\"m m-exit-failed\""));
  CHECK(contains(page, "malformed lines skipped: 0."));  // every line elastic-run wrote is an event
}

TEST_CASE("elastic-run writes its timeline when a preemption notice interrupts the run") {
  temp_dir dir;
  const auto r = launch(dir, "tlterm", {"--nproc-per-node", "2", "--grace", "5"}, {"wait", dir.file("pid")}, true);
  CHECK(r.code == 75);
  const std::string page = slurp(logs(dir, "tlterm") + "/timeline.html");
  CHECK(contains(page, "id=\"outcome\" class=\"warn\">preempted</span>"));
  CHECK(contains(page, "class=\"m m-signal\""));  // the notice, on elastic-run's row
  CHECK(contains(page, "class=\"m m-exit-killed\""));  // slot 1 ignores SIGTERM: killed at the grace
}

TEST_CASE("elastic-run writes the page where --timeline says, and none with --no-timeline") {
  temp_dir dir;
  auto r = launch(dir, "tlpath", {"--nproc-per-node", "1", "--timeline", dir.file("pages/run.html")}, {"env", dir.file("env")});
  CHECK(r.code == 0);
  CHECK(contains(slurp(dir.file("pages/run.html")), "<svg id=\"timeline\""));
  CHECK_FALSE(std::filesystem::exists(logs(dir, "tlpath") + "/timeline.html"));
  CHECK(contains(r.err, "  timeline         " + dir.file("pages/run.html")));

  r = launch(dir, "tloff", {"--nproc-per-node", "1", "--no-timeline"}, {"env", dir.file("env")});
  CHECK(r.code == 0);
  CHECK_FALSE(std::filesystem::exists(logs(dir, "tloff") + "/timeline.html"));
  CHECK_FALSE(contains(r.err, "timeline"));
}

TEST_CASE("a --timeline that names the events file or comes with --no-timeline is refused with exit 2") {
  temp_dir dir;
  auto r = launch(dir, "tlsame", {"--nproc-per-node", "1", "--events", dir.file("ev.jsonl"), "--timeline", dir.file("ev.jsonl")},
                  {"env", dir.file("env")});
  CHECK(r.code == 2);
  CHECK(contains(r.err, "names the events file"));
  CHECK(std::filesystem::file_size(dir.file("ev.jsonl")) == 0);  // no worker started
  const std::vector<std::string_view> both{"--timeline", "x.html", "--no-timeline", "--", "prog"};
  CHECK_THROWS_AS(elastic::agent::parse_command_line(both), elastic::error);
  const std::vector<std::string_view> one{"--timeline", "x.html", "--", "prog"};
  CHECK(elastic::agent::parse_command_line(one).options.timeline == "x.html");
}
