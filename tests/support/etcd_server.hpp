// A real etcd for tests: one member on 127.0.0.1, free ports, its own data directory, started
// and stopped (or SIGKILLed and restarted on the same ports and data) at will. The destructor
// SIGTERMs it, SIGKILLs it if it lingers, and reaps it; if the test process itself dies, the
// kernel SIGKILLs etcd too (PR_SET_PDEATHSIG), so no etcd outlives its test.
#pragma once

#include <arpa/inet.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/process.hpp"

#ifndef ELASTIC_ETCD_SERVER
#define ELASTIC_ETCD_SERVER "/usr/bin/etcd"
#endif

namespace elastic::test {

/// A TCP port on 127.0.0.1 that was free a moment ago (etcd cannot bind port 0 and say which
/// port it got, so we ask the kernel for one, close it and hand it to etcd).
inline std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("cannot bind a free port");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

/// One etcd member serving on 127.0.0.1.
class etcd_server {
 public:
  struct options {
    /// Serve https with this certificate and key (PEM); empty: plain http.
    std::string cert_file;
    std::string key_file;
    /// With TLS: require client certificates signed by this CA (the health check presents
    /// cert_file/key_file as its own).
    std::string trusted_ca_file;
    /// How long start() and restart() wait for /health to say true.
    std::chrono::milliseconds ready_timeout = std::chrono::seconds(20);
    /// Addresses of this host to serve clients on besides 127.0.0.1 (e.g. a bridge that network
    /// namespaces reach it through); each must be assigned already.
    std::vector<std::string> extra_client_hosts{};
  };

  etcd_server() : etcd_server(options{}) {}
  explicit etcd_server(options o) : options_(std::move(o)) {
    ::curl_global_init(CURL_GLOBAL_DEFAULT);
    // A port taken between free_port() and etcd's bind makes etcd exit: try other ports.
    for (int attempt = 0;; ++attempt) {
      client_port_ = free_port();
      peer_port_ = free_port();
      if (start(attempt < 2)) return;
    }
  }
  etcd_server(const etcd_server&) = delete;
  etcd_server& operator=(const etcd_server&) = delete;
  ~etcd_server() { stop(); }

  [[nodiscard]] std::uint16_t port() const noexcept { return client_port_; }
  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  [[nodiscard]] bool tls() const noexcept { return !options_.cert_file.empty(); }
  /// "127.0.0.1:PORT"
  [[nodiscard]] std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }
  /// "etcd://127.0.0.1:PORT" (etcds:// with TLS)
  [[nodiscard]] std::string url() const { return (tls() ? "etcds://" : "etcd://") + endpoint(); }
  [[nodiscard]] const std::string& data_dir() const noexcept { return data_; }

  /// SIGKILL, as a crash or a lost machine would; waits until it is gone.
  void kill() noexcept { end(SIGKILL, std::chrono::milliseconds(0)); }

  /// SIGTERM, then SIGKILL after 5 s; waits until it is gone.
  void stop() noexcept { end(SIGTERM, std::chrono::seconds(5)); }

  /// Starts it again on the same ports with the same data; returns once it serves.
  void restart() {
    if (pid_ > 0) throw std::runtime_error("etcd_server::restart while it runs");
    start(false);
  }

  /// POSTs `body` to the gateway path `path` (with `token` as Authorization when given) and
  /// returns the reply body: for setting etcd up (users, roles, auth) the way an admin would.
  std::string post(const std::string& path, const std::string& body, const std::string& token = "") const {
    long status = 0;
    return http(path, body, token, status);
  }

  /// The last `bytes` of etcd's log, for messages when it will not start.
  [[nodiscard]] std::string log_tail(std::size_t bytes = 2000) const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string s = ss.str();
    return s.size() > bytes ? s.substr(s.size() - bytes) : s;
  }

 private:
  /// Starts etcd and waits for it; false if it exited at once and `may_fail` (ports taken).
  bool start(bool may_fail) {
    const std::string scheme = tls() ? "https" : "http";
    std::string client = scheme + "://127.0.0.1:" + std::to_string(client_port_);
    for (const auto& h : options_.extra_client_hosts) client += "," + scheme + "://" + h + ":" + std::to_string(client_port_);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    std::vector<std::string> argv{ELASTIC_ETCD_SERVER, "--name", "default", "--data-dir", data_,
                                  "--listen-client-urls", client, "--advertise-client-urls", client,
                                  "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                  "--initial-cluster", "default=" + peer,
                                  // A 100 ms election timeout makes etcd's shortest lease 1 s
                                  // (1.5 election timeouts, rounded up to seconds), not 2 s.
                                  "--heartbeat-interval", "10", "--election-timeout", "100",
                                  "--logger", "zap", "--log-level", "warn"};
    if (tls()) {
      argv.insert(argv.end(), {"--cert-file", options_.cert_file, "--key-file", options_.key_file});
      if (!options_.trusted_ca_file.empty()) {
        argv.insert(argv.end(), {"--client-cert-auth", "--trusted-ca-file", options_.trusted_ca_file});
      }
    }
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      // Only async-signal-safe calls until exec: the parent may have threads.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(126);
      const int log = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
      if (log >= 0) {
        ::dup2(log, STDOUT_FILENO);
        ::dup2(log, STDERR_FILENO);
      }
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    pid_ = pid;
    const auto until = std::chrono::steady_clock::now() + options_.ready_timeout;
    for (;;) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        if (may_fail) return false;
        throw std::runtime_error("etcd exited while starting (status " + std::to_string(st) + "): " + log_tail());
      }
      long status = 0;
      try {
        if (http("/health", "", "", status).find("\"health\":\"true\"") != std::string::npos) return true;
      } catch (const std::exception&) {
        // not listening yet
      }
      if (std::chrono::steady_clock::now() >= until) {
        stop();
        throw std::runtime_error("etcd did not become healthy within " +
                                 std::to_string(options_.ready_timeout.count()) + " ms: " + log_tail());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  void end(int sig, std::chrono::milliseconds grace) noexcept {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    const auto until = std::chrono::steady_clock::now() + grace;
    int st = 0;
    while (::waitpid(pid_, &st, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() >= until) {
        ::kill(pid_, SIGKILL);
        while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
        }
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    pid_ = -1;
  }

  static std::size_t collect(char* data, std::size_t, std::size_t n, void* out) {
    static_cast<std::string*>(out)->append(data, n);
    return n;
  }

  /// GET (empty body) or POST on the client port; throws when nothing answers.
  std::string http(const std::string& path, const std::string& body, const std::string& token, long& status) const {
    std::unique_ptr<CURL, void (*)(CURL*)> h(::curl_easy_init(), ::curl_easy_cleanup);
    if (!h) throw std::runtime_error("curl_easy_init failed");
    const std::string url = (tls() ? "https://" : "http://") + endpoint() + path;
    std::string reply;
    curl_slist* headers = ::curl_slist_append(nullptr, "Content-Type: application/json");
    if (!token.empty()) headers = ::curl_slist_append(headers, ("Authorization: " + token).c_str());
    std::unique_ptr<curl_slist, void (*)(curl_slist*)> hold(headers, ::curl_slist_free_all);
    ::curl_easy_setopt(h.get(), CURLOPT_URL, url.c_str());
    ::curl_easy_setopt(h.get(), CURLOPT_NOSIGNAL, 1L);
    ::curl_easy_setopt(h.get(), CURLOPT_PROXY, "");
    ::curl_easy_setopt(h.get(), CURLOPT_TIMEOUT_MS, 2000L);
    ::curl_easy_setopt(h.get(), CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
    ::curl_easy_setopt(h.get(), CURLOPT_HTTPHEADER, headers);
    if (!body.empty()) ::curl_easy_setopt(h.get(), CURLOPT_POSTFIELDS, body.c_str());
    ::curl_easy_setopt(h.get(), CURLOPT_WRITEFUNCTION, &etcd_server::collect);
    ::curl_easy_setopt(h.get(), CURLOPT_WRITEDATA, &reply);
    if (tls()) {
      ::curl_easy_setopt(h.get(), CURLOPT_SSL_VERIFYPEER, 0L);  // the admin's side: checks are the store's
      ::curl_easy_setopt(h.get(), CURLOPT_SSL_VERIFYHOST, 0L);
      if (!options_.trusted_ca_file.empty()) {
        ::curl_easy_setopt(h.get(), CURLOPT_SSLCERT, options_.cert_file.c_str());
        ::curl_easy_setopt(h.get(), CURLOPT_SSLKEY, options_.key_file.c_str());
      }
    }
    const CURLcode rc = ::curl_easy_perform(h.get());
    if (rc != CURLE_OK) throw std::runtime_error(std::string("etcd ") + path + ": " + ::curl_easy_strerror(rc));
    ::curl_easy_getinfo(h.get(), CURLINFO_RESPONSE_CODE, &status);
    return reply;
  }

  options options_;
  temp_dir dir_;
  std::string data_ = dir_.file("data");
  std::string log_ = dir_.file("etcd.log");
  std::uint16_t client_port_ = 0;
  std::uint16_t peer_port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace elastic::test
