// What the NCCL backend can do is decided by the libnccl this process runs with, not only by the
// headers it was built against: a program built against NCCL 2.28.9 ran on a machine whose
// libnccl was 2.28.3 (no ncclCommRevoke) and died at load time with an undefined symbol. These
// checks need no GPU: they ask the loaded library, and the build checks (tests/CMakeLists.txt)
// that no binary links ncclCommRevoke or ncclCommShrink directly.
#include <dlfcn.h>

#include <elastic/comm/nccl.hpp>

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
  CHECK(comm::nccl_communicator::can_shrink() == (NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0) && has_shrink));
  CHECK(comm::nccl_communicator::can_revoke() == (NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0) && has_revoke));
  CHECK(detail::nccl_symbol("ncclGetVersion") != nullptr);
  CHECK(detail::nccl_symbol("ncclNoSuchFunction") == nullptr);

  // Each release that added the call exports it; the lookup must not miss one that is there.
  if (NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0) && runtime >= NCCL_VERSION(2, 27, 0)) {
    CHECK(comm::nccl_communicator::can_shrink());
  }
}
