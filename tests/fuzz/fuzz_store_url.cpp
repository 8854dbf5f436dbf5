// libFuzzer target: store URLs (--rdzv, ELASTIC_RDZV), typed by users. Bad input may only throw
// elastic::error with code invalid_argument or bad_name.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include <elastic/rendezvous/store_url.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto url = elastic::rendezvous::parse_store_url(text);
    if (url.scheme == elastic::rendezvous::store_url::kind::etcd) {
      if (url.endpoints.empty()) std::abort();
      for (const auto& e : url.endpoints)
        if (e.host.empty() || e.port == 0) std::abort();
    }
  } catch (const elastic::error& e) {
    if (e.code() != elastic::errc::invalid_argument && e.code() != elastic::errc::bad_name) std::abort();
  }
  return 0;
}
