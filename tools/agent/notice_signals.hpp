// Which signals the launcher takes as a preemption notice (read from its signalfd instead of
// dying of them), and how close together two signals are the same notice. The launcher blocks
// launcher_signals() in the thread that constructs it, before any thread starts, so that every
// thread inherits the mask.
#pragma once

#include <signal.h>

#include <chrono>
#include <vector>

namespace elastic::agent::detail {

/// Within this window after a notice, further signals are the same notice.
inline constexpr std::chrono::milliseconds same_notice_window{2000};

/// The signals the launcher reads from its signalfd instead of dying of them: SIGCHLD, every
/// signal whose default is to end the process (each is a preemption notice), and `extra`.
/// Left alone: SIGKILL and SIGSTOP (cannot be), SIGPIPE (ignored: a closed console), the job
/// control signals and SIGWINCH/SIGURG (they end nothing), and signals the launcher was started
/// ignoring (nohup, a background job of a script), unless named in `extra`. A real fault
/// (SIGSEGV in the launcher itself) is delivered by the kernel even while blocked.
inline sigset_t launcher_signals(const std::vector<int>& extra) {
  sigset_t s;
  sigfillset(&s);  // glibc leaves out the signals its threads use internally
  for (int sig : {SIGKILL, SIGSTOP, SIGPIPE, SIGCONT, SIGTSTP, SIGTTIN, SIGTTOU, SIGWINCH, SIGURG}) sigdelset(&s, sig);
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction now {};
    if (sig != SIGCHLD && sigismember(&s, sig) == 1 && ::sigaction(sig, nullptr, &now) == 0 && now.sa_handler == SIG_IGN) {
      sigdelset(&s, sig);
    }
  }
  for (int sig : extra) sigaddset(&s, sig);
  return s;
}

}  // namespace elastic::agent::detail
