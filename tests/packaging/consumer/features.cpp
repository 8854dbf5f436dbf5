// Built against every optional elastic::<feature> target the package offers here: the umbrella
// header compiles with their macros on, and their libraries link.
#include <cstdio>

#include <elastic/elastic.hpp>
#if ELASTIC_WITH_TORCH
#include <elastic/torch.hpp>
#endif

int main() {
  std::printf("cuda=%d nccl=%d gloo=%d etcd=%d s3=%d libdw=%d torch=%d\n", ELASTIC_WITH_CUDA, ELASTIC_WITH_NCCL,
              ELASTIC_WITH_GLOO, ELASTIC_WITH_ETCD, ELASTIC_WITH_S3, ELASTIC_WITH_LIBDW, ELASTIC_WITH_TORCH);
#if ELASTIC_WITH_NCCL
  std::printf("nccl shrink=%d revoke=%d\n", elastic::comm::nccl_communicator::can_shrink() ? 1 : 0,
              elastic::comm::nccl_communicator::can_revoke() ? 1 : 0);
#endif
  return 0;
}
