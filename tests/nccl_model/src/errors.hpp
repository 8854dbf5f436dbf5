// NCCL's "last error": the text of the most recent WARN (src/debug.cc keeps one process-wide
// buffer, ncclLastError; ncclGetLastError ignores its argument). The model keeps that buffer and,
// in addition, one per communicator, so that ncclGetLastError(comm) names that communicator's
// failure even when another one failed later.
#pragma once

#include <atomic>
#include <cstdio>
#include <string>

namespace nccl_model {

/// A last-error text that readers may hold while writers move on: each write goes to the next of
/// a ring of buffers and is then published, so a pointer handed out stays intact for the next 15
/// writes (NCCL's single buffer is simply overwritten).
class error_text {
 public:
  void set(const std::string& text) noexcept {
    const unsigned next = (written_.fetch_add(1, std::memory_order_relaxed) + 1) % slots;  // writers never share
    std::snprintf(buffers_[next], sizeof buffers_[next], "%s", text.c_str());
    current_.store(next, std::memory_order_release);
  }
  [[nodiscard]] const char* get() const noexcept { return buffers_[current_.load(std::memory_order_acquire)]; }
  [[nodiscard]] bool empty() const noexcept { return get()[0] == '\0'; }

 private:
  static constexpr unsigned slots = 16;
  char buffers_[slots][1024] = {};
  std::atomic<unsigned> current_{0};
  std::atomic<unsigned> written_{0};
};

/// The process-wide last error (what ncclGetLastError(NULL) returns).
error_text& process_last_error();

/// Records `text` as the process-wide last error (and prints it when NCCL_DEBUG is set).
void warn(const std::string& text);

}  // namespace nccl_model
