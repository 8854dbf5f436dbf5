#include <cerrno>
#include <string>

#include <elastic/error.hpp>

#include "support/catch.hpp"

TEST_CASE("an error carries its code and says what to do") {
  const elastic::error e(elastic::errc::bad_name, "segment name 'a/b' holds '/': use letters");
  CHECK(e.code() == elastic::errc::bad_name);
  CHECK(!e.os_code());
  const std::string what = e.what();
  CHECK(what.find("segment name 'a/b'") != std::string::npos);
  CHECK(what.find("[bad_name]") != std::string::npos);
}

TEST_CASE("an OS error keeps its errno") {
  const elastic::error e = elastic::os_error("cannot open x", ENOENT);
  CHECK(e.code() == elastic::errc::os_error);
  CHECK(e.os_code().value() == ENOENT);
  CHECK(std::string(e.what()).find("No such file") != std::string::npos);
}

TEST_CASE("every error code has a stable name") {
  using elastic::errc;
  for (auto c : {errc::invalid_argument, errc::bad_name, errc::not_found, errc::already_running,
                 errc::version_mismatch, errc::owner_mismatch, errc::corrupt, errc::capacity_exhausted,
                 errc::timeout, errc::os_error, errc::mismatch, errc::interrupted, errc::unsafe_path}) {
    CHECK(elastic::to_string(c) != "unknown");
  }
}
