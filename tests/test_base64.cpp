// Base64 as etcd's gateway reads and writes it (detail/base64.hpp): tested here, on every build,
// not only where an etcd binary exists.
#include <string>

#include <elastic/internal/base64.hpp>

#include "support/catch.hpp"

using elastic::internal::base64_decode;
using elastic::internal::base64_encode;

TEST_CASE("base64 encodes RFC 4648's test vectors and reads back every byte") {
  CHECK(base64_encode("") == "");
  CHECK(base64_encode("f") == "Zg==");
  CHECK(base64_encode("fo") == "Zm8=");
  CHECK(base64_encode("foo") == "Zm9v");
  CHECK(base64_encode("foob") == "Zm9vYg==");
  CHECK(base64_encode("fooba") == "Zm9vYmE=");
  CHECK(base64_encode("foobar") == "Zm9vYmFy");
  CHECK(base64_decode("Zm9vYmFy") == std::string("foobar"));
  CHECK(base64_decode("") == std::string());
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  for (std::size_t n = 0; n <= all.size(); ++n) CHECK(base64_decode(base64_encode(all.substr(0, n))) == all.substr(0, n));
  CHECK(base64_encode(std::string(3, '\xff')) == "////");
  CHECK(base64_encode(std::string(1, '\0')) == "AA==");
}

TEST_CASE("base64 refuses what is not base64 with padding") {
  for (const char* bad : {"Zg=", "Z===", "Zm9v!A==", "=Zm9", "Zg==Zg==", "Zm 9", "Zm9v\n", "Zg=a", "====", "Zm-_",
                          "Zm9"}) {
    INFO(bad);
    CHECK_FALSE(base64_decode(bad));
  }
}
