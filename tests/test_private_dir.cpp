// The directories elastic writes into cannot be redirected by another user, and stale
// shared-memory objects are swept only when nothing uses them.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <elastic/internal/private_dir.hpp>
#include <elastic/internal/shm_object.hpp>

#include "support/catch.hpp"
#include "support/errors.hpp"
#include "support/other_user.hpp"
#include "support/process.hpp"

namespace fs = std::filesystem;
using elastic::internal::private_dir;

namespace {

template <class F>
elastic::errc code_of(F&& f) {
  return elastic::test::error_of(std::forward<F>(f)).code();
}

}  // namespace

TEST_CASE("a private directory is created with its parents and files are made in it by name") {
  elastic::test::temp_dir tmp;
  const auto d = private_dir::open(fs::path(tmp.path()) / "a" / "b");
  CHECK(fs::is_directory(tmp.file("a/b")));
  { auto f = d.create_file("x.log"); }
  CHECK(fs::exists(tmp.file("a/b/x.log")));
  auto sub = d.subdir("sub");
  CHECK(fs::is_directory(tmp.file("a/b/sub")));
  { auto f = sub.open_file("y", O_WRONLY | O_CREAT | O_APPEND); }
  CHECK(fs::exists(tmp.file("a/b/sub/y")));
}

TEST_CASE("a symbolic link planted where a file goes is refused, and its target is not touched") {
  elastic::test::temp_dir tmp;
  const auto d = private_dir::open(tmp.file("logs"));
  { std::ofstream(tmp.file("secret")) << "keep"; }
  fs::create_symlink(tmp.file("secret"), tmp.file("logs/rank-0.log"));
  CHECK(code_of([&] { (void)d.open_file("rank-0.log", O_WRONLY | O_CREAT | O_APPEND); }) == elastic::errc::unsafe_path);
  CHECK(code_of([&] { (void)d.open_file("rank-0.log", O_WRONLY | O_CREAT | O_TRUNC); }) == elastic::errc::unsafe_path);
  // create_file removes what is there and makes a new file: the link goes, the target stays.
  { auto f = d.create_file("rank-0.log"); }
  CHECK_FALSE(fs::is_symlink(tmp.file("logs/rank-0.log")));
  std::ifstream in(tmp.file("secret"));
  std::string s;
  in >> s;
  CHECK(s == "keep");
}

TEST_CASE("a hard link planted where a file is appended to is refused") {
  elastic::test::temp_dir tmp;
  const auto d = private_dir::open(tmp.file("logs"));
  { std::ofstream(tmp.file("secret")) << "keep"; }
  fs::create_hard_link(tmp.file("secret"), tmp.file("logs/events.jsonl"));
  CHECK(code_of([&] { (void)d.open_file("events.jsonl", O_WRONLY | O_CREAT | O_APPEND); }) == elastic::errc::unsafe_path);
}

TEST_CASE("a directory that is a symbolic link at the last step of a subdirectory is refused") {
  elastic::test::temp_dir tmp;
  const auto d = private_dir::open(tmp.file("ckpt"));
  fs::create_directory(tmp.file("elsewhere"));
  fs::create_directory_symlink(tmp.file("elsewhere"), tmp.file("ckpt/.pending-step-000000000001"));
  CHECK(code_of([&] { (void)d.subdir(".pending-step-000000000001"); }) == elastic::errc::unsafe_path);
}

TEST_CASE("a directory other users can write to is refused, unless it is sticky") {
  elastic::test::temp_dir tmp;
  fs::create_directory(tmp.file("shared"));
  ::chmod(tmp.file("shared").c_str(), 0777);
  CHECK(code_of([&] { (void)private_dir::open(tmp.file("shared")); }) == elastic::errc::unsafe_path);
  ::chmod(tmp.file("shared").c_str(), 01777);
  CHECK_NOTHROW(private_dir::open(tmp.file("shared")));
  ::chmod(tmp.file("shared").c_str(), 0775);
  CHECK(code_of([&] { (void)private_dir::open(tmp.file("shared")); }) == elastic::errc::unsafe_path);
}

TEST_CASE("our own symbolic links on the way to a directory are followed") {
  elastic::test::temp_dir tmp;
  fs::create_directory(tmp.file("real"));
  fs::create_directory_symlink(tmp.file("real"), tmp.file("link"));
  const auto d = private_dir::open(fs::path(tmp.file("link")) / "ckpt");
  CHECK(fs::is_directory(tmp.file("real/ckpt")));
}

TEST_CASE("a directory or symbolic link of another user is refused (root only)") {
  const auto other = elastic::test::require_other_user();
  elastic::test::temp_dir tmp;
  ::chmod(tmp.path().c_str(), 01777);  // a shared place like /tmp
  fs::create_directory(tmp.file("theirs"));
  REQUIRE(::chown(tmp.file("theirs").c_str(), other.uid, other.gid) == 0);
  const auto err = [&](const std::string& p) {
    try {
      (void)private_dir::open(p);
    } catch (const elastic::error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string msg = err(tmp.file("theirs"));
  CHECK(msg.find(tmp.file("theirs")) != std::string::npos);
  CHECK(msg.find("belongs to uid " + std::to_string(other.uid)) != std::string::npos);
  // A link of theirs into a directory of ours is refused too: they could point it anywhere.
  fs::create_directory(tmp.file("mine"));
  fs::create_directory_symlink(tmp.file("mine"), tmp.file("their-link"));
  REQUIRE(::lchown(tmp.file("their-link").c_str(), other.uid, other.gid) == 0);
  CHECK(err(tmp.file("their-link") + "/logs").find("symbolic link of uid") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp.file("mine/logs")));
}

TEST_CASE("stale shared-memory objects are swept, used and locked ones kept") {
  const std::string prefix = elastic::test::unique_name("elastic-sweeptest") + ".";
  auto make = [&](const std::string& n) {
    const int fd = ::open(("/dev/shm/" + prefix + n).c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, 4096) == 0);
    return fd;
  };
  const int stale = make("stale");
  ::close(stale);
  const int mapped_fd = make("mapped");
  void* m = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, mapped_fd, 0);
  REQUIRE(m != MAP_FAILED);
  const int locked = make("locked");
  REQUIRE(::flock(locked, LOCK_EX) == 0);
  const int young = make("young");
  ::close(young);
  // Everything is young now: nothing goes.
  CHECK(elastic::internal::sweep_stale_shm(prefix, 60).empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  const auto removed = elastic::internal::sweep_stale_shm(prefix, 1);
  CHECK(removed.size() == 2);  // stale and young (now over a second old)
  CHECK_FALSE(fs::exists("/dev/shm/" + prefix + "stale"));
  CHECK(fs::exists("/dev/shm/" + prefix + "mapped"));
  CHECK(fs::exists("/dev/shm/" + prefix + "locked"));
  ::munmap(m, 4096);
  ::close(mapped_fd);
  ::close(locked);
  CHECK(elastic::internal::sweep_stale_shm(prefix, 0).size() == 2);
}
