// What the benchmark programs share: robust statistics, wall-clock spans and the scratch
// directory a benchmark writes its files under (given by --dir=PATH, else $TMPDIR or /tmp).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

namespace elastic::bench {

using clock_type = std::chrono::steady_clock;

/// Seconds from `t0` to now.
inline double since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

/// The median (the mean of the middle two for an even count); 0 for no samples.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 != 0 ? v[m] : (v[m - 1] + v[m]) / 2;
}

/// Pre-faulted memory of `bytes` filled with a pattern (no lazy zero pages in a measurement).
inline std::unique_ptr<std::byte[]> filled(std::size_t bytes) {
  auto p = std::make_unique_for_overwrite<std::byte[]>(bytes);
  std::memset(p.get(), 0x5a, bytes);
  return p;
}

/// Seconds from a snapshot of `step` (taken and fenced: its stall is not counted) until it is
/// durable, with `c` a checkpointer.
template <class Checkpointer>
double persist_seconds(Checkpointer& c, std::uint64_t step) {
  c.snapshot(step);
  c.before_update();
  const auto t0 = clock_type::now();
  c.wait_durable();
  return since(t0);
}

/// Pairs of timings, ours and a reference's, taken one right after the other with the order
/// alternating from pair to pair: a shared disk or server drifts by several times within
/// seconds, and whichever ran second would otherwise always meet the other's aftermath.
struct paired_runs {
  std::vector<double> ours, ref, ratio;  // seconds; ratio = ref / ours
  bool ours_first = true;

  /// Runs both (each returns its seconds) and returns ours.
  template <class Ours, class Ref>
  double run(Ours&& o, Ref&& r) {
    double a, b;
    if (ours_first) {
      a = o();
      b = r();
    } else {
      b = r();
      a = o();
    }
    ours_first = !ours_first;
    ours.push_back(a);
    ref.push_back(b);
    ratio.push_back(b / a);
    return a;
  }
};

/// A directory of this process's own under --dir=PATH (taken out of argv, so that Google
/// Benchmark does not see it) or $TMPDIR or /tmp; removed with everything in it on destruction.
class scratch_dir {
 public:
  scratch_dir(int& argc, char** argv, const std::string& name) {
    const char* tmp = std::getenv("TMPDIR");
    std::filesystem::path root = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
    for (int i = 1; i < argc; ++i) {
      if (std::strncmp(argv[i], "--dir=", 6) != 0) continue;
      root = argv[i] + 6;
      for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
      --argc;
      --i;
    }
    path_ = root / (name + "-" + std::to_string(::getpid()));
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;

  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

  /// An empty directory `name` inside it (emptied if it exists).
  [[nodiscard]] std::filesystem::path fresh(const std::string& name) const {
    const auto d = path_ / name;
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace elastic::bench
