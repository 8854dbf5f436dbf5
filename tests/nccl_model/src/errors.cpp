#include "errors.hpp"

#include <unistd.h>

#include "settings.hpp"

namespace nccl_model {

error_text& process_last_error() {
  static auto* e = new error_text();  // never destroyed: model threads may record errors at exit
  return *e;
}

void warn(const std::string& text) {
  process_last_error().set(text);
  if (settings::get().debug) {
    const std::string line = "nccl-model " + std::to_string(::getpid()) + " NCCL WARN " + text + "\n";
    (void)!::write(STDERR_FILENO, line.data(), line.size());
  }
}

}  // namespace nccl_model
