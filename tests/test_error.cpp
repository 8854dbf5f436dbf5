#include <cerrno>
#include <string>
#include <system_error>
#include <type_traits>

#include <elastic/error.hpp>

#include "support/catch.hpp"

namespace {

using elastic::errc;

// Every code, in declaration order; a new code belongs here too.
constexpr errc all_codes[] = {errc::invalid_argument, errc::bad_name,      errc::not_found,
                              errc::already_running,  errc::version_mismatch, errc::owner_mismatch,
                              errc::corrupt,          errc::capacity_exhausted, errc::timeout,
                              errc::os_error,         errc::mismatch,      errc::interrupted,
                              errc::unsafe_path,      errc::peer_lost,     errc::aborted,
                              errc::not_supported,    errc::unavailable,   errc::device_error,
                              errc::run_finished};

}  // namespace

TEST_CASE("an error carries its code and says what to do") {
  const elastic::error e(errc::bad_name, "segment name 'a/b' holds '/': use letters");
  CHECK(e.code() == errc::bad_name);
  CHECK(!e.os_code());
  const std::string what = e.what();
  CHECK(what.find("segment name 'a/b'") != std::string::npos);
  CHECK(what.find("[bad_name]") != std::string::npos);
}

TEST_CASE("an OS error keeps its errno") {
  const elastic::error e = elastic::os_error("cannot open x", ENOENT);
  CHECK(e.code() == errc::os_error);
  CHECK(e.os_code().value() == ENOENT);
  CHECK(std::string(e.what()).find("No such file") != std::string::npos);
}

TEST_CASE("message() is the thrower's text alone, what() decorates it") {
  const elastic::error e(errc::timeout, "store shm://x did not answer in 5 ms");
  CHECK(e.message() == "store shm://x did not answer in 5 ms");
  CHECK(std::string(e.what()) == "elastic: store shm://x did not answer in 5 ms [timeout]");
}

TEST_CASE("message() leaves out the OS reason that what() adds") {
  const elastic::error e = elastic::os_error("cannot open x", ENOENT);
  CHECK(e.message() == "cannot open x");
  CHECK(std::string(e.what()) == "elastic: cannot open x (" + std::make_error_code(std::errc::no_such_file_or_directory).message() +
                                     ") [os_error]");
}

TEST_CASE("an error quoting another's message() has one prefix and one code") {
  const elastic::error inner(errc::not_found, "no key 'a'");
  const elastic::error outer(inner.code(), "reading the manifest: " + inner.message());
  CHECK(std::string(outer.what()) == "elastic: reading the manifest: no key 'a' [not_found]");
}

TEST_CASE("message() survives a copy and a message with brackets or the prefix in it") {
  const elastic::error e(errc::corrupt, "elastic: entry [3] is short [by 2]");
  const elastic::error copy = e;  // NOLINT(performance-unnecessary-copy-initialization)
  CHECK(copy.message() == "elastic: entry [3] is short [by 2]");
  CHECK(std::is_nothrow_copy_constructible_v<elastic::error>);
}

TEST_CASE("an errc is a std::error_code of the elastic category") {
  STATIC_REQUIRE(std::is_error_code_enum_v<errc>);
  const std::error_code ec = errc::timeout;
  CHECK(std::string(ec.category().name()) == "elastic");
  CHECK(&ec.category() == &elastic::error_category());
  CHECK(ec == errc::timeout);
  CHECK(ec != errc::aborted);
  CHECK(ec != std::make_error_code(std::errc::timed_out));  // another category, another meaning
  CHECK(ec.value() == static_cast<int>(errc::timeout));
}

TEST_CASE("error_code() round-trips the code of an error") {
  const elastic::error e(errc::peer_lost, "rank 3 went away");
  CHECK(e.error_code() == errc::peer_lost);
  CHECK(e.error_code() == elastic::make_error_code(e.code()));
  CHECK(static_cast<errc>(e.error_code().value()) == e.code());
  CHECK(e.error_code().message() == elastic::error_category().message(static_cast<int>(errc::peer_lost)));
}

TEST_CASE("every error code has a stable name and a description") {
  for (auto c : all_codes) {
    CAPTURE(static_cast<int>(c));
    CHECK(elastic::to_string(c) != "unknown");
    const std::string m = elastic::make_error_code(c).message();
    CHECK(!m.empty());
    CHECK(m != "unknown elastic error");
  }
  CHECK(elastic::to_string(static_cast<errc>(0)) == "unknown");
}

TEST_CASE("the codes for lost peers, aborted communicators, missing features and unreachable services exist") {
  CHECK(elastic::to_string(errc::peer_lost) == "peer_lost");
  CHECK(elastic::to_string(errc::aborted) == "aborted");
  CHECK(elastic::to_string(errc::not_supported) == "not_supported");
  CHECK(elastic::to_string(errc::unavailable) == "unavailable");
  CHECK(elastic::to_string(errc::device_error) == "device_error");
  CHECK(elastic::to_string(errc::run_finished) == "run_finished");
}
