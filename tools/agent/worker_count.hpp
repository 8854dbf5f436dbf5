// How many workers "gpu", "cpu" and "auto" mean for --nproc-per-node on this host: the GPUs this
// process may use, as torchrun counts them, and the CPU cores it may run on.
#pragma once

#include <sched.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

namespace elastic::agent::detail {

/// CUDA devices this process may use, as torchrun's `--nproc-per-node gpu` counts them: the
/// entries of CUDA_VISIBLE_DEVICES when it is set (up to the first that cannot be a device, as
/// CUDA reads it: "" or "-1" hides them all), at most the GPUs the driver lists in
/// /proc/driver/nvidia/gpus (else the /dev/nvidiaN nodes).
inline std::size_t visible_gpu_count() {
  std::size_t installed = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++installed;
  }
  if (installed == 0) {
    for (auto it = std::filesystem::directory_iterator("/dev", ec); !ec && it != std::filesystem::directory_iterator();
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.size() > 6 && name.rfind("nvidia", 0) == 0 &&
          std::all_of(name.begin() + 6, name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        ++installed;
      }
    }
  }
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible == nullptr || installed == 0) return installed;
  std::size_t listed = 0;
  for (std::string_view rest = visible; !rest.empty();) {
    const auto comma = std::min(rest.find(','), rest.size());
    const std::string_view entry = rest.substr(0, comma);
    if (entry.empty() || entry.front() == '-') break;
    ++listed;
    rest.remove_prefix(std::min(comma + 1, rest.size()));
  }
  return std::min(listed, installed);
}

/// The CPU cores this process may run on (its affinity mask), at least 1.
inline std::size_t cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max<std::size_t>(1, std::thread::hardware_concurrency());
}

}  // namespace elastic::agent::detail
