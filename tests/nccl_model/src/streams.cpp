// CUDA streams and events in the model: a stream is a worker thread running a FIFO of tasks.
//
// Ordering (CUDA Programming Guide, "Implicit Synchronization" and "Default Stream"): the legacy
// default stream (0, cudaStreamLegacy; cudaStreamPerThread is treated as legacy too) is one
// stream per device, made on first use. Work put on it first waits for everything already put on
// every blocking stream (flags 0) of its device; work put on a blocking stream first waits for
// what is already on the legacy stream. Non-blocking streams are independent. A per-device mutex
// gives the enqueues one order, so "already put" is well defined. Dependencies only ever point at
// work enqueued earlier, so waiting on them cannot deadlock.
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#pragma GCC visibility push(default)
#include <cuda_runtime_api.h>
#include <nccl_model.h>
#pragma GCC visibility pop

#include "contract.hpp"
#include "cuda_model.hpp"
#include "handles.hpp"

namespace nccl_model::cuda {

enum class stream_kind { legacy, blocking, non_blocking };

struct wait_point {
  std::shared_ptr<stream> on;
  std::uint64_t seq;
};

namespace {
std::atomic<int> live_streams{0};
}

class stream {
 public:
  stream(int device, stream_kind kind) : device_(device), kind_(kind) {}

  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] stream_kind kind() const noexcept { return kind_; }

  /// Starts the worker; it keeps `self` alive until it has drained after close().
  static void start(const std::shared_ptr<stream>& self) {
    ++live_streams;
    std::thread([self] { self->run(); }).detach();
  }

  std::uint64_t push(std::vector<wait_point> waits, std::function<void()> work) {
    std::uint64_t seq = 0;
    {
      std::lock_guard lk(mu_);
      queue_.push_back({std::move(waits), std::move(work)});
      seq = ++enqueued_;
    }
    cv_.notify_all();
    return seq;
  }

  /// The sequence number of the last task pushed (0: none yet).
  std::uint64_t tail() {
    std::lock_guard lk(mu_);
    return enqueued_;
  }
  bool finished(std::uint64_t seq) {
    std::lock_guard lk(mu_);
    return completed_ >= seq;
  }
  bool idle() {
    std::lock_guard lk(mu_);
    return completed_ == enqueued_;
  }
  void wait(std::uint64_t seq) {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return completed_ >= seq; });
  }
  /// cudaStreamDestroy: returns at once; the worker ends once the queue is drained.
  void close() {
    {
      std::lock_guard lk(mu_);
      closing_ = true;
    }
    cv_.notify_all();
  }

 private:
  struct task {
    std::vector<wait_point> waits;
    std::function<void()> work;
  };

  void run() {
    mark_internal_thread();
    for (;;) {
      task t;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return !queue_.empty() || closing_; });
        if (queue_.empty()) break;  // closing and drained
        t = std::move(queue_.front());
        queue_.pop_front();
      }
      for (auto& w : t.waits) w.on->wait(w.seq);
      t.waits.clear();  // let go of other streams before running
      if (t.work) t.work();
      t.work = nullptr;  // what the task captured goes before it counts as done
      {
        std::lock_guard lk(mu_);
        ++completed_;
      }
      cv_.notify_all();
    }
    --live_streams;
  }

  const int device_;
  const stream_kind kind_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<task> queue_;
  std::uint64_t enqueued_ = 0;
  std::uint64_t completed_ = 0;
  bool closing_ = false;
};

namespace {

// The streams of one device: the lock that orders enqueues, the legacy stream, every other stream.
struct device_streams {
  std::mutex mu;
  std::shared_ptr<stream> legacy;
  std::vector<std::weak_ptr<stream>> others;
};

device_streams& device(int d) {
  static auto* all = new device_streams[64];  // never destroyed: workers may outlive main()
  return all[d < 0 ? 0 : (d > 63 ? 63 : d)];
}

std::shared_ptr<stream> legacy_locked(device_streams& ds, int d) {
  if (!ds.legacy) {
    ds.legacy = std::make_shared<stream>(d, stream_kind::legacy);
    stream::start(ds.legacy);
  }
  return ds.legacy;
}

// Every stream of the device that still has work, each with its current tail.
std::vector<wait_point> pending_locked(device_streams& ds, bool blocking_only) {
  std::vector<wait_point> out;
  auto& v = ds.others;
  v.erase(std::remove_if(v.begin(), v.end(), [](const auto& w) { return w.expired(); }), v.end());
  for (auto& w : v) {
    auto s = w.lock();
    if (!s || (blocking_only && s->kind() != stream_kind::blocking) || s->idle()) continue;
    out.push_back({s, s->tail()});
  }
  return out;
}

struct event {
  std::mutex mu;
  std::shared_ptr<stream> on;  // the stream of the last cudaEventRecord; null: never recorded
  std::uint64_t seq = 0;       // that stream's tail at the time
};

handle_table<stream>& stream_handles() {
  static auto* t = new handle_table<stream>();
  return *t;
}
handle_table<event>& event_handles() {
  static auto* t = new handle_table<event>();
  return *t;
}

std::shared_ptr<event> resolve_event(cudaEvent_t e, const char* api) {
  handle_status st{};
  auto ev = event_handles().find(e, &st);
  if (st == handle_status::dead && contract::enabled(contract::rule::dead_handle)) {
    char who[64];
    std::snprintf(who, sizeof who, "event %p", static_cast<void*>(e));
    contract::violation(contract::rule::dead_handle, std::string(api) + " on an event after cudaEventDestroy", who,
                        "a destroyed event handle is invalid (CUDA Runtime API, cudaEventDestroy)");
  }
  return ev;
}

std::uint64_t enqueue_with(const std::shared_ptr<stream>& s, std::vector<wait_point> extra,
                           std::function<void()> work) {
  device_streams& ds = device(s->device());
  std::lock_guard lk(ds.mu);
  std::vector<wait_point> waits;
  if (s->kind() == stream_kind::legacy) {
    waits = pending_locked(ds, /*blocking_only=*/true);
  } else if (s->kind() == stream_kind::blocking && ds.legacy && !ds.legacy->idle()) {
    waits.push_back({ds.legacy, ds.legacy->tail()});
  }
  for (auto& w : extra) {
    if (w.on != s) waits.push_back(std::move(w));  // a stream runs its own work in order anyway
  }
  return s->push(std::move(waits), std::move(work));
}

}  // namespace

std::shared_ptr<stream> resolve_stream(cudaStream_t h, int dev, const char* api, cudaError_t* err) noexcept {
  if (h == nullptr || h == cudaStreamLegacy || h == cudaStreamPerThread) {
    device_streams& ds = device(dev);
    std::lock_guard lk(ds.mu);
    return legacy_locked(ds, dev);
  }
  handle_status st{};
  auto s = stream_handles().find(h, &st);
  if (st == handle_status::dead && contract::enabled(contract::rule::dead_handle)) {
    char who[64];
    std::snprintf(who, sizeof who, "stream %p", static_cast<void*>(h));
    contract::violation(contract::rule::dead_handle, std::string(api) + " on a stream after cudaStreamDestroy", who,
                        "a destroyed stream handle is invalid (CUDA Runtime API, cudaStreamDestroy)");
  }
  if (!s && err) *err = cudaErrorInvalidResourceHandle;
  return s;
}

int stream_device(const stream& s) noexcept { return s.device(); }

std::uint64_t enqueue(const std::shared_ptr<stream>& s, std::function<void()> work) {
  return enqueue_with(s, {}, std::move(work));
}

void wait_for(const std::shared_ptr<stream>& s, std::uint64_t seq) { s->wait(seq); }

void synchronize_device(int d) {
  std::vector<wait_point> waits;
  {
    device_streams& ds = device(d);
    std::lock_guard lk(ds.mu);
    waits = pending_locked(ds, /*blocking_only=*/false);
    if (ds.legacy && !ds.legacy->idle()) waits.push_back({ds.legacy, ds.legacy->tail()});
  }
  for (auto& w : waits) w.on->wait(w.seq);
}

bool device_idle(int d) {
  device_streams& ds = device(d);
  std::lock_guard lk(ds.mu);
  return pending_locked(ds, false).empty() && (!ds.legacy || ds.legacy->idle());
}

}  // namespace nccl_model::cuda

namespace cuda = nccl_model::cuda;

namespace {

// The stream for a C API call: the caller's current device picks the legacy stream.
std::shared_ptr<cuda::stream> lookup(cudaStream_t s, const char* api, cudaError_t* err) {
  return cuda::resolve_stream(s, cuda::current_device(), api, err);
}

}  // namespace

extern "C" {

int elastic_nccl_model_live_streams(void) { return cuda::live_streams.load(); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  cuda::enter_api("cudaStreamCreateWithFlags", false);
  if (pStream == nullptr || (flags & ~static_cast<unsigned>(cudaStreamNonBlocking)) != 0) {
    return cuda::fail(cudaErrorInvalidValue);
  }
  const int dev = cuda::current_device();
  auto s = std::make_shared<cuda::stream>(
      dev, (flags & cudaStreamNonBlocking) != 0 ? cuda::stream_kind::non_blocking : cuda::stream_kind::blocking);
  {
    auto& ds = cuda::device(dev);
    std::lock_guard lk(ds.mu);
    ds.others.push_back(s);
  }
  cuda::stream::start(s);
  *pStream = static_cast<cudaStream_t>(cuda::stream_handles().add(std::move(s)));
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* pStream) {
  cuda::enter_api("cudaStreamCreate", false);
  return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  cuda::enter_api("cudaStreamDestroy", false);
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    return cuda::fail(cudaErrorInvalidResourceHandle);
  }
  cudaError_t err = cudaSuccess;
  if (!lookup(stream, "cudaStreamDestroy", &err)) return cuda::fail(err);
  if (auto s = cuda::stream_handles().retire(stream)) s->close();
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  cuda::enter_api("cudaStreamQuery", false);
  cudaError_t err = cudaSuccess;
  auto s = lookup(stream, "cudaStreamQuery", &err);
  if (!s) return cuda::fail(err);
  return s->idle() ? cudaSuccess : cudaErrorNotReady;  // NotReady is not an error: not recorded
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  cuda::enter_api("cudaStreamSynchronize", false);
  cudaError_t err = cudaSuccess;
  auto s = lookup(stream, "cudaStreamSynchronize", &err);
  if (!s) return cuda::fail(err);
  s->wait(s->tail());
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  cuda::enter_api("cudaStreamWaitEvent", false);
  cudaError_t err = cudaSuccess;
  auto s = lookup(stream, "cudaStreamWaitEvent", &err);
  if (!s) return cuda::fail(err);
  auto e = cuda::resolve_event(event, "cudaStreamWaitEvent");
  if (!e) return cuda::fail(cudaErrorInvalidResourceHandle);
  if (flags > 1) return cuda::fail(cudaErrorInvalidValue);  // cudaEventWaitDefault or cudaEventWaitExternal
  std::vector<cuda::wait_point> extra;
  {
    // What the event captured now: a later cudaEventRecord does not change this wait.
    std::lock_guard lk(e->mu);
    if (e->on) extra.push_back({e->on, e->seq});
  }
  cuda::enqueue_with(s, std::move(extra), nullptr);
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  cuda::enter_api("cudaLaunchHostFunc", false);
  cudaError_t err = cudaSuccess;
  auto s = lookup(stream, "cudaLaunchHostFunc", &err);
  if (!s) return cuda::fail(err);
  if (fn == nullptr) return cuda::fail(cudaErrorInvalidValue);
  cuda::enqueue(s, [fn, userData] {
    cuda::set_in_host_function(true);
    fn(userData);
    cuda::set_in_host_function(false);
  });
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  cuda::enter_api("cudaDeviceSynchronize", false);
  cuda::synchronize_device(cuda::current_device());
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  cuda::enter_api("cudaEventCreateWithFlags", false);
  constexpr unsigned known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if (event == nullptr || (flags & ~known) != 0) return cuda::fail(cudaErrorInvalidValue);
  *event = static_cast<cudaEvent_t>(cuda::event_handles().add(std::make_shared<cuda::event>()));
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  cuda::enter_api("cudaEventCreate", false);
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  cuda::enter_api("cudaEventRecord", false);
  auto e = cuda::resolve_event(event, "cudaEventRecord");
  if (!e) return cuda::fail(cudaErrorInvalidResourceHandle);
  cudaError_t err = cudaSuccess;
  auto s = lookup(stream, "cudaEventRecord", &err);
  if (!s) return cuda::fail(err);
  std::lock_guard lk(e->mu);
  e->on = s;
  e->seq = s->tail();
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  cuda::enter_api("cudaEventQuery", false);
  auto e = cuda::resolve_event(event, "cudaEventQuery");
  if (!e) return cuda::fail(cudaErrorInvalidResourceHandle);
  std::lock_guard lk(e->mu);
  return !e->on || e->on->finished(e->seq) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  cuda::enter_api("cudaEventSynchronize", false);
  auto e = cuda::resolve_event(event, "cudaEventSynchronize");
  if (!e) return cuda::fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<cuda::stream> on;
  std::uint64_t seq = 0;
  {
    std::lock_guard lk(e->mu);
    on = e->on;
    seq = e->seq;
  }
  if (on) on->wait(seq);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  cuda::enter_api("cudaEventDestroy", false);
  if (!cuda::resolve_event(event, "cudaEventDestroy")) return cuda::fail(cudaErrorInvalidResourceHandle);
  cuda::event_handles().retire(event);
  return cudaSuccess;
}

}  // extern "C"
