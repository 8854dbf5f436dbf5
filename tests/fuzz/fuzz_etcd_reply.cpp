// libFuzzer target: replies of etcd's JSON gateway (a proxy or a broken server may send
// anything): the fields the store reads, and base64. Bad replies may only throw elastic::error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <elastic/rendezvous/etcd_store.hpp>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace d = elastic::rendezvous::detail;
  using elastic::internal::json;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // Any bytes encode and decode back.
  if (d::base64_decode(d::base64_encode(text)) != std::string(text)) std::abort();
  if (const auto raw = d::base64_decode(text)) {
    if (d::base64_encode(*raw).size() != text.size()) std::abort();
  }
  try {
    const json reply = json::parse(text);
    if (const auto* header = reply.find("header")) (void)d::int_field(*header, "revision");
    if (const auto* kvs = reply.find("kvs")) {
      for (const auto& kv : kvs->elements()) {
        (void)d::bytes_field(kv, "key");
        (void)d::bytes_field(kv, "value");
        (void)d::int_field(kv, "mod_revision");
        (void)d::int_field(kv, "lease");
      }
    }
    if (const auto* result = reply.find("result")) {
      if (const auto* events = result->find("events")) {
        for (const auto& ev : events->elements()) {
          if (const auto* kv = ev.find("kv")) (void)d::bytes_field(*kv, "key");
        }
      }
    }
  } catch (const elastic::error&) {
  }
  return 0;
}
