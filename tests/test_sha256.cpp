// SHA-256 and HMAC-SHA256 (internal/sha256.hpp) against the published test vectors: FIPS 180-2's
// examples and RFC 4231's HMAC cases.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <elastic/internal/sha256.hpp>

#include "support/catch.hpp"

namespace {

using bytes = std::vector<std::uint8_t>;

bytes text(std::string_view s) { return bytes(s.begin(), s.end()); }

std::string hex(const elastic::internal::sha256_digest& d) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (const auto b : d) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

std::string hmac(const bytes& key, const bytes& data) { return hex(elastic::internal::hmac_sha256(key, {data})); }

}  // namespace

TEST_CASE("sha256 matches the FIPS 180-2 examples, fed whole or in pieces") {
  using elastic::internal::sha256;
  CHECK(hex(sha256().digest()) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(hex(sha256().update(text("abc")).digest()) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const auto two_blocks = text("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq");
  CHECK(hex(sha256().update(two_blocks).digest()) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  sha256 pieces;
  for (const auto b : two_blocks) pieces.update(&b, 1);
  CHECK(hex(pieces.digest()) == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const bytes million(1'000'000, 'a');
  CHECK(hex(sha256().update(million).digest()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("hmac_sha256 matches the RFC 4231 test cases") {
  bytes key4;
  for (std::uint8_t i = 1; i <= 25; ++i) key4.push_back(i);
  CHECK(hmac(bytes(20, 0x0b), text("Hi There")) == "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(hmac(text("Jefe"), text("what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(hmac(bytes(20, 0xaa), bytes(50, 0xdd)) == "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  CHECK(hmac(key4, bytes(50, 0xcd)) == "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  // Keys longer than a block are hashed first.
  CHECK(hmac(bytes(131, 0xaa), text("Test Using Larger Than Block-Size Key - Hash Key First")) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  CHECK(hmac(bytes(131, 0xaa), text("This is a test using a larger than block-size key and a larger than block-size "
                                    "data. The key needs to be hashed before being used by the HMAC algorithm.")) ==
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
  // The message may come in parts: the MAC is of their concatenation.
  const auto whole = elastic::internal::hmac_sha256(text("Jefe"), {text("what do ya want for nothing?")});
  const auto parts = elastic::internal::hmac_sha256(text("Jefe"), {text("what do ya "), text(""), text("want for nothing?")});
  CHECK(whole == parts);
}

TEST_CASE("MACs compare equal only when every byte is, and random bytes differ between calls") {
  const auto a = elastic::internal::hmac_sha256(text("k"), {text("m")});
  auto b = a;
  CHECK(elastic::internal::equal_in_constant_time(a, b));
  b[31] ^= 1;
  CHECK_FALSE(elastic::internal::equal_in_constant_time(a, b));
  CHECK_FALSE(elastic::internal::equal_in_constant_time(std::span(a).first(16), a));
  elastic::internal::sha256_digest r1{}, r2{};
  elastic::internal::random_bytes(r1.data(), r1.size());
  elastic::internal::random_bytes(r2.data(), r2.size());
  CHECK(r1 != r2);
}
