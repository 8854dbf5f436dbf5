// The one-line worker (comm/worker.hpp, comm/gloo_worker.hpp): what it reads from elastic-run's
// environment, the collective bound it derives, training alone without a store, and the settings
// it refuses, naming them.
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <string>

#include <elastic/checkpoint/loop_options.hpp>
#include <elastic/comm/gloo_worker.hpp>

#include "support/catch.hpp"
#include "support/env_var.hpp"
#include "support/errors.hpp"

using namespace std::chrono_literals;
using elastic::errc;
using elastic::test::env_var;
using elastic::test::error_of;
namespace comm = elastic::comm;

namespace {

/// No elastic-run variables: a worker on its own.
void clear_env() {
  for (const char* v : {"ELASTIC_RDZV", "ELASTIC_RUN_ID", "ELASTIC_MIN_RANKS", "ELASTIC_MAX_RANKS", "ELASTIC_MIN_NODES",
                        "ELASTIC_MAX_NODES", "ELASTIC_STEP_TIMEOUT", "ELASTIC_LOCAL_RANK", "ELASTIC_RESTART_COUNT"})
    ::unsetenv(v);
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("a worker without ELASTIC_RDZV trains alone on a store nobody else sees", "[worker]") {
  clear_env();
  comm::gloo_worker w({.run_id = "alone"});
  CHECK_FALSE(w.env().rdzv);
  CHECK_FALSE(w.env().local_rank);
  CHECK(w.collective_timeout() == std::chrono::minutes(30));  // nothing to derive it from
  w.group().join();
  CHECK(w.group().size() == 1);
  CHECK(w.group().rank() == 0);
  const auto o = w.loop_options({.dir = "ckpt", .steps = 10});
  CHECK(o.group == &w.group());
  CHECK(o.steps == 10);
  // Its store's name went at once: nothing of it is left in /dev/shm to leak.
  for (const auto& f : std::filesystem::directory_iterator("/dev/shm")) {
    CHECK_FALSE(contains(f.path().filename().string(), "elastic-worker-" + std::to_string(::getpid())));
  }
}

TEST_CASE("the collective bound is a third of ELASTIC_STEP_TIMEOUT, at least 200 ms, else the options'", "[worker]") {
  clear_env();
  {
    env_var t("ELASTIC_STEP_TIMEOUT", "3");
    CHECK(comm::gloo_worker().collective_timeout() == 1s);
  }
  {
    env_var t("ELASTIC_STEP_TIMEOUT", "0.3");
    CHECK(comm::gloo_worker().collective_timeout() == 200ms);
    CHECK(comm::gloo_worker({.collective_timeout = 5s}).collective_timeout() == 5s);  // the code wins
  }
  CHECK(comm::gloo_worker({.collective_timeout_default = 10s}).collective_timeout() == 10s);
  CHECK(error_of([] { comm::gloo_worker({.collective_timeout = -1ms}); }).code() == errc::invalid_argument);
  CHECK(error_of([] { comm::gloo_worker({.collective_timeout_default = 0ms}); }).code() == errc::invalid_argument);
}

TEST_CASE("a worker reads its slot and restarts, and refuses malformed settings naming them", "[worker]") {
  clear_env();
  {
    env_var l("ELASTIC_LOCAL_RANK", "3"), r("ELASTIC_RESTART_COUNT", "2");
    comm::gloo_worker w;
    CHECK(w.env().local_rank == 3);
    CHECK(w.env().restart_count == 2);
  }
  auto refused = [](const char* var, const char* value, const std::string& want) {
    env_var e(var, value);
    const auto err = error_of([] { comm::gloo_worker w; });
    INFO(var << "=" << value << ": " << err.what());
    CHECK(err.code() == errc::invalid_argument);
    CHECK(contains(err.what(), want));
  };
  refused("ELASTIC_MIN_RANKS", "2", "ELASTIC_MIN_RANKS=2 needs ELASTIC_RDZV");
  refused("ELASTIC_MIN_RANKS", "many", "ELASTIC_MIN_RANKS='many' is not an integer");
  refused("ELASTIC_STEP_TIMEOUT", "0.0001", "ELASTIC_STEP_TIMEOUT='0.0001' is out of range");
  refused("ELASTIC_LOCAL_RANK", "first", "ELASTIC_LOCAL_RANK='first' is not an integer");
  refused("ELASTIC_RDZV", "ftp://nowhere", "ftp://nowhere");
  {
    env_var lo("ELASTIC_MIN_RANKS", "3"), hi("ELASTIC_MAX_RANKS", "2");
    const auto err = error_of([] { comm::gloo_worker w; });
    CHECK(contains(err.what(), "ELASTIC_MIN_RANKS=3 is above ELASTIC_MAX_RANKS=2"));
  }
}
