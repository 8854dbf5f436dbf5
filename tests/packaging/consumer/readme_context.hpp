// What the README's C++ snippets leave to the reader, declared so that each snippet compiles as
// written (tests/packaging/consumer/snippets.cmake wraps each one, unedited, in a function body).
// Only names the snippets use without defining them belong here: the trainer's own functions
// and buffers. Everything from elastic comes from the umbrella header, as a user gets it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <elastic/elastic.hpp>
#if ELASTIC_WITH_TORCH
#include <torch/torch.h>

#include <elastic/torch.hpp>
#endif

// The first snippet brings the chrono literals in; the later ones (120s, 10s) go on using them.
using namespace std::chrono_literals;

// Section 1: a collective the scope guards.
void do_allreduce();

// Section 2: the trainer's state, model and optimizer.
inline float* d_w = nullptr;  // device memory
inline std::size_t n = 0;
inline std::vector<float> host_m;
inline std::vector<float> local;
inline std::uint64_t offset = 0;
inline std::vector<float> v;            // this rank's slice of a partitioned buffer
inline int my_rank = 0, ranks = 1;      // this rank's guess of its place (a group corrects it)
inline std::uint64_t step = 0;
struct data_loader {
  std::uint64_t epoch = 0;
  std::uint64_t cursor = 0;
};
template <class Archive>
void elastic_checkpoint(Archive& ar, data_loader& l) {
  ar(l.epoch, l.cursor);
}
inline data_loader loader;
inline elastic::checkpoint::stream_handle stream = nullptr;
void forward_backward();
void optimizer_update();

// Section 3: the state registered in section 2, and this rank's gradients.
inline elastic::checkpoint::state st;
inline std::vector<float> grads;
void compute_gradients(std::uint64_t step, int rank, int size);
