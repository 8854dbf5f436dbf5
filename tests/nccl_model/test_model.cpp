// The NCCL/CUDA model's own tests: real processes (nccl_model_probe) run each scenario and print
// what they saw; these tests check it against what NCCL and CUDA do (tests/nccl_model/README.md).
#include <dlfcn.h>
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <nccl_model.h>

#include "harness/child.hpp"
#include "support/catch.hpp"

#ifndef ELASTIC_NCCL_MODEL_CUDA_RUNTIME_API_H
#error "built against the real CUDA headers: link elastic::nccl_model, whose include directory comes first"
#endif

namespace {

using nccl_model_test::child;
using nccl_model_test::env_list;
using namespace std::chrono_literals;

std::string hex(const void* p, std::size_t n) {
  std::string s;
  static const char* digits = "0123456789abcdef";
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = static_cast<const unsigned char*>(p)[i];
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

// A bootstrap id made here: its root thread lives in this test process.
std::string new_id() {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  return hex(&id, sizeof id);
}

std::unique_ptr<child> probe(const std::vector<std::string>& args, const env_list& env = {}) {
  std::vector<std::string> argv{NCCL_MODEL_PROBE};
  argv.insert(argv.end(), args.begin(), args.end());
  return std::make_unique<child>(argv, env);
}

// Every stdout line up to "done" (or the end), failing on a FAIL line or on silence.
std::vector<std::string> lines_until_done(child& c, std::chrono::milliseconds limit = 60s) {
  std::vector<std::string> out;
  const auto until = std::chrono::steady_clock::now() + limit;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    auto l = c.line(left.count() > 0 ? left : 0ms);
    if (!l) break;
    INFO("probe " << c.pid() << ": " << *l);
    CHECK(l->rfind("FAIL", 0) != 0);
    if (*l == "done") return out;
    out.push_back(*l);
  }
  FAIL("probe " << c.pid() << " did not finish; stderr:\n" << c.err());
  return out;
}

// The probe ended well and no sanitizer spoke.
void ends_clean(child& c) {
  const int code = c.exit_code(30s);
  const std::string err = c.err();
  INFO("stderr of probe " << c.pid() << ":\n" << err);
  CHECK(code == 0);
  CHECK(err.find("Sanitizer") == std::string::npos);
  CHECK(err.find("runtime error:") == std::string::npos);
}

// Checks that every line saying "ok"/"bad" said ok; returns how many did.
int all_ok(const std::vector<std::string>& lines) {
  int ok = 0;
  for (const auto& l : lines) {
    INFO(l);
    CHECK(l.rfind("bad", 0) != 0);
    CHECK(l.find(" bad") == std::string::npos);
    if (l.rfind("ok", 0) == 0 || l.find(" ok") != std::string::npos) ++ok;
  }
  return ok;
}

bool has(const std::vector<std::string>& lines, const std::string& text) {
  for (const auto& l : lines)
    if (l.find(text) != std::string::npos) return true;
  return false;
}

// What one rank gets beyond the common arguments: its environment and its device.
struct rank_setup {
  env_list env;
  int device = 0;
};
using setup_fn = std::function<rank_setup(int)>;

// Every rank on a host of its own, device 0 (how the library's tests share one GPU).
rank_setup own_host(int r) { return {{{"NCCL_HOSTID", "host-" + std::to_string(r)}}, 0}; }
// Every rank on one host, each on a GPU of its own.
rank_setup one_host(int r) { return {{{"NCCL_HOSTID", "one-host"}, {"ELASTIC_NCCL_MODEL_GPUS", "4"}}, r}; }

// A non-blocking ncclCommRevoke returns the state it finds: ncclInProgress, or already what the
// state turned into (the kernels drained first). The line must go on with `rest`.
bool revoke_in_progress_or_done(const std::vector<std::string>& lines, const std::string& rest) {
  for (const auto& l : lines) {
    int rc = -1;
    if (std::sscanf(l.c_str(), "revoke rc=%d", &rc) != 1) continue;
    const std::string tail = l.substr(l.find(' ', std::string("revoke rc=").size()) == std::string::npos
                                          ? l.size()
                                          : l.find(' ', std::string("revoke rc=").size()) + 1);
    int final_state = ncclSuccess;
    std::sscanf(tail.c_str(), "state=%d", &final_state);
    return (rc == ncclInProgress || rc == final_state) && tail == rest;
  }
  return false;
}

// N ranks of one scenario.
std::vector<std::unique_ptr<child>> ranks(int n, const std::vector<std::string>& args, const setup_fn& setup,
                                          const env_list& common = {}) {
  std::vector<std::unique_ptr<child>> out;
  for (int r = 0; r < n; ++r) {
    rank_setup s = setup(r);
    std::vector<std::string> a = args;
    a.push_back("rank=" + std::to_string(r));
    a.push_back("nranks=" + std::to_string(n));
    a.push_back("device=" + std::to_string(s.device));
    s.env.insert(s.env.end(), common.begin(), common.end());
    out.push_back(probe(a, s.env));
  }
  return out;
}

void same_results(int n, const setup_fn& per_rank) {
  auto procs = ranks(n, {"collectives", "id=" + new_id()}, per_rank);
  std::vector<std::vector<std::string>> seen;
  for (auto& p : procs) seen.push_back(lines_until_done(*p));
  for (auto& p : procs) ends_clean(*p);
  REQUIRE(seen[0].size() >= 60 + 5);
  CHECK(all_ok(seen[0]) == 4);
  for (int r = 1; r < n; ++r) {
    INFO("rank " << r);
    CHECK(seen[static_cast<std::size_t>(r)] == seen[0]);  // every line, every digest: the same bits
  }
}

}  // namespace

TEST_CASE("the test runs against the model's headers and libraries, not the real ones") {
  CHECK(::dlsym(RTLD_DEFAULT, "elastic_nccl_model_live_roots") != nullptr);
  int v = 0;
  REQUIRE(ncclGetVersion(&v) == ncclSuccess);
  CHECK(v == NCCL_VERSION_CODE);
  CHECK(NCCL_VERSION_CODE == 23007);
  std::ifstream maps("/proc/self/maps");
  std::stringstream all;
  all << maps.rdbuf();
  CHECK(all.str().find("nccl-2.30/libnccl.so") != std::string::npos);
  CHECK(all.str().find("/usr/local/cuda") == std::string::npos);
}

TEST_CASE("two ranks on two hosts compute bit-identical results for every type and operation") {
  same_results(2, own_host);
}

TEST_CASE("four ranks on one host, one GPU each, compute bit-identical results") { same_results(4, one_host); }

TEST_CASE("a non-blocking init returns ncclInProgress at once and turns ncclSuccess later") {
  auto p = probe({"init-nonblocking"}, {{"ELASTIC_NCCL_MODEL_INIT_DELAY_MS", "300"}});
  const auto l = lines_until_done(*p);
  ends_clean(*p);
  REQUIRE(l.size() == 2);
  int rc = -1, state = -1, ms = -1;
  REQUIRE(std::sscanf(l[0].c_str(), "init rc=%d state=%d call-ms=%d", &rc, &state, &ms) == 3);
  CHECK(rc == ncclInProgress);
  CHECK(state == ncclInProgress);
  CHECK(ms < 250);
  REQUIRE(std::sscanf(l[1].c_str(), "ready state=%d ready-ms=%d", &state, &ms) == 2);
  CHECK(state == ncclSuccess);
  CHECK(ms >= 300);
}

TEST_CASE("NCCL_COMM_BLOCKING=1 overrides config.blocking: the same init blocks until done") {
  auto p = probe({"init-nonblocking"}, {{"ELASTIC_NCCL_MODEL_INIT_DELAY_MS", "300"}, {"NCCL_COMM_BLOCKING", "1"}});
  const auto l = lines_until_done(*p);
  ends_clean(*p);
  int rc = -1, state = -1, ms = -1;
  REQUIRE(std::sscanf(l.at(0).c_str(), "init rc=%d state=%d call-ms=%d", &rc, &state, &ms) == 3);
  CHECK(rc == ncclSuccess);
  CHECK(state == ncclSuccess);
  CHECK(ms >= 300);
}

TEST_CASE("arguments NCCL refuses are refused with NCCL's codes, an empty exclude list included") {
  auto p = probe({"arguments"}, {{"ELASTIC_NCCL_MODEL_GPUS", "2"}});
  const auto l = lines_until_done(*p);
  ends_clean(*p);
  CHECK(l.at(0) == "version 23007");
  CHECK(all_ok(l) >= 35);
  CHECK(has(l, "ok shrink with an empty exclude list"));
}

TEST_CASE("a shrink from four ranks to three leaves *newcomm NULL and the parent in progress until done") {
  auto procs = ranks(4, {"shrink", "id=" + new_id(), "victim=3"}, one_host,
                     {{"ELASTIC_NCCL_MODEL_INIT_DELAY_MS", "300"}});
  for (auto& p : procs) REQUIRE(p->line_starting("ready").has_value());
  procs[3]->kill(SIGKILL);
  REQUIRE(procs[3]->killed_by(SIGKILL));
  for (int r = 0; r < 3; ++r) procs[static_cast<std::size_t>(r)]->say("go");
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    const auto l = lines_until_done(*procs[static_cast<std::size_t>(r)]);
    CHECK(has(l, "shrink rc=0 newcomm=null parent=7"));  // ncclSuccess: the PARENT is in progress
    CHECK(has(l, "parent-ready state=0 newcomm=set"));
    CHECK(has(l, "child rank=" + std::to_string(r) + " count=3"));
    CHECK(has(l, "child-allreduce ok"));
    ends_clean(*procs[static_cast<std::size_t>(r)]);
  }
}

TEST_CASE("survivors that pass different exclude lists fail their shrink with ncclInvalidUsage") {
  // Ranks 0 and 1 exclude {3}, rank 2 excludes {0, 3}; rank 3 takes no part. Rank 1 and rank 2
  // meet a survivor with another list and fail; rank 0 waits for a neighbour that never comes (or,
  // once rank 1 has gone, finds its connection to it broken).
  const std::string id = new_id();
  std::vector<std::unique_ptr<child>> procs;
  for (int r = 0; r < 4; ++r) {
    const rank_setup s = one_host(r);
    procs.push_back(probe({"shrink-mismatch", "id=" + id, "rank=" + std::to_string(r), "nranks=4",
                           "device=" + std::to_string(r), std::string("exclude=") + (r == 2 ? "0,3" : "3"),
                           "wait_ms=" + std::to_string(r == 0 ? 1000 : 10000)},
                          s.env));
  }
  for (auto& p : procs) REQUIRE(p->line_starting("ready").has_value());
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    const auto l = lines_until_done(*procs[static_cast<std::size_t>(r)]);
    REQUIRE(l.size() == 1);
    if (r == 0) {  // still waiting; or, had rank 1 already exited, the connection to it broke
      CHECK((l[0].rfind("shrink rc=0 parent=7", 0) == 0 || l[0].rfind("shrink rc=0 parent=6", 0) == 0));
    } else {
      CHECK(l[0].rfind("shrink rc=0 parent=5 newcomm=null error=ncclCommShrink: rank ", 0) == 0);
      CHECK(l[0].find("every surviving rank must pass the same") != std::string::npos);
    }
    ends_clean(*procs[static_cast<std::size_t>(r)]);
  }
}

TEST_CASE("a peer killed mid-allreduce on the same host leaves no error and a stuck kernel until revoke") {
  auto procs = ranks(2, {"peer-death", "id=" + new_id(), "mode=p2p"}, one_host);
  for (auto& p : procs) REQUIRE(p->line_starting("ready").has_value());
  REQUIRE(procs[0]->line_starting("enqueued") == std::optional<std::string>("enqueued"));
  procs[1]->kill(SIGKILL);
  REQUIRE(procs[1]->killed_by(SIGKILL));
  procs[0]->say("killed");
  const auto l = lines_until_done(*procs[0]);
  CHECK(has(l, "after-kill state=0 stream=600"));  // ncclSuccess, cudaErrorNotReady (NVIDIA/nccl#279)
  CHECK(revoke_in_progress_or_done(l, "state=0 stream-done=1"));
  CHECK(has(l, "allreduce-after-revoke rc=5"));
  ends_clean(*procs[0]);
}

TEST_CASE("a peer killed mid-allreduce on another host leaves a sticky ncclRemoteError that even a shrink with "
          "NCCL_SHRINK_ABORT returns") {
  auto procs = ranks(2, {"peer-death", "id=" + new_id(), "mode=net"}, own_host);
  for (auto& p : procs) REQUIRE(p->line_starting("ready").has_value());
  REQUIRE(procs[0]->line_starting("enqueued") == std::optional<std::string>("enqueued"));
  procs[1]->kill(SIGKILL);
  REQUIRE(procs[1]->killed_by(SIGKILL));
  procs[0]->say("killed");
  const auto l = lines_until_done(*procs[0]);
  // ncclRemoteError (6) and socketProgress's text, as NCCL 2.28.3 said on an H100 (README.md).
  CHECK(has(l, "after-kill state=6 stream=600 error=socketProgress: Connection closed by remote peer localhost<"));
  CHECK(has(l, "(NET/Socket: rank 1, host host-1"));
  CHECK(has(l, "shrink rc=6 newcomm=untouched"));  // ncclCommEnsureReady returns before *newcomm is set
  CHECK(has(l, "stream-after-shrink-abort=1"));    // NCCL_SHRINK_ABORT stopped the kernel all the same
  CHECK(revoke_in_progress_or_done(l, "state=6 stream-done=1"));  // the proxy error outlives the revoke
  ends_clean(*procs[0]);
}

TEST_CASE("revoke ends a hung kernel and frees its stream and collectives afterwards are refused") {
  auto p = probe({"revoke-hang"}, {{"ELASTIC_NCCL_MODEL_HANG_OP", "1"}});
  const auto l = lines_until_done(*p);
  ends_clean(*p);
  CHECK(all_ok(l) == 7);
  CHECK(revoke_in_progress_or_done(l, ""));
}

TEST_CASE("an injected collective failure is a sticky ncclSystemError, still reported after revoke") {
  auto p = probe({"fail-op"}, {{"ELASTIC_NCCL_MODEL_FAIL_OP", "2"}});
  const auto l = lines_until_done(*p);
  ends_clean(*p);
  CHECK(all_ok(l) == 7);
}

TEST_CASE("injected shrink and revoke failures: a sticky error on the parent, *newcomm NULL, ncclInternalError") {
  auto p = probe({"injected"}, {{"ELASTIC_NCCL_MODEL_FAIL_SHRINK", "1"},
                                {"ELASTIC_NCCL_MODEL_FAIL_REVOKE", "1"},
                                {"ELASTIC_NCCL_MODEL_GPUS", "2"}});
  const auto l = lines_until_done(*p);
  ends_clean(*p);
  CHECK(all_ok(l) == 5);
}

TEST_CASE("a grow from two ranks to three keeps the existing ranks and admits the new one") {
  const std::string id = new_id();
  auto r0 = probe({"grow", "role=existing", "id=" + id, "rank=0", "nranks=2", "size=3"}, own_host(0).env);
  auto r1 = probe({"grow", "role=existing", "id=" + id, "rank=1", "nranks=2", "size=3"}, own_host(1).env);
  const auto growid = r0->line_starting("growid rc=0 hex=");
  REQUIRE(growid.has_value());
  auto r2 = probe({"grow", "role=new", "growid=" + growid->substr(std::string("growid rc=0 hex=").size()), "rank=2",
                   "size=3"},
                  own_host(2).env);
  const auto l0 = lines_until_done(*r0);
  CHECK(has(l0, "growid-again rc=5"));  // the first id is not consumed yet
  for (auto* p : {r0.get(), r1.get(), r2.get()}) {
    const auto l = p == r0.get() ? l0 : lines_until_done(*p);
    INFO("probe " << p->pid());
    if (p != r2.get()) {
      CHECK(has(l, "grow rc=0 newcomm=set parent=7 child=7"));  // *newcomm at once, in progress
      CHECK(has(l, "parent-destroy rc=0"));
    } else {
      CHECK(has(l, "grow rc=0 newcomm=set"));
    }
    CHECK(has(l, "grown state=0"));
    CHECK(has(l, "count=3"));
    CHECK(has(l, "grown-allreduce ok"));
    ends_clean(*p);
  }
}

TEST_CASE("two ranks on one GPU of one host are refused unless NCCL_MULTI_RANK_GPU_ENABLE allows them") {
  struct variant {
    env_list env;
    std::string expect;  // RANK and OTHER stand for this rank and the other one (NCCL names itself first)
  };
  // The call returns the state it finds (ncclInProgress, or already the result): only the state counts.
  const std::vector<variant> variants = {
      {{}, "state=5 error=Multiple Ranks are using the same GPU/Partition (rank RANK and rank OTHER both on CUDA device 0)"},
      {{{"ELASTIC_NCCL_MODEL_VERSION", "22809"}},
       "state=5 error=Duplicate GPU detected : rank RANK and rank OTHER both on CUDA device 0"},
      {{{"NCCL_MULTI_RANK_GPU_ENABLE", "1"}}, "state=0 error="},
  };
  for (const auto& v : variants) {
    auto procs = ranks(2, {"init", "id=" + new_id()}, [](int) { return rank_setup{{{"NCCL_HOSTID", "h"}}, 0}; }, v.env);
    for (int r = 0; r < 2; ++r) {
      std::string expect = v.expect;
      if (auto at = expect.find("RANK"); at != std::string::npos) expect.replace(at, 4, std::to_string(r));
      if (auto at = expect.find("OTHER"); at != std::string::npos) expect.replace(at, 5, std::to_string(1 - r));
      INFO(expect);
      const auto l = lines_until_done(*procs[static_cast<std::size_t>(r)]);
      REQUIRE(l.size() == 1);
      INFO(l[0]);
      CHECK(l[0].find(expect) != std::string::npos);
      ends_clean(*procs[static_cast<std::size_t>(r)]);
    }
  }
}

TEST_CASE("cudaFree waits behind a kernel that never ends, until abort releases it") {
  auto p = probe({"cudafree-blocks"}, {{"ELASTIC_NCCL_MODEL_HANG_OP", "1"}});
  const auto l = lines_until_done(*p);
  ends_clean(*p);
  CHECK(has(l, "cudaFree returned within 300 ms: 0"));
  CHECK(has(l, "cudaFree returned after abort: 1"));
}

TEST_CASE("the 2.27 model's abort waits for the device: behind another communicator's stuck kernel it hangs") {
  auto old = probe({"abort-beside-stuck-kernel"},
                   {{"ELASTIC_NCCL_MODEL_HANG_OP", "1"}, {"LD_LIBRARY_PATH", NCCL_MODEL_227_DIR}});
  CHECK(old->line_starting("abort-blocked", 30s).has_value());
  old->kill(SIGKILL);
  CHECK(old->killed_by(SIGKILL));
  auto current = probe({"abort-beside-stuck-kernel"}, {{"ELASTIC_NCCL_MODEL_HANG_OP", "1"}});
  const auto l = lines_until_done(*current);
  CHECK(has(l, "abort-returned"));
  ends_clean(*current);
}

TEST_CASE("a collective on a non-blocking communicator returns ncclInProgress and the state says so until polled") {
  auto p = probe({"async-launch"});
  const auto l = lines_until_done(*p);
  ends_clean(*p);
  CHECK(all_ok(l) == 6);
}

TEST_CASE("with ELASTIC_NCCL_MODEL_ASYNC_LAUNCH=0 a collective on a non-blocking communicator returns ncclSuccess") {
  auto p = probe({"async-launch", "rc=0"}, {{"ELASTIC_NCCL_MODEL_ASYNC_LAUNCH", "0"}});
  const auto l = lines_until_done(*p);
  ends_clean(*p);
  CHECK(all_ok(l) == 6);
}

TEST_CASE("a bootstrap root leaks when its round fails, and leaves early when a rank checks in twice or sizes differ") {
  auto p = probe({"roots"});
  const auto l = lines_until_done(*p);
  ends_clean(*p);
  CHECK(has(l, "roots after a failed round: 1"));
  CHECK(has(l, "roots with a fresh id: 2"));
  CHECK(has(l, "roots after a rank checked in twice: 1"));
  CHECK(has(l, "lasterror: Bootstrap Root : rank 0 of 2 ranks has already checked in"));
  CHECK(has(l, "both still in progress: 1"));
  CHECK(has(l, "roots after a size mismatch: 1"));
  CHECK(has(l, "lasterror: Bootstrap Root : mismatch in info from procs, nranks 2 vs 3"));
}

TEST_CASE("the 2.27 build reports 22707 and exports ncclCommShrink but not ncclCommRevoke, ncclCommGrow or "
          "ncclCommGetUniqueId") {
  struct variant {
    env_list env;
    std::string expect;
  };
  const std::vector<variant> variants = {
      {{{"LD_LIBRARY_PATH", NCCL_MODEL_227_DIR}}, "version 22707 revoke=0 shrink=1 grow=0 getuniqueid=0"},
      {{}, "version 23007 revoke=1 shrink=1 grow=1 getuniqueid=1"},
      {{{"ELASTIC_NCCL_MODEL_VERSION", "22805"}}, "version 22805 revoke=1 shrink=1 grow=1 getuniqueid=1"},
  };
  for (const auto& v : variants) {
    auto p = probe({"version"}, v.env);
    CHECK(p->line(20s) == v.expect);
    ends_clean(*p);
  }
}

TEST_CASE("an abort may run while another thread is inside a call on another communicator") {
  auto p = probe({"contract-abort-beside-another-communicator"}, {{"ELASTIC_NCCL_MODEL_HANG_OP", "1"}});
  INFO("stderr:\n" << p->err());
  CHECK(p->line(30s) == std::optional<std::string>("reached"));
}

TEST_CASE("each contract rule ends the process with SIGABRT and says what was wrong") {
  struct rule {
    std::string scenario;
    env_list env;
    std::string says;
  };
  const env_list hang{{"ELASTIC_NCCL_MODEL_HANG_OP", "1"}};
  const std::vector<rule> rules = {
      {"in-progress", {}, "ncclCommCount on a communicator whose state is ncclInProgress"},
      {"async-launch", {}, "ncclAllReduce on a communicator whose state is ncclInProgress"},
      {"one-thread", hang, "ncclCommGetAsyncError while thread"},
      {"abort-beside-a-call", hang, "ncclCommAbort while thread"},
      {"abort-pending-beside-a-call", hang, "(the aborted communicator's asynchronous job is in flight)"},
      {"call-during-abort", {{"ELASTIC_NCCL_MODEL_HANG_OP", "1"}, {"ELASTIC_NCCL_MODEL_VERSION", "22707"}},
       "ncclCommGetAsyncError while ncclCommAbort runs on thread"},
      {"shrink-outstanding", hang, "ncclCommShrink with NCCL_SHRINK_DEFAULT while 1 operation(s) of the parent are"},
      {"finalize-after-revoke", {}, "Calling ncclCommFinalize after revoke is invalid"},
      {"use-after-abort", {}, "ncclCommCount on communicator"},
      {"use-after-destroy", {}, "after ncclCommAbort/ncclCommDestroy"},
      {"cuda-no-device", {},
       "a CUDA call (cudaMalloc) from a thread that never set its device, thread"},
      {"cuda-in-host-function", {}, "a CUDA call (cudaStreamQuery) from inside a host function"},
      {"stream-after-destroy", {}, "cudaStreamQuery on a stream after cudaStreamDestroy"},
  };
  for (const auto& r : rules) {
    INFO(r.scenario);
    auto p = probe({"contract-" + r.scenario}, r.env);
    const bool aborted = p->killed_by(SIGABRT, 30s);
    const std::string err = p->err();
    INFO("stderr:\n" << err);
    CHECK(aborted);
    CHECK(err.find("nccl-model: contract violation: ") != std::string::npos);
    CHECK(err.find(r.says) != std::string::npos);
    CHECK(p->line(0ms) != std::optional<std::string>("reached"));
  }
}

TEST_CASE("the message of the no-device rule says what real CUDA would do") {
  auto p = probe({"contract-cuda-no-device"});
  REQUIRE(p->killed_by(SIGABRT, 30s));
  CHECK(p->err().find("real CUDA would create a context on GPU 0 here") != std::string::npos);
}

TEST_CASE("streams, events and memory behave as the CUDA runtime documents") {
  auto p = probe({"cuda-semantics"}, {{"ELASTIC_NCCL_MODEL_GPUS", "3"}});
  const auto l = lines_until_done(*p);
  ends_clean(*p);
  CHECK(all_ok(l) == 35);
}

TEST_CASE("device memory cannot be read on the host") {
  auto p = probe({"device-dereference"});
  REQUIRE(p->line_starting("dereferencing").has_value());
  const auto st = p->wait(30s);
  REQUIRE(st.has_value());
  CHECK(!(WIFEXITED(*st) && WEXITSTATUS(*st) == 0));  // SIGSEGV, or the sanitizer's report of it
  CHECK(p->line(0ms) != std::optional<std::string>("reached 0"));
}
