// libFuzzer target: the rendezvous records other participants write into the store (round
// outcomes, join records). A damaged record may only throw elastic::error(corrupt).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include <elastic/rendezvous/rendezvous.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace d = elastic::rendezvous::detail;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  // "<id>\n<value>": the participant id of a join key, then the record.
  const auto nl = text.find('\n');
  const std::string_view id = nl == std::string_view::npos ? std::string_view() : text.substr(0, nl);
  const std::string_view value = nl == std::string_view::npos ? text : text.substr(nl + 1);
  try {
    const auto out = d::parse_outcome("run/round/1/outcome", std::string(text), "run");
    for (const auto& m : out.members)
      if (!d::valid_participant(m.id) || !d::valid_incarnation(m.incarnation)) std::abort();
  } catch (const elastic::error& e) {
    if (e.code() != elastic::errc::corrupt) std::abort();
  }
  try {
    const auto j = d::parse_join("run/round/2/join/x", id, value, "run");
    if (j.prev_round < 0) std::abort();
  } catch (const elastic::error& e) {
    if (e.code() != elastic::errc::corrupt) std::abort();
  }
  return 0;
}
