// Runs a program with ptrace(2) refused, as a container's seccomp profile may refuse it:
//
//   no_ptrace PROGRAM [ARGS...]
//
// Installs a seccomp filter that makes every ptrace call fail with EPERM (the kernel's own
// refusal, not a stand-in), then execs PROGRAM. tests/test_stack_dump.cpp runs the standalone
// elastic-watchdog under it: a watchdog that may not trace must still kill, and say why it has
// no stacks.
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: no_ptrace PROGRAM [ARGS...]\n");
    return 2;
  }
  sock_filter code[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_ptrace, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof code / sizeof code[0]), code};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
    std::perror("no_ptrace: cannot install the seccomp filter");
    return 126;
  }
  ::execv(argv[1], argv + 1);
  std::perror("no_ptrace: exec");
  return 127;
}
