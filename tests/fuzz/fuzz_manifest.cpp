// libFuzzer target: checkpoint manifests and step directory names, read from disks that may
// hold anything. Damage may only throw elastic::error (code corrupt or version_mismatch).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <elastic/checkpoint/format.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace format = elastic::checkpoint::format;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto m = format::decode_rank(text, "rank manifest");
    for (const auto& e : m.entries) {
      if (e.offset > m.data_bytes || e.bytes > m.data_bytes - e.offset) std::abort();  // accepted out of bounds
    }
  } catch (const elastic::error& e) {
    if (e.code() != elastic::errc::corrupt && e.code() != elastic::errc::version_mismatch) std::abort();
  }
  try {
    (void)format::decode_step(text, "step manifest");
  } catch (const elastic::error& e) {
    if (e.code() != elastic::errc::corrupt && e.code() != elastic::errc::version_mismatch) std::abort();
  }
  for (const bool pending : {false, true}) {
    if (const auto step = format::parse_step_dir(text, pending)) {
      const std::string name = pending ? format::pending_dir_name(*step) : format::step_dir_name(*step);
      if (name != text) std::abort();  // a name that does not read back
    }
  }
  return 0;
}
