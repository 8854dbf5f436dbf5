// libFuzzer target: the JSON reader (checkpoint manifests, events, etcd replies all go through
// it). Malformed input may only throw elastic::error; what parses must print and read back the
// same.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <elastic/internal/json.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using elastic::internal::json;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const json doc = json::parse(text);
    const std::string once = doc.dump();
    if (json::parse(once).dump() != once) std::abort();  // printing is not stable
    (void)doc.dump(2);
  } catch (const elastic::error&) {
  }
  return 0;
}
