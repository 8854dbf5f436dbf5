// What the NCCL backend can do is decided by the libnccl this process runs with, not only by the
// headers it was built against: a program built against NCCL 2.28.9 ran on a machine whose
// libnccl was 2.28.3 (no ncclCommRevoke) and died at load time with an undefined symbol. These
// checks need no GPU: they ask the loaded library, and the build checks (tests/CMakeLists.txt)
// that no binary links ncclCommRevoke or ncclCommShrink directly.
#include <dlfcn.h>
#include <stdlib.h>

#include <string>

#include <elastic/comm/nccl.hpp>
#include <elastic/comm/nccl_group.hpp>

#include "support/catch.hpp"

namespace comm = elastic::comm;
namespace detail = elastic::comm::detail;

TEST_CASE("nccl capabilities are those of the library loaded at run time", "[nccl]") {
  const int runtime = detail::nccl_runtime_version();
  INFO("built against NCCL " << NCCL_VERSION_CODE << ", running with " << runtime);
  REQUIRE(runtime >= NCCL_VERSION(2, 0, 0));

  // The symbol lookup finds what the dynamic linker would, in the library that holds ncclGetVersion.
  const bool has_shrink = ::dlsym(RTLD_DEFAULT, "ncclCommShrink") != nullptr;
  const bool has_revoke = ::dlsym(RTLD_DEFAULT, "ncclCommRevoke") != nullptr;
  const bool has_grow = ::dlsym(RTLD_DEFAULT, "ncclCommGrow") != nullptr &&
                        ::dlsym(RTLD_DEFAULT, "ncclCommGetUniqueId") != nullptr;
  CHECK(detail::nccl_symbol("ncclGetVersion") != nullptr);
  CHECK(detail::nccl_symbol("ncclNoSuchFunction") == nullptr);
  CHECK((detail::nccl_shrink_fn() != nullptr) == has_shrink);
  CHECK((detail::nccl_revoke_fn() != nullptr) == has_revoke);

  // What the communicator uses is the symbols, less the releases gated off (next test).
  const auto expected = detail::decide_recovery_calls(runtime, has_revoke, has_shrink, has_grow,
                                                      detail::several_rdma_nics(), "auto");
  CHECK(comm::nccl_communicator::can_shrink() == expected.shrink);
  CHECK(comm::nccl_communicator::can_revoke() == expected.revoke);
  CHECK(comm::nccl_communicator::can_grow() == expected.grow);
  if (!has_shrink) CHECK_FALSE(comm::nccl_communicator::can_shrink());
  if (!has_revoke) CHECK_FALSE(comm::nccl_communicator::can_revoke());
}

TEST_CASE("recovery calls follow the loaded release: new calls by version, known-bad releases re-initialise", "[nccl]") {
  using detail::decide_recovery_calls;
  using detail::nccl_version_code;
  // 2.27.7: shrink only.
  auto c = decide_recovery_calls(nccl_version_code(2, 27, 7), false, true, false, false, "auto");
  CHECK(c.shrink);
  CHECK_FALSE(c.revoke);
  CHECK_FALSE(c.grow);
  // 2.28.3 .. 2.28.8: NVRx refuses them; nothing in place, and the warning says why.
  for (int patch : {3, 5, 8}) {
    c = decide_recovery_calls(nccl_version_code(2, 28, patch), true, true, false, false, "auto");
    CHECK_FALSE(c.shrink);
    CHECK_FALSE(c.revoke);
    CHECK(c.warning.find("2.28.3..2.28.8") != std::string::npos);
  }
  // 2.28.9: revoke and shrink, no grow (2.29.2).
  c = decide_recovery_calls(nccl_version_code(2, 28, 9), true, true, false, false, "auto");
  CHECK(c.shrink);
  CHECK(c.revoke);
  CHECK_FALSE(c.grow);
  // A symbol the release is too old for is not trusted (a vendor build exporting it early).
  c = decide_recovery_calls(nccl_version_code(2, 29, 1), true, true, true, false, "auto");
  CHECK_FALSE(c.grow);
  c = decide_recovery_calls(nccl_version_code(2, 30, 7), true, true, true, false, "auto");
  CHECK((c.shrink && c.revoke && c.grow));
  // Several RDMA NICs: shrink waits for 2.30.7 (NVIDIA/nccl#2397).
  c = decide_recovery_calls(nccl_version_code(2, 30, 4), true, true, true, true, "auto");
  CHECK_FALSE(c.shrink);
  CHECK(c.grow);
  CHECK(c.warning.find("2397") != std::string::npos);
  c = decide_recovery_calls(nccl_version_code(2, 30, 7), true, true, true, true, "auto");
  CHECK(c.shrink);
  // Departures are shrunk from 9 ranks on; ELASTIC_NCCL_RECOVERY=inplace shrinks at any size.
  CHECK(c.shrink_from_world == 9);
  c = decide_recovery_calls(nccl_version_code(2, 30, 7), true, true, true, false, "inplace");
  CHECK((c.shrink && c.revoke && c.grow));
  CHECK(c.shrink_from_world == 0);
  // ELASTIC_NCCL_RECOVERY=reinit turns everything off.
  c = decide_recovery_calls(nccl_version_code(2, 30, 7), true, true, true, false, "reinit");
  CHECK_FALSE((c.shrink || c.revoke || c.grow));
  CHECK(detail::nccl_version_string(22809) == "2.28.9");
  CHECK(detail::nccl_version_string(23007) == "2.30.7");
}

TEST_CASE("only a malformed argument leaves a communicator usable: ncclInvalidUsage breaks it", "[nccl]") {
  CHECK(detail::leaves_usable(ncclInvalidArgument));
  // NCCL's guide: after ncclInvalidUsage the communicator must be aborted.
  CHECK_FALSE(detail::leaves_usable(ncclInvalidUsage));
  CHECK_FALSE(detail::leaves_usable(ncclSystemError));
  CHECK_FALSE(detail::leaves_usable(ncclRemoteError));
  CHECK_FALSE(detail::leaves_usable(ncclInternalError));
  CHECK_FALSE(detail::leaves_usable(ncclUnhandledCudaError));
}

TEST_CASE("standby communicators: an explicit max_world wins, else ELASTIC_NCCL_STANDBY, and a bad value is "
          "refused naming it",
          "[nccl]") {
  struct restore_env {
    ~restore_env() { ::unsetenv("ELASTIC_NCCL_STANDBY"); }
  } restore;
  ::unsetenv("ELASTIC_NCCL_STANDBY");
  CHECK(comm::nccl_standby{}.resolved() == 0);  // off by default
  ::setenv("ELASTIC_NCCL_STANDBY", "4", 1);
  CHECK(comm::nccl_standby{}.resolved() == 4);
  CHECK(comm::nccl_standby{.max_world = 0}.resolved() == 0);
  for (const char* bad : {"four", "-1", "8.5"}) {
    ::setenv("ELASTIC_NCCL_STANDBY", bad, 1);
    try {
      (void)comm::nccl_standby{}.resolved();
      FAIL("accepted ELASTIC_NCCL_STANDBY=" << bad);
    } catch (const elastic::error& e) {
      CHECK(e.code() == elastic::errc::invalid_argument);
      CHECK(std::string(e.what()).find("ELASTIC_NCCL_STANDBY") != std::string::npos);
    }
  }
}
