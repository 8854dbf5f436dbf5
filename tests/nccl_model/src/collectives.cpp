// Collectives of the NCCL model: the checks of ncclEnqueueCheck/ArgsCheck (src/enqueue.cc,
// src/misc/argcheck.cc at v2.30.7-1), then a "kernel" on the caller's stream that runs the
// collective over the ring when the stream reaches it.
//
// Kernels move whole buffers around the ring (n-1 steps, every rank sending to its successor and
// receiving from its predecessor at once), then reduce in rank order: slow, and bit-identical on
// every rank. Each step is preceded by a header (the operation's ticket and size), so ranks that
// disagree about the sequence of collectives get an error instead of garbage.
//
// When a neighbour goes away mid-kernel (EOF, ECONNRESET, EPIPE), the kernel never completes on
// its own: it waits for abort or revoke. If that neighbour is on another host (its NCCL_HOSTID or
// host name differs: NET/Socket), the communicator gets the sticky proxy error ncclRemoteError
// (src/misc/socket.cc socketProgress; NCCL 2.28.3 on an H100 did exactly this); if it is on the
// same host (P2P/SHM) nothing is reported at all (NVIDIA/nccl#279).
#include <atomic>
#include <cstring>
#include <thread>

#include "cuda_model.hpp"
#include "faults.hpp"
#include "operations.hpp"
#include "reduce.hpp"
#include "settings.hpp"
#include "util.hpp"

namespace nccl_model {
namespace {

using namespace std::chrono_literals;

std::atomic<long long> collectives_issued{0};  // ELASTIC_NCCL_MODEL_FAIL_OP/HANG_OP count these

const char* op_name(collective_kind k) {
  switch (k) {
    case collective_kind::all_reduce: return "AllReduce";
    case collective_kind::broadcast: return "Broadcast";
    case collective_kind::all_gather: return "AllGather";
  }
  return "?";
}

struct frame {
  std::uint64_t ticket;
  std::uint64_t bytes;
};

// How a ring step ended.
struct step_result {
  net::io status = net::io::ok;
  int side = 0;  // 0: toward the successor, 1: from the predecessor
  std::string mismatch;
};

// One running collective.
class kernel {
 public:
  kernel(std::shared_ptr<communicator> c, collective op, std::uint64_t ticket, long long number, const std::byte* send,
         std::byte* recv)
      : c_(std::move(c)), op_(op), ticket_(ticket), number_(number), send_(send), recv_(recv) {}

  void run() {
    if (!c_->kernel_begin(ticket_)) return c_->kernel_done(ticket_, false);
    const faults& f = faults::get();
    if (number_ == f.fail_op) {
      c_->set_proxy_error(ncclSystemError, strprintf("%s: injected failure of operation %lld "
                                                     "(ELASTIC_NCCL_MODEL_FAIL_OP)", op_name(op_.kind), number_));
      stall();
    } else if (number_ == f.hang_op) {
      stall();
    } else if (const step_result r = execute(); r.status != net::io::ok) {
      report(r);
      stall();
    }
    c_->kernel_done(ticket_, true);
  }

 private:
  [[nodiscard]] bool must_stop() const { return c_->kernel_must_stop(ticket_); }

  // What a kernel that cannot complete does on the GPU: spin until the abort flag is set.
  void stall() const {
    while (!must_stop()) std::this_thread::sleep_for(1ms);
  }

  [[nodiscard]] std::size_t bytes() const { return op_.count * type_size(op_.data_type()); }
  [[nodiscard]] int succ() const { return (c_->rank + 1) % c_->nranks; }
  [[nodiscard]] int pred() const { return (c_->rank + c_->nranks - 1) % c_->nranks; }

  // A header then the payload each way; either direction may be empty.
  step_result step(const std::byte* out, std::size_t out_bytes, bool sending, std::byte* in, std::size_t in_bytes,
                   bool receiving) {
    step_result r;
    const net::stop_fn stop = [this] { return must_stop(); };
    const frame mine{ticket_, out_bytes};
    frame theirs{};
    r.status = net::exchange(c_->to_succ.get(), &mine, sending ? sizeof mine : 0, c_->from_pred.get(), &theirs,
                             receiving ? sizeof theirs : 0, stop, &r.side);
    if (r.status != net::io::ok) return r;
    if (receiving && (theirs.ticket != ticket_ || theirs.bytes != in_bytes)) {
      r.status = net::io::failed;
      r.side = 1;
      r.mismatch = strprintf("%s: rank %d sent %llu bytes for its collective #%llu, this rank expected %zu bytes for "
                             "its collective #%llu: every rank must call the same collectives in the same order",
                             op_name(op_.kind), pred(), static_cast<unsigned long long>(theirs.bytes),
                             static_cast<unsigned long long>(theirs.ticket + 1), in_bytes,
                             static_cast<unsigned long long>(ticket_ + 1));
      return r;
    }
    r.status = net::exchange(c_->to_succ.get(), out, sending ? out_bytes : 0, c_->from_pred.get(), in,
                             receiving ? in_bytes : 0, stop, &r.side);
    return r;
  }

  // Whole buffers go around the ring: afterwards `slots` holds every rank's block in rank order.
  step_result ring_allgather(std::byte* slots, std::size_t block) {
    const int n = c_->nranks;
    for (int s = 0; s < n - 1; ++s) {
      const auto send_i = static_cast<std::size_t>((c_->rank - s + 2 * n) % n);
      const auto recv_i = static_cast<std::size_t>((c_->rank - s - 1 + 2 * n) % n);
      step_result r = step(slots + send_i * block, block, true, slots + recv_i * block, block, true);
      if (r.status != net::io::ok) return r;
    }
    return {};
  }

  step_result execute() {
    const std::size_t b = bytes();
    const int n = c_->nranks;
    switch (op_.kind) {
      case collective_kind::all_reduce: {
        std::vector<std::byte> all(b * static_cast<std::size_t>(n));
        std::memcpy(all.data() + b * static_cast<std::size_t>(c_->rank), send_, b);
        if (step_result r = ring_allgather(all.data(), b); r.status != net::io::ok) return r;
        std::vector<const std::byte*> inputs;
        for (int i = 0; i < n; ++i) inputs.push_back(all.data() + b * static_cast<std::size_t>(i));
        reduce_in_rank_order(op_.data_type(), op_.red_op(), n, inputs.data(), recv_, op_.count);
        return {};
      }
      case collective_kind::all_gather:
        std::memmove(recv_ + b * static_cast<std::size_t>(c_->rank), send_, b);
        return ring_allgather(recv_, b);
      case collective_kind::broadcast:
        if (c_->rank == op_.root) {
          if (send_ != recv_) std::memmove(recv_, send_, b);
          return n > 1 ? step(recv_, b, true, nullptr, 0, false) : step_result{};
        }
        if (step_result r = step(nullptr, 0, false, recv_, b, true); r.status != net::io::ok) return r;
        return succ() != op_.root ? step(recv_, b, true, nullptr, 0, false) : step_result{};
    }
    return {};
  }

  void report(const step_result& r) {
    if (!r.mismatch.empty()) {
      c_->set_proxy_error(ncclInvalidUsage, r.mismatch);
      return;
    }
    if (r.status == net::io::stopped) return;
    const int peer = r.side == 0 ? succ() : pred();
    const boot::peer_info& p = c_->peers[static_cast<std::size_t>(peer)];
    const boot::peer_info& me = c_->peers[static_cast<std::size_t>(c_->rank)];
    if (std::strncmp(p.host, me.host, sizeof p.host) == 0) return;  // P2P/SHM: no error (NVIDIA/nccl#279)
    // src/misc/socket.cc socketProgress: a closed connection is ncclRemoteError with this text (what
    // NCCL 2.28.3 reported on an H100 when a NET/Socket peer was killed mid-allreduce).
    c_->set_proxy_error(
        ncclRemoteError,
        r.status == net::io::closed
            ? strprintf("socketProgress: Connection closed by remote peer localhost<%u> (NET/Socket: rank %d, host %s, pid %d)",
                        static_cast<unsigned>(p.listen_port), peer, p.host, p.pid)
            : strprintf("socketProgress: socket error with remote peer localhost<%u> (NET/Socket: rank %d, host %s, pid %d)",
                        static_cast<unsigned>(p.listen_port), peer, p.host, p.pid));
  }

  std::shared_ptr<communicator> c_;
  collective op_;
  std::uint64_t ticket_;
  long long number_;
  const std::byte* send_;
  std::byte* recv_;
};

// CudaPtrCheck (src/misc/argcheck.cc): NCCL checks pointers only with NCCL_CHECK_POINTERS/check
// mode; the model always does, and also checks the size.
ncclResult_t check_pointer(communicator& c, const char* opname, const char* which, const void* p, std::size_t need,
                           const std::byte** host) {
  const cuda::region r = cuda::locate(p);
  if (p == nullptr || r.kind == cuda::memory_kind::pageable) {
    c.warn(strprintf("%s : %s %p is not a valid pointer (not device memory: cudaMalloc, cudaMallocManaged or pinned "
                     "host memory)", opname, which, p));
    return ncclInvalidArgument;
  }
  if (r.kind == cuda::memory_kind::device && r.device != c.device) {
    c.warn(strprintf("%s : %s allocated on device %d mismatchs with NCCL device %d", opname, which, r.device, c.device));
    return ncclInvalidArgument;
  }
  if (r.bytes_left < need) {
    c.warn(strprintf("%s : %s %p has %zu bytes left in its allocation, the operation needs %zu", opname, which, p,
                     r.bytes_left, need));
    return ncclInvalidArgument;
  }
  *host = r.host;
  return ncclSuccess;
}

ncclResult_t check_arguments(communicator& c, const collective& op, const char* name) {
  if (op.kind == collective_kind::broadcast && (op.root < 0 || op.root >= c.nranks)) {
    c.warn(strprintf("%s : invalid root %d (root should be in the 0..%d range)", name, op.root, c.nranks));
    return ncclInvalidArgument;
  }
  if (op.type < 0 || op.type >= ncclNumTypes) {
    c.warn(strprintf("%s : invalid type %d", name, op.type));
    return ncclInvalidArgument;
  }
  if (op.kind == collective_kind::all_reduce && (op.op < 0 || op.op >= ncclNumOps)) {
    c.warn(op.op < 0 ? strprintf("%s : invalid reduction operation %d", name, op.op)
                     : strprintf("%s : reduction operation %d unknown to this communicator", name, op.op));
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

struct held_launch {
  std::shared_ptr<communicator> comm;
  std::shared_ptr<cuda::stream> stream;
  std::function<void()> work;
};

// Launches a kernel: at once on a blocking communicator (or with ELASTIC_NCCL_MODEL_ASYNC_LAUNCH=0),
// else held until ncclCommGetAsyncError (communicator::defer_launch) and reported ncclInProgress.
ncclResult_t launch(communicator& c, std::shared_ptr<cuda::stream> s, std::function<void()> work) {
  if (!settings::get().async_launch || c.blocking) {
    cuda::enqueue(s, std::move(work));
    return ncclSuccess;
  }
  c.defer_launch(std::move(s), std::move(work));
  return ncclInProgress;
}
thread_local int group_depth = 0;
thread_local std::vector<held_launch> held;  // collectives issued inside ncclGroupStart/End

}  // namespace

ncclResult_t enqueue_collective(const std::shared_ptr<communicator>& c, const collective& op, cudaStream_t stream) {
  const char* name = op_name(op.kind);
  if (c->revoked.load()) {  // checked before anything else, and without touching the state
    c->warn(strprintf("%s: communicator was revoked", name));
    return ncclInvalidUsage;
  }
  const std::byte* send = nullptr;
  const std::byte* recv = nullptr;
  const std::size_t block = op.type >= 0 && op.type < ncclNumTypes ? op.count * type_size(op.data_type()) : 0;
  const std::size_t recv_bytes = op.kind == collective_kind::all_gather ? block * static_cast<std::size_t>(c->nranks) : block;
  ncclResult_t r = c->ensure_ready(name);
  if (r == ncclSuccess) r = check_arguments(*c, op, name);
  const bool sends = op.kind != collective_kind::broadcast || c->rank == op.root;
  if (r == ncclSuccess && op.count > 0 && sends) r = check_pointer(*c, name, "sendbuff", op.send, block, &send);
  if (r == ncclSuccess && op.count > 0) r = check_pointer(*c, name, "recvbuff", op.recv, recv_bytes, &recv);
  cudaError_t err = cudaSuccess;
  std::shared_ptr<cuda::stream> s;
  if (r == ncclSuccess) s = cuda::resolve_stream(stream, c->device, name, &err);
  if (r == ncclSuccess && (!s || cuda::stream_device(*s) != c->device)) {
    c->warn(s ? strprintf("%s : Cuda failure 400 'invalid resource handle': the stream belongs to CUDA device %d, the "
                          "communicator to device %d", name, cuda::stream_device(*s), c->device)
              : strprintf("%s : Cuda failure 400 'invalid resource handle': not a stream", name));
    r = ncclUnhandledCudaError;
  }
  if (r != ncclSuccess) {
    // ncclEnqueueCheck, label fail: a non-blocking communicator keeps the error as its state, so
    // the next call's ncclCommEnsureReady fails too: the communicator is lost.
    if (!c->blocking) c->async.store(r, std::memory_order_release);
    return r;
  }
  if (op.count == 0) return ncclSuccess;
  const std::uint64_t ticket = c->take_ticket();
  const long long number = ++collectives_issued;
  auto k = std::make_shared<kernel>(c, op, ticket, number, send, const_cast<std::byte*>(recv));
  std::function<void()> work = [k] { k->run(); };
  if (group_depth > 0) {  // launched by the outermost ncclGroupEnd
    held.push_back({c, std::move(s), std::move(work)});
    return ncclSuccess;
  }
  return launch(*c, std::move(s), std::move(work));
}

ncclResult_t group_start() {
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t group_end() {
  if (group_depth == 0) {
    warn("ncclGroupEnd: not in a group call.");
    return ncclInvalidUsage;
  }
  if (--group_depth > 0) return ncclSuccess;
  std::vector<held_launch> launches = std::move(held);
  held.clear();
  ncclResult_t r = ncclSuccess;
  for (auto& l : launches) {
    if (launch(*l.comm, std::move(l.stream), std::move(l.work)) == ncclInProgress) r = ncclInProgress;
  }
  return r;
}

}  // namespace nccl_model
