// Rendezvous at scale: N participants of one run over a real etcd (Debian's /usr/bin/etcd, one
// member on 127.0.0.1, free ports, a temporary data directory), for N = 4 ... 1024. Each
// participant is what an elastic_group makes of its rendezvous: join(), the membership watcher's
// poll() every 50 ms, next_round() on a change (rendezvous_participant.cpp). Up to
// --max-processes participants run one process each; beyond, the participants share that many
// processes as threads, each with its own etcd_store and rendezvous object (etcd sees N clients
// all the same), except the two victims, which always have a process of their own.
//
// Per N, on a fresh etcd:
//   first round      from the start line until every participant has its round_info
//   retired re-round SIGKILL one participant, reap it, erase its alive key (as elastic-run does
//                    with a dead worker), until every survivor completed next_round()
//   silent re-round  SIGSTOP another one (nothing tells anyone: its lease must expire), until
//                    every survivor completed next_round()
//   noticed by all   (both deaths, on the keys line and in the JSON) until the last survivor's
//                    poll() saw the change, the moment its watcher would stop its collectives
//   idle req/s       over --idle-s of a formed round: the HTTP requests the participants' stores
//                    counted (etcd_store::requests()), and the gRPC calls etcd counted
//                    (/metrics: grpc_server_started_total; the JSON gateway forwards each HTTP
//                    request as one gRPC call, a watch as one stream)
//   peak req/s       the highest 1 s window while the first round formed (both counts)
//   etcd CPU         utime+stime of the etcd process over the idle window, % of one core
// Every wait is capped (--cap-s): a size that does not form, or does not re-form, is reported as
// "none in X s". A participant whose join() or next_round() throws (a lease that lapsed under
// load) is named in the note and no longer waited for. A table goes to stdout, JSON to
// --out=FILE (plot_rendezvous_scale.py draws it).
//
//   rendezvous_scale [--sizes=4,16,64,128,256,512,1024] [--cap-s=120] [--idle-s=5]
//                    [--max-processes=64] [--hb-interval-ms=500] [--hb-timeout-ms=2000]
//                    [--poll-ms=50] [--hosts=H] [--relays=R] [--label=TEXT] [--out=FILE]
//                    [--participant=PATH] [--require-idle-per-participant=R] [--launcher[=PATH]]
//
// --require-idle-per-participant=R makes it a test (the suite runs one): exit 1 unless every size
// formed, re-formed after both deaths, and asked etcd at most R requests/s per participant idle;
// with --hosts and not root it exits 77 (skipped).
//
// --hosts=H puts the participant processes in H network namespaces (dealt in turn), each joined
// by a veth to a bridge in this namespace where etcd also listens, as H hosts would reach one
// etcd (root and iproute2; tests/two_hosts_netns.sh does the same with two). The namespaces
// share this machine's CPUs: it separates the network paths, not the hardware.
//
// --relays=R gives the participants R store relays (tools/agent/store_relay.hpp, what elastic-run
// runs on each host), processes dealt to them in turn: one etcd client, lease and watch per range
// per relay. The relays run in this process; their etcd requests are the client counts (the
// peak column has only etcd's).
//
// --launcher (with --hosts=H, instead of --relays) runs each host as a user would: one
// `elastic-run` per namespace (PATH, default the build's), whose workers are that host's
// participant processes, speaking to etcd through that launcher's relay. A retired death is the
// victim worker SIGKILLed and nothing else done by the driver: its launcher's relay erases its keys
// when its connections close (its restart only sleeps); a silent vanish SIGSTOPs the victim worker
// (its launcher still renews the host's lease: only the peer heartbeats can tell). The launchers
// are separate processes, so the client counts are etcd's.
#include <curl/curl.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <elastic/internal/env.hpp>
#include <elastic/internal/json_text.hpp>
#include <elastic/rendezvous/etcd_store.hpp>
#include <elastic/rendezvous/rendezvous_options.hpp>
#include <elastic/rendezvous/run_keys.hpp>

#include "agent/store_relay.hpp"
#include "support/etcd_server.hpp"
#include "support/process.hpp"

#ifndef ELASTIC_RDZV_PARTICIPANT
#define ELASTIC_RDZV_PARTICIPANT "rendezvous_participant"
#endif
#ifndef ELASTIC_RUN_PATH
#define ELASTIC_RUN_PATH "elastic-run"
#endif

namespace {

namespace rdzv = elastic::rendezvous;
using elastic::test::child_process;
using elastic::test::etcd_server;
using std::chrono::milliseconds;
using clock_type = std::chrono::steady_clock;

std::atomic<bool> interrupted{false};
void on_signal(int) { interrupted = true; }

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now().time_since_epoch()).count();
}

struct settings {
  std::vector<int> sizes{4, 16, 64, 128, 256, 512, 1024};
  double cap_s = 120;
  double idle_s = 5;
  int max_processes = 64;
  int hb_interval_ms = 500;
  int hb_timeout_ms = 2000;
  int poll_ms = 50;
  int sample_ms = 250;
  int hosts = 0;  // 0: every process in this network namespace; else that many namespaces
  int relays = 0;  // 0: each participant its own etcd client; else that many store relays (hosts)
  double require_idle = 0;  // > 0: fail unless every size formed, re-formed twice, idled below it
  std::string label;
  std::string out;
  std::string participant = ELASTIC_RDZV_PARTICIPANT;
  std::string launcher;  // non-empty: elastic-run, one per --hosts namespace
};

/// What one size gave; a nullopt time is "none within the cap".
struct result {
  int n = 0;
  int processes = 0;
  int max_per_process = 0;
  int hosts = 0;
  int relays = 0;
  bool launchers = false;  // each host its own elastic-run
  int failed = 0;  // participants whose join()/next_round() threw (out of the group)
  int formed = 0;  // participants with a round when the first-round wait ended
  std::optional<double> first_round_s, retired_s, silent_s;
  std::optional<double> first_partial_s;  // when the last of `formed` got its round (not all did)
  std::optional<double> retired_noticed_s, silent_noticed_s;  // when the last survivor's poll() saw it
  bool retired_tried = false, silent_tried = false;
  std::optional<double> idle_client, idle_etcd, peak_client, peak_etcd, etcd_cpu_pct;
  std::string note;
  std::string phases;  // when the run's keys appeared (phase_tracer), per measured round
};

/// GET on etcd's client port (for /metrics); empty when it does not answer in 5 s.
std::string http_get(const std::string& url) {
  std::unique_ptr<CURL, void (*)(CURL*)> h(::curl_easy_init(), ::curl_easy_cleanup);
  std::string body;
  if (!h) return body;
  ::curl_easy_setopt(h.get(), CURLOPT_URL, url.c_str());
  ::curl_easy_setopt(h.get(), CURLOPT_NOSIGNAL, 1L);
  ::curl_easy_setopt(h.get(), CURLOPT_PROXY, "");
  ::curl_easy_setopt(h.get(), CURLOPT_TIMEOUT_MS, 5000L);
  ::curl_easy_setopt(h.get(), CURLOPT_WRITEFUNCTION,
                     +[](char* d, std::size_t, std::size_t n, void* out) {
                       static_cast<std::string*>(out)->append(d, n);
                       return n;
                     });
  ::curl_easy_setopt(h.get(), CURLOPT_WRITEDATA, &body);
  if (::curl_easy_perform(h.get()) != CURLE_OK) body.clear();
  return body;
}

/// Sum of every series of `metric` in a Prometheus text page; nullopt when the page is empty.
std::optional<double> metric_sum(const std::string& page, std::string_view metric) {
  if (page.empty()) return std::nullopt;
  double sum = 0;
  std::istringstream in(page);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(metric, 0) != 0) continue;
    const char next = line.size() > metric.size() ? line[metric.size()] : ' ';
    if (next != '{' && next != ' ') continue;
    sum += std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr);
  }
  return sum;
}

/// etcd's gRPC calls so far, as its /metrics counts them (gateway requests included).
std::optional<double> etcd_calls(const etcd_server& etcd) {
  return metric_sum(http_get("http://" + etcd.endpoint() + "/metrics"), "grpc_server_started_total");
}

/// utime + stime of `pid` in seconds.
std::optional<double> cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = s.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(s.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i)
    if (i == 14 || i == 15) ticks += std::strtod(field.c_str(), nullptr);
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

/// `hosts` network namespaces, each joined by a veth to a bridge in this namespace, where etcd
/// also listens: participant processes placed in them reach etcd as other hosts would, over a
/// link of their own (as tests/two_hosts_netns.sh does with two). Needs root and iproute2;
/// everything is removed by the destructor (a namespace's veth goes with it).
class netns_hosts {
 public:
  explicit netns_hosts(int hosts) {
    if (hosts <= 0) return;
    if (::geteuid() != 0) throw std::runtime_error("--hosts needs root (network namespaces)");
    if (hosts > 250) throw std::runtime_error("--hosts: at most 250");
    const int pid = ::getpid();
    tag_ = fmt::format("rs{}", pid % 100000);
    net_ = fmt::format("10.233.{}", pid % 250);
    try {
      sh(fmt::format("ip link add {0}b type bridge && ip addr add {1}.1/24 dev {0}b && ip link set {0}b up", tag_, net_));
      bridge_ = true;
      for (int i = 0; i < hosts; ++i) {
        const std::string ns = fmt::format("{}h{}", tag_, i);
        sh(fmt::format("ip netns add {}", ns));
        names_.push_back(ns);
        sh(fmt::format("ip link add {0}v{1} type veth peer name {0}p{1} && ip link set {0}p{1} netns {2} && "
                       "ip link set {0}v{1} master {0}b && ip link set {0}v{1} up && "
                       "ip -n {2} addr add {3}.{4}/24 dev {0}p{1} && ip -n {2} link set {0}p{1} up && "
                       "ip -n {2} link set lo up",
                       tag_, i, ns, net_, i + 2));
      }
    } catch (...) {
      remove();
      throw;
    }
  }
  netns_hosts(const netns_hosts&) = delete;
  netns_hosts& operator=(const netns_hosts&) = delete;
  ~netns_hosts() { remove(); }

  [[nodiscard]] int count() const { return static_cast<int>(names_.size()); }
  /// Host `i`'s own address (its end of the veth).
  [[nodiscard]] std::string address(int i) const { return fmt::format("{}.{}", net_, i % count() + 2); }
  /// The address etcd serves the namespaces on (the bridge's).
  [[nodiscard]] std::string gateway() const { return net_ + ".1"; }
  /// The command prefix that runs a program in host `i`'s namespace (ip netns exec execs it, so
  /// the child's pid is the program's).
  [[nodiscard]] std::vector<std::string> prefix(int i) const {
    return {"/usr/sbin/ip", "netns", "exec", names_[static_cast<std::size_t>(i) % names_.size()]};
  }

 private:
  static void sh(const std::string& cmd) {
    if (std::system((cmd + " 2>&1").c_str()) != 0) throw std::runtime_error("failed: " + cmd);
  }
  void remove() noexcept {
    for (const auto& ns : names_) std::system(fmt::format("ip netns del {} 2>/dev/null", ns).c_str());
    names_.clear();
    if (bridge_) std::system(fmt::format("ip link del {}b 2>/dev/null", tag_).c_str());
    bridge_ = false;
  }

  std::string tag_, net_;
  std::vector<std::string> names_;
  bool bridge_ = false;
};

/// When the run's keys appeared in etcd, as a watch of the run's whole range sees them: heartbeat
/// keys, each round's join records, its closer's claim, its outcome and its leader's bootstrap. Splits a round's time into
/// sessions starting, joins arriving, the closer closing, and members hearing of it.
class phase_tracer {
 public:
  phase_tracer(const std::string& url, std::string prefix)
      : store_(url), prefix_(std::move(prefix)),
        feed_(store_.watch(prefix_, prefix_.substr(0, prefix_.size() - 1) + "0", {.snapshot = false})),
        thread_([this](std::stop_token st) { follow(st); }) {}

  /// "alive 0.01-0.90 s, joins 0.05-1.20 s (1024), closer 0.06 s, closed 1.30 s" from `t0`.
  std::string describe(std::int64_t round, std::int64_t t0) {
    std::lock_guard lk(mu_);
    auto s = [t0](std::int64_t t) { return t == 0 ? std::string("-") : fmt::format("{:.2f}", (t - t0) / 1e9); };
    std::string out;
    if (round == 1 && alive_.count > 0) {
      out += fmt::format("alive keys {}-{} s ({}), ", s(alive_.first), s(alive_.last), alive_.count);
    }
    const auto g = std::find_if(gone_.begin(), gone_.end(), [t0](std::int64_t t) { return t >= t0; });
    if (g != gone_.end()) out += fmt::format("declared gone {} s, ", s(*g));
    const auto it = rounds_.find(round);
    if (it == rounds_.end()) return out + fmt::format("round {}: no keys seen", round);
    const auto& r = it->second;
    return out + fmt::format("round {}: joins {}-{} s ({}), closer {} s, closed {} s, bootstrap {} s", round,
                             s(r.joins.first), s(r.joins.last), r.joins.count, s(r.closer), s(r.closed),
                             s(r.bootstrap));
  }

 private:
  struct span {
    int count = 0;
    std::int64_t first = 0, last = 0;
    void add(std::int64_t t) {
      if (count++ == 0) first = t;
      last = t;
    }
  };
  struct round_marks {
    span joins;
    std::int64_t closer = 0, closed = 0, bootstrap = 0;
  };

  void follow(const std::stop_token& st) {
    while (!st.stop_requested()) {
      if (!feed_->wait(milliseconds(100))) continue;
      bool reset = false;
      auto events = feed_->take(reset);
      const std::int64_t t = now_ns();
      std::lock_guard lk(mu_);
      for (const auto& e : events) {
        if (!e.value) continue;
        const std::string_view k = std::string_view(e.key).substr(prefix_.size());
        auto number_after = [&](std::string_view head) -> std::optional<std::int64_t> {
          if (!k.starts_with(head)) return std::nullopt;
          const auto rest = k.substr(head.size());
          return elastic::internal::parse_integer(rest.substr(0, rest.find('/')));
        };
        if (k.starts_with("alive/")) {
          alive_.add(t);
        } else if (k.starts_with("gone/")) {
          gone_.push_back(t);
        } else if (auto r = number_after("round/"); r && k.find("/join/") != std::string_view::npos) {
          rounds_[*r].joins.add(t);
        } else if (auto c = number_after("closer/")) {
          if (rounds_[*c].closer == 0) rounds_[*c].closer = t;
        } else if (auto d = number_after("closed/")) {
          rounds_[*d].closed = t;
        } else if (auto b = number_after("bootstrap/")) {
          rounds_[*b].bootstrap = t;
        }
      }
    }
  }

  rdzv::etcd_store store_;
  std::string prefix_;
  std::unique_ptr<rdzv::key_feed> feed_;
  std::mutex mu_;
  span alive_;
  std::vector<std::int64_t> gone_;
  std::map<std::int64_t, round_marks> rounds_;
  std::jthread thread_;  // last: stopped before the rest goes
};

/// A file another process appends lines to, read as it grows (a participant's --report).
class report_file {
 public:
  report_file() = default;
  explicit report_file(std::string path) : path_(std::move(path)) {}
  report_file(report_file&& o) noexcept
      : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)), buffer_(std::move(o.buffer_)) {}
  report_file& operator=(report_file&& o) noexcept {
    if (this != &o) {
      close();
      path_ = std::move(o.path_);
      fd_ = std::exchange(o.fd_, -1);
      buffer_ = std::move(o.buffer_);
    }
    return *this;
  }
  ~report_file() { close(); }

  /// The next whole line written so far, if any (the file need not exist yet).
  std::optional<std::string> next() {
    for (;;) {
      if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      if (fd_ < 0) fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd_ < 0) return std::nullopt;
      char buf[4096];
      const ssize_t n = ::read(fd_, buf, sizeof buf);
      if (n <= 0) return std::nullopt;  // nothing more yet
      buffer_.append(buf, static_cast<std::size_t>(n));
    }
  }

 private:
  void close() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  std::string path_;
  int fd_ = -1;
  std::string buffer_;
};

/// One participant process and what it said.
struct host_proc {
  child_process child;  // the process itself, or nothing when a launcher started it
  report_file report;   // where it reports, when a launcher started it
  pid_t pid = 0;        // from its "ready" line
  std::vector<std::string> ids;
  bool ready = false;
  bool gone = false;                                 // killed or stopped on purpose
  std::map<std::int64_t, std::uint64_t> requests;    // bucket -> its stores' total
};

/// The run: processes, what they reported, and the participants' newest rounds.
class run_state {
 public:
  run_state(const settings& cfg, int n, const etcd_server& etcd, const netns_hosts& hosts, const std::string& dir,
            const std::vector<std::string>& relay_urls)
      : cfg_(cfg), n_(n), go_(dir + "/go") {
    // The victims come first, one process each; the rest are spread evenly.
    const int procs = std::min(n, cfg.max_processes);
    std::vector<std::vector<std::string>> groups(static_cast<std::size_t>(procs));
    for (int i = 0; i < n; ++i) {
      const std::string id = fmt::format("p{:04}", n - 1 - i);  // victims: the highest ids, not rank 0
      const int g = i < 2 || procs <= 2 ? std::min(i, procs - 1) : 2 + (i - 2) % (procs - 2);
      groups[static_cast<std::size_t>(g)].push_back(id);
    }
    // In namespaces, processes are dealt to hosts in turn (the victims to hosts 0 and 1).
    const std::string url =
        hosts.count() > 0 ? fmt::format("etcd://{}:{}", hosts.gateway(), etcd.port()) : etcd.url();
    if (!cfg.launcher.empty()) {
      launch(groups, url, hosts, dir);
      return;
    }
    for (std::size_t i = 0; i < groups.size(); ++i) {
      host_proc h;
      h.ids = groups[i];
      std::vector<std::string> argv;
      if (hosts.count() > 0) argv = hosts.prefix(static_cast<int>(i));
      // A relay here, in the driver's namespace, would give them its address for their peer
      // heartbeats (elastic-run's runs on their host): each is told its own.
      if (hosts.count() > 0 && !relay_urls.empty()) {
        argv.insert(argv.end(), {"/usr/bin/env", "ELASTIC_HOST_ADDR=" + hosts.address(static_cast<int>(i))});
      }
      // With relays, processes are dealt to them in turn too (a relay per host).
      const std::string store = relay_urls.empty() ? url : relay_urls[i % relay_urls.size()];
      argv.push_back(cfg.participant);
      argv.push_back("--store=" + store);
      participant_args(argv, fmt::format("{}", fmt::join(groups[i], ",")));
      h.child = child_process::spawn(std::move(argv));
      procs_.push_back(std::move(h));
    }
  }
  run_state(const run_state&) = delete;
  run_state& operator=(const run_state&) = delete;
  /// Launchers are asked to stop first (SIGTERM: they stop their workers and remove what they
  /// made in /dev/shm); what still runs 20 s later is SIGKILLed by the child_process.
  ~run_state() {
    for (auto& l : launchers_) l.kill(SIGTERM);
    for (auto& l : launchers_) (void)l.wait_for(std::chrono::seconds(20));
  }

  [[nodiscard]] int processes() const { return static_cast<int>(procs_.size()); }
  [[nodiscard]] int max_per_process() const {
    std::size_t m = 0;
    for (const auto& p : procs_) m = std::max(m, p.ids.size());
    return static_cast<int>(m);
  }
  host_proc& proc(std::size_t i) { return procs_[i]; }

  /// Reads what every process said so far (without waiting).
  void drain() {
    for (auto& p : procs_) {
      if (launchers_.empty()) {
        while (auto line = p.child.read_line(milliseconds(0))) take(p, *line);
      } else {
        while (auto line = p.report.next()) take(p, *line);
      }
    }
    for (auto& l : launchers_) {
      while (l.read_line(milliseconds(0))) {
      }
    }
  }

  /// Sends `sig` to participant process `i` (a launcher's worker, or the driver's own child).
  void signal(std::size_t i, int sig) {
    auto& p = procs_[i];
    if (!launchers_.empty()) {
      if (p.pid > 0) ::kill(p.pid, sig);
    } else {
      p.child.kill(sig);
    }
  }
  [[nodiscard]] bool launched() const { return !launchers_.empty(); }

  /// Drains until `done()` or the cap or a signal; true if done.
  template <class Done>
  bool wait(double cap_s, Done done) {
    const auto until = clock_type::now() + std::chrono::duration<double>(cap_s);
    for (;;) {
      drain();
      if (done()) return true;
      if (interrupted || clock_type::now() >= until) return false;
      std::this_thread::sleep_for(milliseconds(5));
    }
  }

  bool all_ready(double cap_s) {
    return wait(cap_s, [&] {
      // A process's first tick of requests must precede the start line, for the peak's first window.
      return std::all_of(procs_.begin(), procs_.end(),
                         [](const host_proc& p) { return p.ready && !p.requests.empty(); });
    });
  }

  /// The start line: participants join once this file exists.
  std::int64_t start() {
    const std::int64_t t0 = now_ns();
    std::ofstream(go_) << t0 << '\n';
    return t0;
  }

  /// Participants of live processes whose newest round is past `round`, and the latest time one
  /// of them got there.
  [[nodiscard]] std::pair<int, std::int64_t> past(std::int64_t round) const {
    const auto at = times(first_past_, [round](const auto& rounds) { return rounds.upper_bound(round); });
    return {static_cast<int>(at.size()), at.empty() ? 0 : at.back().first};
  }
  /// How many live participants noticed a change while in `round` (their poll()), when the last
  /// of them did, and who that was.
  [[nodiscard]] std::tuple<int, std::int64_t, std::string> noticed(std::int64_t round) const {
    const auto at = times(first_noticed_, [round](const auto& rounds) { return rounds.find(round); });
    if (at.empty()) return {0, 0, ""};
    return {static_cast<int>(at.size()), at.back().first, at.back().second};
  }
  /// When the live participants got past `round`, from `t0`: "median M s, 90 % N s, last L s (ID)".
  [[nodiscard]] std::string spread(std::int64_t round, std::int64_t t0) const {
    const auto at = times(first_past_, [round](const auto& rounds) { return rounds.upper_bound(round); });
    if (at.empty()) return "none";
    auto s = [t0](std::int64_t t) { return (t - t0) / 1e9; };
    return fmt::format("median {:.2f} s, 90 % {:.2f} s, last {:.2f} s ({})", s(at[at.size() / 2].first),
                       s(at[at.size() * 9 / 10].first), s(at.back().first), at.back().second);
  }
  [[nodiscard]] int live_participants() const {
    int c = 0;
    for (const auto& p : procs_)
      if (!p.gone)
        for (const auto& id : p.ids) c += failed_.contains(id) ? 0 : 1;
    return c;
  }
  /// The newest round any participant reported.
  [[nodiscard]] std::int64_t newest_round() const { return newest_; }
  [[nodiscard]] std::int64_t last_round_line_ns() const { return last_line_ns_; }
  [[nodiscard]] const std::vector<std::string>& errors() const { return errors_; }
  [[nodiscard]] int failed() const { return static_cast<int>(failed_.size()); }

  /// The stores' request total over all live processes at `bucket`, when each of them reported it.
  [[nodiscard]] std::optional<std::uint64_t> requests_at(std::int64_t bucket) const {
    std::uint64_t sum = 0;
    for (const auto& p : procs_) {
      if (p.gone) continue;
      auto it = p.requests.find(bucket);
      if (it == p.requests.end()) return std::nullopt;
      sum += it->second;
    }
    return sum;
  }
  [[nodiscard]] std::int64_t bucket_of(std::int64_t t_ns) const { return t_ns / (cfg_.sample_ms * 1'000'000LL); }

 private:
  using round_times = std::map<std::string, std::map<std::int64_t, std::int64_t>>;  // id -> round -> t_ns

  /// (time, id) of each live participant's entry in `by_id` that `pick` finds in its rounds,
  /// earliest first.
  template <class Pick>
  [[nodiscard]] std::vector<std::pair<std::int64_t, std::string>> times(const round_times& by_id, Pick pick) const {
    std::vector<std::pair<std::int64_t, std::string>> at;
    for (const auto& p : procs_) {
      if (p.gone) continue;
      for (const auto& id : p.ids) {
        auto it = by_id.find(id);
        if (it == by_id.end() || failed_.contains(id)) continue;
        if (auto r = pick(it->second); r != it->second.end()) at.emplace_back(r->second, id);
      }
    }
    std::sort(at.begin(), at.end());
    return at;
  }

  void take(host_proc& p, const std::string& line) {
    std::istringstream in(line);
    std::string what;
    in >> what;
    if (what == "ready") {
      p.ready = true;
      in >> p.pid;
    } else if (what == "round") {
      std::string id;
      std::int64_t round = 0, world = 0, t = 0;
      in >> id >> round >> world >> t;
      first_past_[id].emplace(round, t);  // the first time this participant reached `round`
      newest_ = std::max(newest_, round);
      last_line_ns_ = std::max(last_line_ns_, t);
    } else if (what == "noticed") {
      std::string id;
      std::int64_t round = 0, t = 0;
      in >> id >> round >> t;
      first_noticed_[id].emplace(round, t);
    } else if (what == "requests") {
      std::int64_t bucket = 0;
      std::uint64_t total = 0;
      in >> bucket >> total;
      p.requests[bucket] = total;
    } else if (what == "error") {
      // Its join()/next_round() threw: it is out of the group, as an elastic_group whose
      // rebuild failed would be; the others are timed without it.
      std::string id;
      in >> id;
      failed_.insert(id);
      if (errors_.size() < 3) errors_.push_back(line);
    }
  }

  /// --launcher: one elastic-run per host namespace, whose workers are the processes dealt to that
  /// host (each worker slot its group of ids, its own report file).
  void launch(const std::vector<std::vector<std::string>>& groups, const std::string& url, const netns_hosts& hosts,
              const std::string& dir) {
    const int nh = hosts.count();
    procs_.resize(groups.size());
    for (int h = 0; h < nh; ++h) {
      std::string slots;
      int slot = 0;
      const std::string report = fmt::format("{}/report-h{}-", dir, h);
      for (std::size_t i = static_cast<std::size_t>(h); i < groups.size(); i += static_cast<std::size_t>(nh), ++slot) {
        slots += fmt::format("{}{}", slots.empty() ? "" : ";", fmt::join(groups[i], ","));
        procs_[i].ids = groups[i];
        procs_[i].report = report_file(report + std::to_string(slot));
      }
      if (slot == 0) continue;  // more hosts than processes
      std::vector<std::string> argv = hosts.prefix(h);
      // Its own messages to a log of its own (stderr); stdout is drained and dropped (--quiet:
      // the workers' lines go to their logs, the reports to their files).
      argv.insert(argv.end(), {"/bin/sh", "-c", fmt::format("exec \"$0\" \"$@\" 2>>{}/launcher-h{}.log", dir, h),
                               cfg_.launcher, "--run-id", "scale-launch", "--rdzv", url, "--nproc-per-node",
                               std::to_string(slot), "--quiet", "--no-timeline", "--log-dir",
                               fmt::format("{}/logs-h{}", dir, h), "--grace", "2", "--", cfg_.participant,
                               "--report=" + report});  // the store: the launcher's relay (ELASTIC_RDZV)
      participant_args(argv, slots);
      launchers_.push_back(child_process::spawn(std::move(argv)));
    }
  }

  /// What every participant process is told besides its store: the run, its ids, the start line
  /// and the timings.
  void participant_args(std::vector<std::string>& argv, const std::string& ids) const {
    argv.insert(argv.end(),
                {"--run=scale", fmt::format("--min={}", std::max(1, n_ - 2)), fmt::format("--max={}", n_), "--ids=" + ids,
                 "--go=" + go_, fmt::format("--poll-ms={}", cfg_.poll_ms),
                 fmt::format("--hb-interval-ms={}", cfg_.hb_interval_ms),
                 fmt::format("--hb-timeout-ms={}", cfg_.hb_timeout_ms), fmt::format("--sample-ms={}", cfg_.sample_ms),
                 fmt::format("--join-timeout-ms={}", static_cast<long long>(cfg_.cap_s * 2000))});
  }

  const settings& cfg_;
  int n_;
  std::string go_;
  std::vector<host_proc> procs_;
  std::vector<child_process> launchers_;  // --launcher: one per host; last, stopped first
  round_times first_past_;     // when each participant first got past each round
  round_times first_noticed_;  // when each participant's poll() first saw a change in each round
  std::int64_t newest_ = 0;
  std::int64_t last_line_ns_ = 0;
  std::vector<std::string> errors_;
  std::set<std::string> failed_;
};

/// Waits (draining) until nobody has completed a round for `quiet_s`, at most `cap_s`.
void settle(run_state& run, double quiet_s, double cap_s) {
  run.wait(cap_s, [&] { return run.last_round_line_ns() + static_cast<std::int64_t>(quiet_s * 1e9) < now_ns(); });
}

void sleep_draining(run_state& run, double s) {
  run.wait(s, [] { return false; });
}

/// When every live participant's poll() in `round` had seen the change, from `t0` (seconds;
/// nothing when some never did), and the keys line's words for it: "noticed by all 2.41 s
/// (p0123), " or "noticed by 1020 of 1022, ".
std::pair<std::optional<double>, std::string> noticed_by_all(const run_state& run, std::int64_t round,
                                                             std::int64_t t0) {
  const auto [count, last, who] = run.noticed(round);
  const int live = run.live_participants();
  if (count == 0 || count < live) return {std::nullopt, fmt::format("noticed by {} of {}, ", count, live)};
  const double s = (last - t0) / 1e9;
  return {s, fmt::format("noticed by all {:.2f} s ({}), ", s, who)};
}

result measure(const settings& cfg, int n) {
  result res;
  res.n = n;
  netns_hosts hosts(cfg.hosts);
  etcd_server::options eo;
  if (hosts.count() > 0) eo.extra_client_hosts.push_back(hosts.gateway());
  etcd_server etcd(eo);
  elastic::test::temp_dir dir;
  // One participant per host: --relays store relays (elastic-run's, in this process), each with
  // its own etcd client; their requests are the participants' requests.
  std::vector<std::unique_ptr<elastic::agent::store_relay>> relays;
  std::vector<rdzv::etcd_store*> relay_clients;
  std::vector<std::string> relay_urls;
  for (int h = 0; h < cfg.relays; ++h) {
    auto up = std::make_unique<rdzv::etcd_store>(
        hosts.count() > 0 ? fmt::format("etcd://{}:{}", hosts.gateway(), etcd.port()) : etcd.url());
    relay_clients.push_back(up.get());
    relays.push_back(std::make_unique<elastic::agent::store_relay>(std::move(up), dir.file(fmt::format("r{}", h))));
    relay_urls.push_back(relays.back()->url());
  }
  auto relay_requests = [&] {
    std::uint64_t r = 0;
    for (auto* c : relay_clients) r += c->requests();
    return r;
  };
  // The run's keys as they appear (its own etcd client: one watch stream).
  phase_tracer phases(etcd.url(), rdzv::rendezvous_options{}.key_prefix + "/scale/");
  run_state run(cfg, n, etcd, hosts, dir.path(), relay_urls);
  res.hosts = hosts.count();
  res.relays = cfg.relays;
  res.launchers = run.launched();
  // What a participant threw (a join timeout, a refusal) goes into the note on every path.
  auto done = [&]() -> result {
    res.failed = run.failed();
    if (res.failed > 0) {
      res.note += fmt::format("{}{} participant(s) threw and left the group, e.g.", res.note.empty() ? "" : ". ",
                              res.failed);
    }
    for (const auto& e : run.errors()) res.note += " [" + e + "]";
    return res;
  };
  res.processes = run.processes();
  res.max_per_process = run.max_per_process();
  if (!run.all_ready(60)) {
    res.note = "participants did not start within 60 s";
    return done();
  }

  // First round, sampling etcd's count every second for the peak.
  std::vector<std::pair<std::int64_t, double>> etcd_samples;
  auto sample_etcd = [&] {
    if (auto c = etcd_calls(etcd)) etcd_samples.emplace_back(now_ns(), *c);
  };
  sample_etcd();
  const std::int64_t t0 = run.start();
  std::int64_t next_sample = t0 + 1'000'000'000;
  const bool formed = run.wait(cfg.cap_s, [&] {
    if (now_ns() >= next_sample) {
      sample_etcd();
      next_sample += 1'000'000'000;
    }
    return run.past(0).first == n;
  });
  res.formed = run.past(0).first;
  if (formed) res.first_round_s = (run.past(0).second - t0) / 1e9;
  else if (res.formed > 0) res.first_partial_s = (run.past(0).second - t0) / 1e9;

  const std::int64_t formed_at = formed ? run.past(0).second : now_ns();
  sleep_draining(run, 1.0);
  res.phases = "first: " + phases.describe(1, t0) + "; members " + run.spread(0, t0);
  sample_etcd();

  // Peak: the busiest 1 s window from the start to a second after the round formed.
  const int per_s = 1000 / cfg.sample_ms;
  double peak = 0;
  bool any = false;
  for (std::int64_t b = run.bucket_of(t0); b + per_s <= run.bucket_of(formed_at) + per_s; ++b) {
    auto a = run.requests_at(b), z = run.requests_at(b + per_s);
    if (a && z) {
      peak = std::max(peak, static_cast<double>(*z - *a));
      any = true;
    }
  }
  if (any && relays.empty() && !run.launched()) res.peak_client = peak;
  double epeak = 0;
  for (std::size_t i = 1; i < etcd_samples.size(); ++i) {
    const double dt = (etcd_samples[i].first - etcd_samples[i - 1].first) / 1e9;
    if (dt > 0.2) epeak = std::max(epeak, (etcd_samples[i].second - etcd_samples[i - 1].second) / dt);
  }
  if (etcd_samples.size() > 1) res.peak_etcd = epeak;
  if (!formed) {
    res.note = res.first_partial_s ? fmt::format("{} of {} had a round after {:.0f} s, the last of them at {:.1f} s",
                                                 res.formed, n, cfg.cap_s, *res.first_partial_s)
                                   : fmt::format("none of {} had a round after {:.0f} s", n, cfg.cap_s);
    return done();
  }

  if (interrupted) return done();
  // Idle: a formed round with every watcher polling.
  settle(run, 1.0, cfg.cap_s);
  {
    const auto cpu0 = cpu_seconds(etcd.pid());
    const auto calls0 = etcd_calls(etcd);
    const auto relayed0 = relay_requests();
    const std::int64_t w0 = now_ns();
    const std::int64_t b0 = run.bucket_of(w0) + 1;
    const std::int64_t b1 = b0 + static_cast<std::int64_t>(cfg.idle_s * 1000 / cfg.sample_ms);
    run.wait(cfg.idle_s + 30, [&] { return run.requests_at(b1).has_value() && now_ns() >= w0 + cfg.idle_s * 1e9; });
    const std::int64_t w1 = now_ns();
    const auto cpu1 = cpu_seconds(etcd.pid());
    const auto calls1 = etcd_calls(etcd);
    const double window = (w1 - w0) / 1e9;
    if (run.launched()) {
      if (calls0 && calls1) res.idle_client = (*calls1 - *calls0) / window;  // the launchers' requests
    } else if (!relays.empty()) {
      res.idle_client = static_cast<double>(relay_requests() - relayed0) / window;
    } else if (auto a = run.requests_at(b0), z = run.requests_at(b1); a && z) {
      res.idle_client = static_cast<double>(*z - *a) / ((b1 - b0) * cfg.sample_ms / 1000.0);
    }
    if (calls0 && calls1) res.idle_etcd = (*calls1 - *calls0) / window;
    if (cpu0 && cpu1) res.etcd_cpu_pct = 100 * (*cpu1 - *cpu0) / window;
  }

  // A death that elastic-run retires: SIGKILL, reap, erase the alive key.
  if (interrupted) return done();
  {
    res.retired_tried = true;
    const std::int64_t round = run.newest_round();
    host_proc& victim = run.proc(0);
    rdzv::etcd_options admin_options;
    admin_options.unavailable_timeout = std::chrono::seconds(5);  // elastic-run retries in the background
    rdzv::etcd_store admin(etcd.url(), admin_options);
    const std::int64_t t = now_ns();
    run.signal(0, SIGKILL);
    victim.gone = true;
    if (!run.launched()) {  // under a launcher, its relay erases the keys of a worker that died
      victim.child.wait_for(milliseconds(5000));
      try {
        admin.erase(rdzv::alive_key(rdzv::rendezvous_options{}.key_prefix, "scale", victim.ids.front()));
      } catch (const std::exception& e) {
        res.note += fmt::format("erasing the alive key failed: {}. ", e.what());
      }
    }
    // Survivors: those alive and still in the group (one that throws meanwhile is not waited for).
    auto all_past = [&] { return run.live_participants() > 0 && run.past(round).first == run.live_participants(); };
    if (run.wait(cfg.cap_s, all_past)) {
      res.retired_s = (run.past(round).second - t) / 1e9;
      auto [noticed_s, noticed] = noticed_by_all(run, round, t);
      res.retired_noticed_s = noticed_s;
      res.phases += "; retired: " + noticed + phases.describe(round + 1, t) + "; members " + run.spread(round, t);
    } else {
      res.note += fmt::format("retired: {} of {} re-formed. ", run.past(round).first, run.live_participants());
      return done();
    }
  }

  // A silent vanish: SIGSTOP, nobody is told; the lease must expire.
  if (run.processes() > 2 && !interrupted) {
    settle(run, 1.0, cfg.cap_s);
    res.silent_tried = true;
    const std::int64_t round = run.newest_round();
    host_proc& victim = run.proc(1);
    const std::int64_t t = now_ns();
    run.signal(1, SIGSTOP);
    victim.gone = true;
    // Survivors: those alive and still in the group (one that throws meanwhile is not waited for).
    auto all_past = [&] { return run.live_participants() > 0 && run.past(round).first == run.live_participants(); };
    if (run.wait(cfg.cap_s, all_past)) {
      res.silent_s = (run.past(round).second - t) / 1e9;
      auto [noticed_s, noticed] = noticed_by_all(run, round, t);
      res.silent_noticed_s = noticed_s;
      res.phases += "; silent: " + noticed + phases.describe(round + 1, t) + "; members " + run.spread(round, t);
    } else {
      res.note += fmt::format("silent: {} of {} re-formed. ", run.past(round).first, run.live_participants());
    }
    run.signal(1, SIGKILL);  // a stopped process takes SIGKILL; the destructor (or its launcher) reaps it
  }
  return done();
}

std::string seconds_or_none(const std::optional<double>& s, bool tried, double cap) {
  if (s) return *s < 10 ? fmt::format("{:.2f} s", *s) : fmt::format("{:.1f} s", *s);
  return tried ? fmt::format("none in {:.0f} s", cap) : "-";
}
std::string rate(const std::optional<double>& r) { return r ? fmt::format("{:.0f}", *r) : "-"; }
std::string json_number(const std::optional<double>& v) { return v ? fmt::format("{:.4f}", *v) : "null"; }
/// `text` as a JSON string literal, quotes included (the library's one escaper).
std::string json_text(std::string_view text) {
  std::string out;
  elastic::internal::append_json_string(out, text);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  settings cfg;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto eq = a.find('=');
    const std::string key(a.substr(0, eq));
    const std::string value(eq == std::string_view::npos ? std::string_view() : a.substr(eq + 1));
    auto number = [&]() -> double {
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || v <= 0) {
        std::fprintf(stderr, "rendezvous_scale: %s needs a positive number, not '%s'\n", key.c_str(), value.c_str());
        std::exit(2);
      }
      return v;
    };
    if (key == "--sizes") {
      cfg.sizes.clear();
      std::istringstream in(value);
      for (std::string s; std::getline(in, s, ',');) {
        const auto v = elastic::internal::parse_integer(s);
        if (!v || *v < 4) {
          std::fprintf(stderr, "rendezvous_scale: --sizes wants numbers of at least 4, not '%s'\n", s.c_str());
          return 2;
        }
        cfg.sizes.push_back(static_cast<int>(*v));
      }
    } else if (key == "--cap-s") cfg.cap_s = number();
    else if (key == "--idle-s") cfg.idle_s = number();
    else if (key == "--max-processes") cfg.max_processes = std::max(3, static_cast<int>(number()));
    else if (key == "--hb-interval-ms") cfg.hb_interval_ms = static_cast<int>(number());
    else if (key == "--hb-timeout-ms") cfg.hb_timeout_ms = static_cast<int>(number());
    else if (key == "--poll-ms") cfg.poll_ms = static_cast<int>(number());
    else if (key == "--hosts") cfg.hosts = static_cast<int>(number());
    else if (key == "--relays") cfg.relays = static_cast<int>(number());
    else if (key == "--require-idle-per-participant") cfg.require_idle = number();
    else if (key == "--label") cfg.label = value;
    else if (key == "--out") cfg.out = value;
    else if (key == "--participant") cfg.participant = value;
    else if (key == "--launcher") cfg.launcher = value.empty() ? std::string(ELASTIC_RUN_PATH) : value;
    else {
      std::fprintf(stderr, "rendezvous_scale: unknown argument %s (see the comment at the top of "
                           "benchmarks/rendezvous_scale.cpp)\n", argv[i]);
      return 2;
    }
  }
  if (!cfg.launcher.empty() && (cfg.hosts == 0 || cfg.relays > 0)) {
    std::fprintf(stderr, "rendezvous_scale: --launcher runs one elastic-run per --hosts namespace: it needs --hosts "
                         "and takes no --relays (each launcher is its host's relay)\n");
    return 2;
  }
  if (cfg.hosts > 0 && cfg.require_idle > 0) {
    // As a test, a machine that cannot make network namespaces (not root, no iproute2, a
    // container without CAP_SYS_ADMIN) skips it, as tests/two_hosts_netns.sh does.
    const std::string probe = fmt::format("rsprobe{}", ::getpid() % 100000);
    const bool can = ::geteuid() == 0 &&
                     std::system(fmt::format("ip netns add {} >/dev/null 2>&1", probe).c_str()) == 0;
    if (can) std::system(fmt::format("ip netns del {} >/dev/null 2>&1", probe).c_str());
    if (!can) {
      std::printf("rendezvous_scale: skipped: --hosts needs root and network namespaces (iproute2)\n");
      return 77;  // the suite's "cannot run here"
    }
  }
  // Each participant holds a few connections to etcd, which must accept them all.
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    nofile.rlim_cur = nofile.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &nofile);
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);

  std::printf("rendezvous_scale: %s; heartbeat %d ms, timeout %d ms; poll every %d ms; cap %.0f s; idle window %.0f s; "
              "%u CPUs\n",
              cfg.label.empty() ? "(no label)" : cfg.label.c_str(), cfg.hb_interval_ms, cfg.hb_timeout_ms,
              cfg.poll_ms, cfg.cap_s, cfg.idle_s, std::thread::hardware_concurrency());
  std::printf("%6s  %-16s  %-14s  %-16s  %-16s  %-22s  %-10s  %-15s  %s\n", "N", "layout", "first round",
              "retired re-round", "silent re-round", "idle req/s client (per)", "idle etcd", "peak client/etcd",
              "etcd CPU idle");
  std::fflush(stdout);
  std::vector<result> results;
  for (int n : cfg.sizes) {
    if (interrupted) break;
    result r;
    try {
      r = measure(cfg, n);
    } catch (const std::exception& e) {
      r.n = n;
      r.note = fmt::format("failed: {}", e.what());
    }
    std::string layout = r.max_per_process <= 1 ? fmt::format("{} procs", r.processes)
                                                 : fmt::format("{} procs <={} thr", r.processes, r.max_per_process);
    if (r.hosts > 0) layout += fmt::format(" {} ns", r.hosts);
    if (r.relays > 0) layout += fmt::format(" {} relays", r.relays);
    if (r.launchers) layout += " elastic-run";
    const std::string idle =
        r.idle_client ? fmt::format("{:.0f} ({:.1f})", *r.idle_client, *r.idle_client / n) : std::string("-");
    std::printf("%6d  %-16s  %-14s  %-16s  %-16s  %-22s  %-10s  %-15s  %s\n", n, layout.c_str(),
                seconds_or_none(r.first_round_s, true, cfg.cap_s).c_str(),
                seconds_or_none(r.retired_s, r.retired_tried, cfg.cap_s).c_str(),
                seconds_or_none(r.silent_s, r.silent_tried, cfg.cap_s).c_str(), idle.c_str(),
                rate(r.idle_etcd).c_str(), fmt::format("{}/{}", rate(r.peak_client), rate(r.peak_etcd)).c_str(),
                r.etcd_cpu_pct ? fmt::format("{:.0f} %", *r.etcd_cpu_pct).c_str() : "-");
    if (!r.phases.empty()) std::printf("        keys: %s\n", r.phases.c_str());
    if (!r.note.empty()) std::printf("        note: %s\n", r.note.c_str());
    std::fflush(stdout);
    results.push_back(r);
  }

  if (!cfg.out.empty()) {
    std::ofstream out(cfg.out);
    out << fmt::format(
        "{{\"benchmark\":\"rendezvous_scale\",\"label\":{},\"cpus\":{},\"heartbeat_interval_ms\":{},"
        "\"heartbeat_timeout_ms\":{},\"poll_ms\":{},\"cap_s\":{},\"idle_s\":{},\"max_processes\":{},\"results\":[",
        json_text(cfg.label), std::thread::hardware_concurrency(), cfg.hb_interval_ms, cfg.hb_timeout_ms, cfg.poll_ms, cfg.cap_s,
        cfg.idle_s, cfg.max_processes);
    for (std::size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      out << fmt::format(
          "{}{{\"n\":{},\"processes\":{},\"max_per_process\":{},\"hosts\":{},\"relays\":{},\"elastic_run_per_host\":{},\"failed\":{},\"formed\":{},\"first_round_s\":{},\"first_partial_s\":{},"
          "\"retired_reround_s\":{},\"silent_reround_s\":{},\"retired_noticed_s\":{},\"silent_noticed_s\":{},"
          "\"idle_requests_per_s_client\":{},"
          "\"idle_requests_per_s_etcd\":{},\"peak_requests_per_s_client\":{},\"peak_requests_per_s_etcd\":{},"
          "\"etcd_cpu_idle_pct\":{},\"phases\":{},\"note\":{}}}",
          i == 0 ? "" : ",", r.n, r.processes, r.max_per_process, r.hosts, r.relays, r.launchers, r.failed, r.formed, json_number(r.first_round_s), json_number(r.first_partial_s),
          json_number(r.retired_s), json_number(r.silent_s), json_number(r.retired_noticed_s),
          json_number(r.silent_noticed_s), json_number(r.idle_client), json_number(r.idle_etcd),
          json_number(r.peak_client), json_number(r.peak_etcd), json_number(r.etcd_cpu_pct), json_text(r.phases), json_text(r.note));
    }
    out << "]}\n";
    if (!out) {
      std::fprintf(stderr, "rendezvous_scale: could not write %s\n", cfg.out.c_str());
      return 1;
    }
  }
  if (interrupted) return 130;
  // As a test (--require-idle-per-participant): every size formed and re-formed after both
  // deaths, and its idle load stayed below the bound: a per-rank poll would be far above it.
  int failures = 0;
  for (const auto& r : results) {
    const bool ok = r.first_round_s && r.retired_s && r.silent_s && r.idle_client && *r.idle_client / r.n <= cfg.require_idle;
    if (cfg.require_idle > 0 && !ok) {
      ++failures;
      std::printf("FAILED at N=%d: first round %s, retired re-round %s, silent re-round %s, idle %s requests/s per "
                  "participant (at most %.2f wanted)%s%s\n",
                  r.n, seconds_or_none(r.first_round_s, true, cfg.cap_s).c_str(),
                  seconds_or_none(r.retired_s, r.retired_tried, cfg.cap_s).c_str(),
                  seconds_or_none(r.silent_s, r.silent_tried, cfg.cap_s).c_str(),
                  r.idle_client ? fmt::format("{:.2f}", *r.idle_client / r.n).c_str() : "-", cfg.require_idle,
                  r.note.empty() ? "" : "; ", r.note.c_str());
    }
  }
  return failures == 0 ? 0 : 1;
}
