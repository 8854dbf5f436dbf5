// The shared-memory segment: bad names, segments that are not ours, and what is left behind.
// Every refusal must say why and must not change a byte of what it refused.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <elastic/timer.hpp>

#include "support/catch.hpp"
#include "support/errors.hpp"
#include "support/hosted_watchdog.hpp"
#include "support/planted_shm.hpp"
#include "support/process.hpp"

using namespace std::chrono_literals;
namespace td = elastic::timer::detail;

namespace {

std::string shm_path(const std::string& name) { return "/dev/shm/" + td::shm_object_name(name); }

std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const std::string& path, const std::vector<char>& bytes, mode_t mode = 0600) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, mode);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}

/// Expects `f` to throw elastic::error with `code` and a message containing `text`.
template <class F>
void expect_error(F&& f, elastic::errc code, const std::string& text) {
  const auto e = elastic::test::error_of(std::forward<F>(f));
  INFO(e.what());
  CHECK(e.code() == code);
  CHECK(std::string(e.what()).find(text) != std::string::npos);
}

elastic::timer::watchdog_options quiet(const std::string& name) {
  return {.name = name, .remove_on_stop = false, .start_thread = false, .events = elastic::event_log()};
}

/// Removes a segment at the end of a test whatever happens.
struct segment_cleanup {
  std::string name;
  ~segment_cleanup() { ::unlink(shm_path(name).c_str()); }
};

/// Keeps /dev/shm's object for segment `name` mapped by this process (no access), so that a
/// watchdog starting meanwhile in another test (ctest runs them side by side) leaves it alone: a
/// segment these tests hold between two steps, unmapped and unlocked, is exactly the stale
/// object a starting watchdog sweeps once it is 2 s old, and a slow machine gets there.
class held_mapping {
 public:
  explicit held_mapping(const std::string& name) {
    const int fd = ::open(shm_path(name).c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    addr_ = ::mmap(nullptr, length, PROT_NONE, MAP_SHARED, fd, 0);
    ::close(fd);
    REQUIRE(addr_ != MAP_FAILED);
  }
  held_mapping(const held_mapping&) = delete;
  held_mapping& operator=(const held_mapping&) = delete;
  ~held_mapping() { ::munmap(addr_, length); }

 private:
  static constexpr std::size_t length = 4096;
  void* addr_ = nullptr;
};

}  // namespace

TEST_CASE("segment names with bad characters are refused") {
  for (const std::string& bad : std::vector<std::string>{"", "a/b", "../etc", ".hidden", "-flag", "has space", "tab\there", "ünï",
                                std::string(201, 'x'), std::string("nul\0in", 6)}) {
    INFO("name: " << bad);
    expect_error([&] { elastic::timer::watchdog w(quiet(bad)); }, elastic::errc::bad_name, "watchdog segment name");
    expect_error([&] { elastic::timer::client::attach(bad); }, elastic::errc::bad_name, "use 1 to 200 characters");
  }
  CHECK_NOTHROW(td::validate_segment_name("job-7_a.B"));
  CHECK_NOTHROW(td::validate_segment_name(std::string(200, 'y')));
}

TEST_CASE("the segment is created with mode 0600") {
  const std::string name = elastic::test::unique_name("mode");
  const mode_t old = ::umask(0);  // even a permissive umask must not widen it
  elastic::timer::watchdog w(quiet(name));
  ::umask(old);
  segment_cleanup c{name};
  struct stat st{};
  REQUIRE(::stat(shm_path(name).c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK(st.st_uid == ::geteuid());
}

TEST_CASE("a second watchdog on a live segment is refused") {
  const std::string name = elastic::test::unique_name("twice");
  elastic::timer::watchdog first(quiet(name));
  segment_cleanup c{name};
  expect_error([&] { elastic::timer::watchdog second(quiet(name)); }, elastic::errc::already_running,
               "already served by a live watchdog (pid " + std::to_string(::getpid()) + ")");
}

TEST_CASE("a segment of another layout version is refused and left untouched") {
  const std::string name = elastic::test::unique_name("version");
  segment_cleanup c{name};
  { elastic::timer::watchdog w(quiet(name)); }
  const held_mapping held(name);
  {
    const int fd = ::open(shm_path(name).c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    const std::uint32_t v2 = 2;
    REQUIRE(::pwrite(fd, &v2, sizeof v2, offsetof(td::segment_header, layout_version)) == sizeof v2);
    ::close(fd);
  }
  const auto before = read_all(shm_path(name));
  expect_error([&] { elastic::timer::watchdog w(quiet(name)); }, elastic::errc::version_mismatch,
               "created by layout v2, this build reads v1");
  expect_error([&] { elastic::timer::client::attach(name); }, elastic::errc::version_mismatch, "layout v2");
  CHECK(read_all(shm_path(name)) == before);
}

TEST_CASE("a file that is not a watchdog segment is refused and left untouched") {
  const std::string name = elastic::test::unique_name("foreign");
  segment_cleanup c{name};
  std::vector<char> junk(4096);
  for (std::size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<char>(i * 7 + 1);
  write_all(shm_path(name), junk);
  const held_mapping held(name);
  expect_error([&] { elastic::timer::watchdog w(quiet(name)); }, elastic::errc::corrupt, "not an elastic watchdog segment");
  expect_error([&] { elastic::timer::client::attach(name); }, elastic::errc::corrupt, "bad magic");
  CHECK(read_all(shm_path(name)) == junk);

  std::vector<char> tiny(10, 'x');
  write_all(shm_path(name), tiny);
  expect_error([&] { elastic::timer::watchdog w(quiet(name)); }, elastic::errc::corrupt, "too small for a header");
  CHECK(read_all(shm_path(name)) == tiny);
}

TEST_CASE("a truncated segment is refused") {
  const std::string name = elastic::test::unique_name("truncated");
  segment_cleanup c{name};
  { elastic::timer::watchdog w(quiet(name)); }
  const held_mapping held(name);
  REQUIRE(::truncate(shm_path(name).c_str(), 64 * 1024) == 0);
  expect_error([&] { elastic::timer::watchdog w(quiet(name)); }, elastic::errc::corrupt, "inconsistent header");
  expect_error([&] { elastic::timer::client::attach(name); }, elastic::errc::corrupt, "inconsistent header");
}

TEST_CASE("a segment owned by another user is refused") {
  if (::geteuid() != 0) {
    WARN("not root: cannot make a segment owned by another user here");
    return;
  }
  const std::string name = elastic::test::unique_name("owner");
  segment_cleanup c{name};
  { elastic::timer::watchdog w(quiet(name)); }
  const held_mapping held(name);
  REQUIRE(::chown(shm_path(name).c_str(), 65534, 65534) == 0);
  const auto before = read_all(shm_path(name));
  expect_error([&] { elastic::timer::watchdog w(quiet(name)); }, elastic::errc::owner_mismatch, "belongs to uid 65534");
  expect_error([&] { elastic::timer::client::attach(name); }, elastic::errc::owner_mismatch, "belongs to uid 65534");
  CHECK(read_all(shm_path(name)) == before);
}

TEST_CASE("a FIFO, socket or device planted under a segment's name is refused by the watchdog and a worker, naming it") {
  for (const auto kind : elastic::test::plantable_kinds()) {
    const std::string what = elastic::test::planted_words(kind);
    INFO(what);
    const std::string name = elastic::test::unique_name("planted");
    const elastic::test::planted_shm planted(td::shm_object_name(name), kind);
    const std::string said = shm_path(name) + " is " + what;
    expect_error([&] { elastic::timer::watchdog w(quiet(name)); }, elastic::errc::unsafe_path, said);
    expect_error([&] { elastic::timer::client::attach(name); }, elastic::errc::unsafe_path, said);
    CHECK(planted.intact());
  }
}

TEST_CASE("an all-zero segment left by a watchdog that died while creating it is initialized afresh") {
  const std::string name = elastic::test::unique_name("zero");
  segment_cleanup c{name};
  write_all(shm_path(name), std::vector<char>(8192, 0));
  const held_mapping held(name);
  elastic::timer::watchdog w(quiet(name));
  CHECK_FALSE(w.adopted());
  CHECK(w.table().slot_count() == td::default_slot_count);
}

TEST_CASE("a capacity out of range is refused") {
  const std::string name = elastic::test::unique_name("capacity");
  auto o = quiet(name);
  o.capacity = 0;
  expect_error([&] { elastic::timer::watchdog w(o); }, elastic::errc::invalid_argument, "capacity 0 slots");
}

TEST_CASE("a stale segment left by a crashed job is adopted and its dead slots freed") {
  const std::string name = elastic::test::unique_name("stale");
  segment_cleanup c{name};
  elastic::test::temp_dir dir;
  const std::string events = dir.file("events.jsonl");
  std::optional<held_mapping> held;
  {
    elastic::timer::watchdog old(quiet(name));
    held.emplace(name);
    auto w = elastic::test::child_process::spawn({ELASTIC_TEST_WORKER, "hang", name, "60000"});
    REQUIRE(w.read_line() == "entered");
    w.kill(SIGKILL);
    REQUIRE(w.killed_by(SIGKILL, 10s));
  }  // the old watchdog goes away without cleaning up, as a crashed job's would
  auto o = quiet(name);
  o.events = elastic::event_log::to_file(events);
  elastic::timer::watchdog fresh(o);
  CHECK(fresh.adopted());
  const auto adopt = elastic::test::events_named(events, "watchdog_adopt");
  REQUIRE(adopt.size() == 1);
  CHECK(adopt[0].find("\"reclaimed_slots\":1") != std::string::npos);
  CHECK(adopt[0].find("\"live_slots\":0") != std::string::npos);
  CHECK(fresh.scan_once().live_scopes == 0);
}
