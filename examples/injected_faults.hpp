// Fault injection for the examples' demos, by worker slot (ELASTIC_LOCAL_RANK, else the first rank
// it got), each once per slot and checkpoint directory (a file beside it, CKPT.injected-*,
// remembers it across the slot's restarts), at the first step at or past S the slot runs:
//   --kill-rank R --kill-at S    worker R SIGKILLs itself in the middle of step S's allreduce
//   --kill-together R1,R2 --kill-together-at S
//                                workers R1 and R2 both do, in step S
//   --hang-rank R --hang-at S    worker R stops making progress in step S (the watchdog kills it)
// Not part of the library: a trainer of yours has no need of it.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>

namespace examples {

struct injected_faults {
  // Where the marks of faults suffered live: --fault-marks PATH, else beside the run's
  // checkpoint directory (a local path: with an s3:// directory the caller gives one).
  std::string marks;
  long kill_rank = -1, kill_at = -1, hang_rank = -1, hang_at = -1;
  long together[2] = {-1, -1}, together_at = -1;

  static constexpr const char* usage =
      "[--kill-rank R --kill-at S] [--kill-together R1,R2 --kill-together-at S] [--hang-rank R --hang-at S] "
      "[--fault-marks PATH]";

  /// Takes `flag value` when it is one of the above (false: not a fault flag). `number` parses
  /// the value or exits with a usage error.
  template <class Number>
  bool take(const std::string& flag, const std::string& value, Number number) {
    if (flag == "--kill-rank") kill_rank = number();
    else if (flag == "--kill-at") kill_at = number();
    else if (flag == "--hang-rank") hang_rank = number();
    else if (flag == "--hang-at") hang_at = number();
    else if (flag == "--kill-together-at") together_at = number();
    else if (flag == "--fault-marks") marks = value;
    else if (flag == "--kill-together") {
      if (std::sscanf(value.c_str(), "%ld,%ld", &together[0], &together[1]) != 2) {
        std::fprintf(stderr, "--kill-together takes R1,R2\n");
        std::exit(2);
      }
    } else {
      return false;
    }
    return true;
  }

  /// Whether worker `slot` has yet to suffer fault `tag` in this run; marks it suffered.
  [[nodiscard]] bool first_time(const char* tag, long slot) const {
    const std::string mark = marks + ".injected-" + tag + "-" + std::to_string(slot);
    const int fd = ::open(mark.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
    if (fd < 0) return false;
    ::close(fd);
    return true;
  }

  /// Called right before step `step`'s collective: hangs forever, or returns a thread that
  /// SIGKILLs this process 200 us later (inside the collective), or does nothing.
  [[nodiscard]] std::jthread before_collective(long slot, std::uint64_t step) const {
    using namespace std::chrono_literals;
    const auto s = static_cast<long>(step);
    // At the first step at or past S this slot runs, not only at S: a worker restarted after an
    // earlier fault may rejoin past S (its start is slow on a loaded machine) and must still
    // suffer its fault, once.
    auto due = [s](long at) { return at >= 0 && s >= at; };
    if (slot == hang_rank && due(hang_at) && first_time("hang", slot)) {
      std::printf("worker %ld hangs in step %ld (injected): the watchdog will kill it\n", slot, s);
      std::fflush(stdout);
      for (;;) std::this_thread::sleep_for(1s);
    }
    const bool both = (slot == together[0] || slot == together[1]) && due(together_at);
    if ((slot == kill_rank && due(kill_at) && first_time("kill", slot)) || (both && first_time("kill-together", slot))) {
      std::printf("worker %ld is SIGKILLed inside the allreduce of step %ld (injected)\n", slot, s);
      std::fflush(stdout);
      std::this_thread::sleep_for(20ms);  // the others are in the allreduce by now
      return std::jthread([] {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        ::kill(::getpid(), SIGKILL);
      });
    }
    return {};
  }
};

}  // namespace examples
