// Signals by name, for both tools' command lines (elastic-run --preempt-signal, elastic-watchdog
// --signal) and for their messages: one table, one parser, one way of writing a signal's name.
// A signal is written "USR1", "SIGUSR1" or "usr1", "RTMIN+N", or as its number; numbers between
// 31 and SIGRTMIN are glibc's own and are no signal here.
#pragma once

#include <signal.h>

#include <charconv>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace elastic::tools {

/// Signal names without "SIG". SIGPOLL is SIGIO's other name: read, never written.
inline constexpr std::pair<std::string_view, int> signal_names[] = {
    {"HUP", SIGHUP},       {"INT", SIGINT},     {"QUIT", SIGQUIT},   {"ILL", SIGILL},   {"TRAP", SIGTRAP},
    {"ABRT", SIGABRT},     {"BUS", SIGBUS},     {"FPE", SIGFPE},     {"KILL", SIGKILL}, {"USR1", SIGUSR1},
    {"SEGV", SIGSEGV},     {"USR2", SIGUSR2},   {"PIPE", SIGPIPE},   {"ALRM", SIGALRM}, {"TERM", SIGTERM},
    {"STKFLT", SIGSTKFLT}, {"CHLD", SIGCHLD},   {"CONT", SIGCONT},   {"STOP", SIGSTOP}, {"TSTP", SIGTSTP},
    {"TTIN", SIGTTIN},     {"TTOU", SIGTTOU},   {"URG", SIGURG},     {"XCPU", SIGXCPU}, {"XFSZ", SIGXFSZ},
    {"VTALRM", SIGVTALRM}, {"PROF", SIGPROF},   {"WINCH", SIGWINCH}, {"IO", SIGIO},     {"POLL", SIGPOLL},
    {"PWR", SIGPWR},       {"SYS", SIGSYS}};

/// "SIGUSR1", "SIGRTMIN+2", or "signal 99".
inline std::string signal_display_name(int sig) {
  for (const auto& [n, s] : signal_names)
    if (s == sig && n != "POLL") return "SIG" + std::string(n);
  if (sig >= SIGRTMIN && sig <= SIGRTMAX) return fmt::format("SIGRTMIN+{}", sig - SIGRTMIN);
  return fmt::format("signal {}", sig);
}

/// The signal `v` names ("USR1", "SIGUSR1", "usr1", "RTMIN+2", "10"), or 0 when it names none.
inline int to_signal(std::string_view v) {
  std::string upper;
  for (char c : v) upper += (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : c;
  std::string_view name = upper;
  if (name.rfind("SIG", 0) == 0) name.remove_prefix(3);
  int sig = 0;
  if (name.rfind("RTMIN+", 0) == 0 && name.size() > 6) {
    int n = -1;
    const auto [p, ec] = std::from_chars(name.data() + 6, name.data() + name.size(), n);
    sig = ec == std::errc() && p == name.data() + name.size() && n >= 0 && SIGRTMIN + n <= SIGRTMAX ? SIGRTMIN + n : 0;
  } else if (!name.empty() && name.front() >= '0' && name.front() <= '9') {
    const auto [p, ec] = std::from_chars(name.data(), name.data() + name.size(), sig);
    if (ec != std::errc() || p != name.data() + name.size()) sig = 0;
  } else {
    for (const auto& [n, s] : signal_names)
      if (n == name) sig = s;
  }
  return sig <= 0 || sig >= NSIG || (sig > 31 && sig < SIGRTMIN) ? 0 : sig;
}

}  // namespace elastic::tools
