// A real S3 server for tests: Debian's Ceph as a one-node cluster (a monitor, one in-memory OSD,
// radosgw) on 127.0.0.1 with free ports, made by tests/support/radosgw_up.sh in a directory of
// its own, with one user. The destructor SIGKILLs its daemons (they daemonize: their pids are in
// DIR/run) and removes the directory. available() is false, with why(), where Ceph is not
// installed: the tests that need it are skipped then, and said so.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "etcd_server.hpp"  // free_port()
#include "process.hpp"

#ifndef ELASTIC_RADOSGW_UP
#define ELASTIC_RADOSGW_UP "tests/support/radosgw_up.sh"
#endif

namespace elastic::test {

class radosgw_server {
 public:
  static constexpr const char* access_key = "ELASTICTESTKEY";
  static constexpr const char* secret_key = "elastic-test-secret";

  radosgw_server() {
    for (int attempt = 0; attempt < 3; ++attempt) {
      mon_port_ = free_port();
      port_ = free_port();
      auto up = child_process::spawn({"/bin/bash", ELASTIC_RADOSGW_UP, dir_.file("ceph"), std::to_string(mon_port_),
                                      std::to_string(port_), access_key, secret_key, std::to_string(::getpid())});
      std::string said;
      while (auto line = up.read_line(std::chrono::seconds(90))) said += *line + "\n";
      const auto code = up.exit_code(std::chrono::seconds(90));
      if (code == 0) {
        available_ = true;
        return;
      }
      kill_daemons();
      if (code == 77) {
        why_ = said;
        return;
      }
      why_ = "the Ceph cluster did not come up (exit " + (code ? std::to_string(*code) : std::string("none")) + "): " + said;
      std::error_code ec;
      std::filesystem::remove_all(dir_.file("ceph"), ec);
    }
    throw std::runtime_error(why_);
  }
  radosgw_server(const radosgw_server&) = delete;
  radosgw_server& operator=(const radosgw_server&) = delete;
  ~radosgw_server() { kill_daemons(); }

  [[nodiscard]] bool available() const noexcept { return available_; }
  [[nodiscard]] const std::string& why() const noexcept { return why_; }
  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }
  [[nodiscard]] std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  [[nodiscard]] std::string host() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  /// SIGKILLs every daemon whose pid file is in DIR/run, and waits (at most 5 s) until each is gone.
  void kill_daemons() noexcept {
    std::error_code ec;
    const auto run = std::filesystem::path(dir_.file("ceph")) / "run";
    std::vector<pid_t> pids;
    for (const auto& e : std::filesystem::directory_iterator(run, ec)) {
      if (e.path().extension() != ".pid") continue;
      std::ifstream f(e.path());
      pid_t pid = 0;
      if (f >> pid && pid > 1) {
        ::kill(pid, SIGKILL);
        pids.push_back(pid);
      }
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    for (const pid_t pid : pids) {
      while (::kill(pid, 0) == 0 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }

  temp_dir dir_;
  std::uint16_t mon_port_ = 0;
  std::uint16_t port_ = 0;
  bool available_ = false;
  std::string why_;
};

}  // namespace elastic::test
