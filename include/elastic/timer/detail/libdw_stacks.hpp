// Unwinding and symbolizing the threads of a process that the caller has stopped with ptrace, with
// elfutils' libdw (Debian: libdw-dev). Compiled only where the build has elastic::libdw, which
// defines ELASTIC_WITH_LIBDW=1 and links libdw; elsewhere this header declares nothing and the
// stack dumps say they have no symbols (ptrace_stacks.hpp).
//
// libdw is told that the threads are already stopped (dwfl_linux_proc_attach with
// assume_ptrace_stopped), so it neither attaches nor detaches: the caller's tracer thread owns
// every ptrace stop. Debug information is looked up on this machine only: in the module itself,
// else by build id under /usr/lib/debug (dwfl_build_id_find_debuginfo). The standard lookup
// would ask a debuginfod server when DEBUGINFOD_URLS is set: a network call has no place in a
// capture that must end within its bound.
//
// Each module's file is opened as the process sees it (mapped_files.hpp: map_files, else its
// root), never by its path here, and its build id is checked against the process's memory: a
// file that is another build is not used; one that cannot be checked is used and its frames are
// marked unverified (the dump then says it is not complete).
#pragma once

#include <elastic/config.hpp>

#if ELASTIC_WITH_LIBDW

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwelf.h>
#include <elfutils/libdwfl.h>
#include <libelf.h>
#include <sys/types.h>

#include <cxxabi.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include <elastic/internal/clock.hpp>
#include <elastic/timer/detail/mapped_files.hpp>
#include <elastic/timer/stack_dump.hpp>

namespace elastic::inline v1::timer::detail {

/// libdw's view of one stopped process: its modules, and a way to walk its threads' stacks.
class libdw_process {
 public:
  /// Reports the modules `pid` maps and attaches libdw to it; its threads must already be in a
  /// ptrace stop of the calling thread. ok() says whether it worked, error() why not.
  explicit libdw_process(pid_t pid) : pid_(pid), files_(mapped_files(pid)) {
    callbacks_.find_elf = &libdw_process::find_elf;
    callbacks_.find_debuginfo = dwfl_build_id_find_debuginfo;
    callbacks_.section_address = nullptr;
    callbacks_.debuginfo_path = &debuginfo_path_;
    dwfl_.reset(dwfl_begin(&callbacks_));
    if (!dwfl_) {
      error_ = libdw_error("dwfl_begin");
      return;
    }
    dwfl_report_begin(dwfl_.get());
    const int reported = dwfl_linux_proc_report(dwfl_.get(), pid);
    dwfl_report_end(dwfl_.get(), nullptr, nullptr);
    if (reported != 0) {
      error_ = "libdw cannot read the modules of pid " + std::to_string(pid) + ": " + error_text(reported);
      return;
    }
    // find_elf() finds this object through each module's user data.
    dwfl_getmodules(
        dwfl_.get(),
        [](Dwfl_Module*, void** userdata, const char*, Dwarf_Addr, void* self) -> int {
          *userdata = self;
          return DWARF_CB_OK;
        },
        this, 0);
    if (const int attached = dwfl_linux_proc_attach(dwfl_.get(), pid, /*assume_ptrace_stopped=*/true); attached != 0) {
      error_ = "libdw cannot attach to pid " + std::to_string(pid) + ": " + error_text(attached);
      return;
    }
    ok_ = true;
  }

  // libdw keeps a pointer to callbacks_: the object stays where it was made.
  libdw_process(const libdw_process&) = delete;
  libdw_process& operator=(const libdw_process&) = delete;

  [[nodiscard]] bool ok() const noexcept { return ok_; }
  [[nodiscard]] const std::string& error() const noexcept { return error_; }
  /// The modules (by the process's path) whose file could not be verified, each with why.
  [[nodiscard]] const std::map<std::string, std::string>& unverified() const noexcept { return unverified_; }

  /// Walks the stack of stopped thread `tid` into `frames` (addresses only, at most `max`),
  /// stopping at `deadline_ns`. `lookups` gets, per frame, the address to symbolize: a return
  /// address minus one, so that a call's own line is found, not the next one. Returns "" when
  /// the walk reached the outermost frame, else why it stopped.
  std::string unwind(pid_t tid, std::vector<stack_frame>& frames, std::vector<std::uint64_t>& lookups,
                     std::size_t max, std::int64_t deadline_ns) {
    walk w{frames, lookups, max, deadline_ns, {}};
    const int rc = dwfl_getthread_frames(dwfl_.get(), tid, &walk::on_frame, &w);
    if (!w.stopped_because.empty()) return w.stopped_because;
    if (rc != 0 && frames.empty()) return "libdw cannot unwind it: " + libdw_error("dwfl_getthread_frames");
    // An error after some frames is how most stacks end (no caller of _start, a frame without
    // unwind information): what was found stands.
    return {};
  }

  /// Appends to `out` the frames that `f` stands for, named: `f` itself (function, file, line,
  /// module, offset, looked up at `lookup`) and, where functions were inlined at that address,
  /// one frame more for each (as gdb shows them: same address, innermost first), each with the
  /// line it was called from. Without them the line of a frame would be one in the inlined code.
  void symbolize(const stack_frame& f, std::uint64_t lookup, std::vector<stack_frame>& out) {
    out.push_back(f);
    Dwfl_Module* m = dwfl_addrmodule(dwfl_.get(), lookup);
    if (m == nullptr) return;
    stack_frame& named = out.back();
    Dwarf_Addr start = 0;
    if (const char* name = dwfl_module_info(m, nullptr, &start, nullptr, nullptr, nullptr, nullptr, nullptr)) {
      named.module = name;
      named.offset = f.pc - start;
    }
    if (const char* symbol = dwfl_module_addrname(m, lookup)) named.function = demangled(symbol);
    // Only a line of a compile unit that holds the address: for code without debug info (crt1's
    // _start) libdw would hand back the nearest line of some other unit.
    Dwarf_Addr bias = 0;
    Dwarf_Die* unit = unit_at(m, lookup, bias);
    if (unit == nullptr) return;
    // From the unit in hand (dwfl_module_getsrc would look it up again, and not find Clang's).
    if (Dwarf_Line* line = dwarf_getsrc_die(unit, lookup - bias)) {
      int lineno = 0;
      if (const char* file = dwarf_linesrc(line, nullptr, nullptr); file != nullptr && dwarf_lineno(line, &lineno) == 0) {
        named.file = file;
        named.line = lineno;
      }
    }
    add_inlined(*unit, lookup - bias, out);
  }

 private:
  /// The compile unit of `m` that holds `address` (and the module's bias), or nothing for code
  /// without debug information (libdw's lookup may hand back a unit nearby: each is checked).
  /// libdw's lookup goes by .debug_aranges; for a program compiled by Clang 14 (DWARF 5, or no
  /// .debug_aranges) elfutils 0.188 finds no unit, and the units are walked instead: a dump is
  /// taken once per hang, and a module holds at most some thousands of them.
  static Dwarf_Die* unit_at(Dwfl_Module* m, Dwarf_Addr address, Dwarf_Addr& bias) {
    if (Dwarf_Die* unit = dwfl_module_addrdie(m, address, &bias); unit != nullptr && dwarf_haspc(unit, address - bias) == 1) {
      return unit;
    }
    for (Dwarf_Die* unit = dwfl_module_nextcu(m, nullptr, &bias); unit != nullptr;
         unit = dwfl_module_nextcu(m, unit, &bias)) {
      if (dwarf_haspc(unit, address - bias) == 1) return unit;
    }
    return nullptr;
  }

  /// The scopes (innermost first) at `address` of `unit`: for each function inlined there, the
  /// frame at out.back() is inside it and gets its name, and its caller follows, at the call's
  /// line; the last caller keeps the symbol of the function all of them were inlined into.
  static void add_inlined(Dwarf_Die& unit, Dwarf_Addr address, std::vector<stack_frame>& out) {
    // dwarf_getscopes() finds the innermost scope but then climbs its abstract origin's scopes;
    // the chain of callers is that scope's own parents (dwarf_getscopes_die), as eu-addr2line -i
    // walks it.
    Dwarf_Die* raw = nullptr;
    if (dwarf_getscopes(&unit, address, &raw) <= 0) {
      std::free(raw);
      return;
    }
    Dwarf_Die innermost = raw[0];
    std::free(raw);
    raw = nullptr;
    const int count = dwarf_getscopes_die(&innermost, &raw);
    const std::unique_ptr<Dwarf_Die, decltype(&std::free)> scopes(raw, &std::free);
    Dwarf_Files* files = nullptr;
    if (count <= 0 || dwarf_getsrcfiles(&unit, &files, nullptr) != 0) return;
    const std::string outer = out.back().function;
    for (int i = 0; i < count; ++i) {
      Dwarf_Die* scope = &raw[i];
      const int tag = dwarf_tag(scope);
      if (tag == DW_TAG_subprogram) break;
      if (tag != DW_TAG_inlined_subroutine) continue;
      out.back().function = function_name(scope);
      stack_frame caller = out.back();
      caller.function = outer;
      caller.inlined = false;
      caller.file.clear();
      caller.line = 0;
      Dwarf_Attribute attr;
      Dwarf_Word index = 0, line = 0;
      if (dwarf_formudata(dwarf_attr(scope, DW_AT_call_file, &attr), &index) == 0) {
        if (const char* file = dwarf_filesrc(files, index, nullptr, nullptr)) caller.file = file;
      }
      if (dwarf_formudata(dwarf_attr(scope, DW_AT_call_line, &attr), &line) == 0) caller.line = static_cast<int>(line);
      out.back().inlined = true;
      out.push_back(std::move(caller));
    }
  }

  /// An inlined function's name: its linkage name demangled (with its class and parameters),
  /// else its plain name.
  static std::string function_name(Dwarf_Die* die) {
    Dwarf_Attribute attr;
    const char* name = nullptr;
    if (dwarf_attr_integrate(die, DW_AT_linkage_name, &attr) != nullptr) name = dwarf_formstring(&attr);
    if (name == nullptr && dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &attr) != nullptr) name = dwarf_formstring(&attr);
    if (name != nullptr) return demangled(name);
    const char* plain = dwarf_diename(die);
    return plain != nullptr ? plain : "??";
  }

  /// libdw's find_elf: the module's file as the process maps it (see the top of this file).
  /// Returns its descriptor, or -1 when there is none to trust.
  static int find_elf(Dwfl_Module* mod, void** userdata, const char* name, Dwarf_Addr base, char** file_name, Elf** elfp) {
    auto* self = static_cast<libdw_process*>(*userdata);
    if (self == nullptr || name == nullptr || name[0] != '/') {
      return dwfl_linux_proc_find_elf(mod, userdata, name, base, file_name, elfp);  // [vdso]: from memory
    }
    try {
      return self->open_module(name, file_name);
    } catch (...) {  // out of memory: the module stays unnamed
      return -1;
    }
  }

  int open_module(const std::string& name, char** file_name) {
    const auto m = std::find_if(files_.begin(), files_.end(), [&](const mapped_file& f) { return f.path == name; });
    if (m == files_.end()) {
      unverified_[name] = "not in /proc/" + std::to_string(pid_) + "/maps";
      return -1;
    }
    opened_module o = open_in_process(pid_, *m);
    if (o.fd < 0) {
      unverified_[name] = "cannot open it as the process sees it (" + o.via + ": " + std::strerror(errno) + ")";
      return -1;
    }
    const std::string in_memory = build_id_in_memory(pid_, *m);
    const std::string in_file = file_build_id(o.fd);
    if (!in_memory.empty() && !in_file.empty() && in_memory != in_file) {
      unverified_[name] = o.via + " is another build (build id " + in_file + ", mapped " + in_memory + "): not used";
      ::close(o.fd);
      return -1;
    }
    if (!o.exact && (in_memory.empty() || in_file.empty()) && !same_file(o.fd, *m)) {
      unverified_[name] = "no build id to check " + o.via + " against what is mapped";
    }
    *file_name = ::strdup(o.via.c_str());
    return o.fd;
  }

  /// The build id of the ELF file open on `fd`, as lowercase hex; "" when it has none.
  static std::string file_build_id(int fd) {
    ::elf_version(EV_CURRENT);
    Elf* elf = ::elf_begin(fd, ELF_C_READ_MMAP, nullptr);
    if (elf == nullptr) return {};
    const void* bits = nullptr;
    const ssize_t n = ::dwelf_elf_gnu_build_id(elf, &bits);
    std::string hex = n > 0 ? hex_bytes(static_cast<const unsigned char*>(bits), static_cast<std::size_t>(n)) : std::string();
    ::elf_end(elf);
    return hex;
  }

  struct dwfl_deleter {
    void operator()(Dwfl* d) const noexcept { dwfl_end(d); }
  };

  struct walk {
    std::vector<stack_frame>& frames;
    std::vector<std::uint64_t>& lookups;
    std::size_t max;
    std::int64_t deadline_ns;
    std::string stopped_because;

    static int on_frame(Dwfl_Frame* state, void* arg) {
      auto& w = *static_cast<walk*>(arg);
      Dwarf_Addr pc = 0;
      bool activation = false;
      if (!dwfl_frame_pc(state, &pc, &activation)) return DWARF_CB_ABORT;  // the end, as rc != 0 after frames
      stack_frame f;
      f.pc = pc;
      w.frames.push_back(std::move(f));
      w.lookups.push_back(activation || pc == 0 ? pc : pc - 1);
      if (w.frames.size() >= w.max) {
        w.stopped_because = "stack cut at " + std::to_string(w.max) + " frames";
        return DWARF_CB_ABORT;
      }
      if (internal::monotonic_ns() >= w.deadline_ns) {
        w.stopped_because = "stack cut: the capture's time was up";
        return DWARF_CB_ABORT;
      }
      return DWARF_CB_OK;
    }
  };

  static std::string demangled(const char* symbol) {
    int status = 0;
    std::unique_ptr<char, decltype(&std::free)> d(abi::__cxa_demangle(symbol, nullptr, nullptr, &status), &std::free);
    return status == 0 && d ? std::string(d.get()) : std::string(symbol);
  }

  /// libdw's error for a return code: an errno when positive, else libdw's own last error.
  static std::string error_text(int rc) {
    return rc > 0 ? std::generic_category().message(rc) : std::string(dwfl_errmsg(-1));
  }
  static std::string libdw_error(const char* call) { return std::string(call) + ": " + dwfl_errmsg(-1); }

  pid_t pid_;
  std::vector<mapped_file> files_;
  std::map<std::string, std::string> unverified_;
  char* debuginfo_path_ = nullptr;  // libdw's default: /usr/lib/debug
  Dwfl_Callbacks callbacks_{};
  std::unique_ptr<Dwfl, dwfl_deleter> dwfl_;
  bool ok_ = false;
  std::string error_;
};

}  // namespace elastic::inline v1::timer::detail

#endif  // ELASTIC_WITH_LIBDW
