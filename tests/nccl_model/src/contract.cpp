#include "contract.hpp"

#include <unistd.h>

#include <array>
#include <cstdlib>
#include <string>

namespace nccl_model::contract {
namespace {

constexpr std::array<std::string_view, static_cast<int>(rule::count)> names = {
    "in-progress",       "one-thread-per-communicator", "abort-alone",    "shrink-with-outstanding-work",
    "finalize-after-revoke", "dead-handle",             "cuda-no-device", "cuda-in-host-function"};

struct switches {
  std::array<bool, static_cast<int>(rule::count)> on{};
  switches() {
    on.fill(true);
    const std::string v = env_text("ELASTIC_NCCL_MODEL_CONTRACT");
    if (v == "0") on.fill(false);
    if (v.empty() || v == "0" || v == "1") return;
    std::string_view rest(v);
    while (!rest.empty()) {
      const auto comma = rest.find(',');
      const std::string_view token = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
      bool known = false;
      for (std::size_t i = 0; i < names.size(); ++i) {
        if (token.size() == names[i].size() + 3 && token.substr(0, 3) == "no-" && token.substr(3) == names[i]) {
          on[i] = false;
          known = true;
        }
      }
      if (!known) {
        const std::string msg = "nccl-model: ELASTIC_NCCL_MODEL_CONTRACT: unknown entry '" + std::string(token) +
                                "' (use 0, 1 or no-RULE, RULE one of the names in tests/nccl_model/README.md)\n";
        (void)!::write(STDERR_FILENO, msg.data(), msg.size());
      }
    }
  }
};

const switches& current() {
  static const switches* s = new switches();  // never destroyed: threads may check during exit
  return *s;
}

}  // namespace

std::string_view name(rule r) noexcept { return names[static_cast<int>(r)]; }

bool enabled(rule r) noexcept { return current().on[static_cast<int>(r)]; }

void violation(rule r, std::string_view what, std::string_view who, std::string_view why) noexcept {
  std::string m = "nccl-model: contract violation: ";
  m.append(what).append(", ").append(who).append(", ").append(why);
  m.append(" [rule ").append(name(r)).append("; ELASTIC_NCCL_MODEL_CONTRACT=no-").append(name(r));
  m.append(" turns it off]\n");
  // write(2), not stdio: the process may be in any state, and this line must get out whole.
  (void)!::write(STDERR_FILENO, m.data(), m.size());
  std::abort();
}

}  // namespace nccl_model::contract
