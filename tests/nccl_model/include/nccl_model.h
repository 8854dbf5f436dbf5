/* Extras of the NCCL model that real NCCL does not have: what its own tests (and the library's)
 * inspect. C linkage. Never include this from library code. */
#ifndef ELASTIC_NCCL_MODEL_H
#define ELASTIC_NCCL_MODEL_H

#ifdef __cplusplus
extern "C" {
#endif

/* Bootstrap roots (ncclGetUniqueId, ncclCommGetUniqueId) of this process still waiting for
 * check-ins: like NCCL's bootstrapRoot thread, a root lives until every rank has checked in,
 * with no timeout, so a round that fails leaks one. */
int elastic_nccl_model_live_roots(void);

/* Communicators of this process not yet aborted or destroyed (a half-made child included). */
int elastic_nccl_model_live_comms(void);

/* CUDA streams of this process whose worker thread still runs (created and not yet drained
 * after cudaStreamDestroy; the per-device legacy streams count once made). */
int elastic_nccl_model_live_streams(void);

#ifdef __cplusplus
}
#endif

#endif /* ELASTIC_NCCL_MODEL_H */
