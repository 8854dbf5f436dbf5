// The files another process maps, reached as that process sees them, and their ELF build ids as
// its memory holds them: what a stack dump names frames from (libdw_stacks.hpp).
//
// A path in /proc/PID/maps is a path in the process's own mount namespace. A worker in a
// container (Apptainer, enroot, any trainer command that makes a mount namespace) may run
// /opt/train under that name while the watchdog's /opt/train is another file or none: a dump
// named from the watchdog's file names the wrong functions. So a module's file is opened through
// the process: /proc/PID/map_files/START-END (the very file mapped; needs CAP_SYS_ADMIN), else
// /proc/PID/root/PATH (its namespace's file by that path, which may have been replaced since it
// was mapped), and its NT_GNU_BUILD_ID is checked against the one in the process's memory.
#pragma once

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

namespace elastic::inline v1::timer::detail {

/// One file a process maps: the first (lowest) of its mappings, by the process's own name.
struct mapped_file {
  std::string path;  ///< in the process's mount namespace
  std::uint64_t start = 0, end = 0, file_offset = 0;
  dev_t dev = 0;
  ino_t ino = 0;
};

/// One line of /proc/PID/maps that names a file.
struct mapping_line {
  std::uint64_t start = 0, end = 0, file_offset = 0;
  const char* perms = "";
  dev_t dev = 0;
  ino_t ino = 0;
  std::string path;  ///< in the process's mount namespace
};

/// Calls `f(const mapping_line&)` for each mapping of `pid` that has a file, in address order.
template <class F>
void for_each_mapping(pid_t pid, F&& f) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(("/proc/" + std::to_string(pid) + "/maps").c_str(), "re"),
                                                       &std::fclose);
  if (!file) return;
  char line[4096];
  while (std::fgets(line, sizeof line, file.get()) != nullptr) {
    unsigned long long start = 0, end = 0, offset = 0, inode = 0;
    unsigned dev_major = 0, dev_minor = 0;
    char perms[8] = {};
    int path_at = 0;
    if (std::sscanf(line, "%llx-%llx %7s %llx %x:%x %llu %n", &start, &end, perms, &offset, &dev_major, &dev_minor, &inode,
                    &path_at) < 7 ||
        path_at <= 0 || line[path_at] != '/') {
      continue;
    }
    mapping_line m{start, end, offset, perms, makedev(dev_major, dev_minor), static_cast<ino_t>(inode), line + path_at};
    while (!m.path.empty() && m.path.back() == '\n') m.path.pop_back();
    f(m);
  }
}

/// The files `pid` maps, each once, from /proc/PID/maps.
inline std::vector<mapped_file> mapped_files(pid_t pid) {
  std::vector<mapped_file> out;
  std::unordered_set<std::string> seen;
  for_each_mapping(pid, [&](const mapping_line& m) {
    if (seen.insert(m.path).second) out.push_back({m.path, m.start, m.end, m.file_offset, m.dev, m.ino});  // the first is the lowest
  });
  return out;
}

/// Reads `n` bytes at `address` of process `pid`; false when it cannot.
inline bool read_process_memory(pid_t pid, std::uint64_t address, void* into, std::size_t n) noexcept {
  iovec local{into, n};
  iovec remote{reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)), n};
  return ::process_vm_readv(pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(n);
}

/// `n` bytes as lowercase hex: how a build id is written.
inline std::string hex_bytes(const unsigned char* bytes, std::size_t n) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    hex += digits[bytes[i] >> 4];
    hex += digits[bytes[i] & 15];
  }
  return hex;
}

/// The NT_GNU_BUILD_ID note in `notes` (a PT_NOTE's bytes), as lowercase hex; "" when none.
inline std::string build_id_in_notes(const unsigned char* notes, std::size_t size) {
  std::size_t at = 0;
  auto align4 = [](std::size_t v) { return (v + 3) & ~std::size_t{3}; };
  while (at + sizeof(Elf64_Nhdr) <= size) {
    Elf64_Nhdr h;
    std::memcpy(&h, notes + at, sizeof h);
    const std::size_t name_at = at + sizeof h, desc_at = name_at + align4(h.n_namesz);
    if (desc_at + h.n_descsz > size) return {};
    if (h.n_type == NT_GNU_BUILD_ID && h.n_namesz == 4 && std::memcmp(notes + name_at, "GNU", 4) == 0) {
      return hex_bytes(notes + desc_at, h.n_descsz);
    }
    at = desc_at + align4(h.n_descsz);
  }
  return {};
}

/// The build id of the ELF object `m` in the memory of process `pid` (its headers mapped at the
/// mapping of file offset 0, its notes in a loaded PT_NOTE); "" when it cannot be read there.
inline std::string build_id_in_memory(pid_t pid, const mapped_file& m) {
  if (m.file_offset != 0) return {};
  Elf64_Ehdr eh{};
  if (!read_process_memory(pid, m.start, &eh, sizeof eh) || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
      eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum == 0 || eh.e_phnum > 256) {
    return {};
  }
  std::vector<Elf64_Phdr> ph(eh.e_phnum);
  if (!read_process_memory(pid, m.start + eh.e_phoff, ph.data(), ph.size() * sizeof(Elf64_Phdr))) return {};
  // Where the object was loaded: the load segment of file offset 0 is at m.start.
  std::uint64_t bias = 0;
  bool found = false;
  for (const auto& p : ph) {
    if (p.p_type == PT_LOAD && p.p_offset == 0) {
      bias = m.start - (p.p_vaddr & ~std::uint64_t{0xfff});
      found = true;
      break;
    }
  }
  if (!found) return {};
  for (const auto& p : ph) {
    if (p.p_type != PT_NOTE) continue;
    std::vector<unsigned char> notes(std::min<std::uint64_t>(p.p_memsz, 4096));
    if (!read_process_memory(pid, bias + p.p_vaddr, notes.data(), notes.size())) continue;
    if (std::string id = build_id_in_notes(notes.data(), notes.size()); !id.empty()) return id;
  }
  return {};
}

/// A file of another process, opened as that process sees it.
struct opened_module {
  int fd = -1;          ///< the caller owns it; -1 when nothing could be opened
  std::string via;      ///< the path it was opened by (/proc/PID/map_files/... or /proc/PID/root/...)
  bool exact = false;   ///< opened through map_files: the very file mapped
};

/// Opens file `m` of process `pid` through map_files, else through the process's root.
inline opened_module open_in_process(pid_t pid, const mapped_file& m) {
  opened_module out;
  char range[64];
  std::snprintf(range, sizeof range, "%llx-%llx", static_cast<unsigned long long>(m.start), static_cast<unsigned long long>(m.end));
  const std::string proc = "/proc/" + std::to_string(pid);
  out.via = proc + "/map_files/" + range;
  out.fd = ::open(out.via.c_str(), O_RDONLY | O_CLOEXEC);
  out.exact = out.fd >= 0;
  if (out.fd < 0) {
    out.via = proc + "/root" + m.path;
    out.fd = ::open(out.via.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat st {};
    if (out.fd >= 0 && (::fstat(out.fd, &st) != 0 || !S_ISREG(st.st_mode))) {  // never a FIFO or a device
      ::close(out.fd);
      out.fd = -1;
    }
  }
  return out;
}

/// Whether the file open on `fd` is the one the maps name (device and inode).
inline bool same_file(int fd, const mapped_file& m) noexcept {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && st.st_ino == m.ino && st.st_dev == m.dev;
}

}  // namespace elastic::inline v1::timer::detail
