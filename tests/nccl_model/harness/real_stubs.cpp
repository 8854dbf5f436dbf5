// Linked into nccl_model_probe when it is built against the REAL CUDA and NCCL (check_real_nccl.py):
// the model-only extras of nccl_model.h, which real NCCL does not have.
#include <nccl_model.h>

extern "C" {
int elastic_nccl_model_live_roots(void) { return -1; }
int elastic_nccl_model_live_comms(void) { return -1; }
int elastic_nccl_model_live_streams(void) { return -1; }
}
