#include "communicator.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "cuda_model.hpp"
#include "faults.hpp"
#include "settings.hpp"
#include "util.hpp"

namespace nccl_model {

using namespace std::chrono_literals;

std::string communicator::describe() const {
  return strprintf("communicator %p (rank %d of %d, device %d, pid %d)", static_cast<void*>(handle), rank, nranks,
                   device, static_cast<int>(::getpid()));
}

void communicator::warn(const std::string& text) {
  last_error.set(text);
  nccl_model::warn(text);
}

void communicator::set_proxy_error(ncclResult_t r, const std::string& text) {
  std::lock_guard lk(proxy_mu_);
  if (proxy_error.load(std::memory_order_acquire) != ncclSuccess) return;  // the first failure stays
  warn(text);  // the text first: whoever sees the error must find its text
  proxy_error.store(r, std::memory_order_release);
}

ncclResult_t communicator::state() const noexcept {
  const ncclResult_t a = async.load(std::memory_order_acquire);
  return a != ncclSuccess ? a : proxy_error.load(std::memory_order_acquire);
}

ncclResult_t communicator::ensure_ready(const char* op) {
  const ncclResult_t r = state();
  if (r == ncclInProgress) {
    warn(strprintf("%s: Attempt to use communicator before the previous operation returned ncclSuccess", op));
    return ncclInvalidArgument;
  }
  return r;
}

void communicator::defer_launch(std::shared_ptr<cuda::stream> s, std::function<void()> work) {
  {
    std::lock_guard lk(launch_mu_);
    launches_.push_back({std::move(s), std::move(work)});
  }
  launch_pending.store(true, std::memory_order_release);
  async.store(ncclInProgress, std::memory_order_release);
}

void communicator::complete_launch() {
  std::vector<held_kernel> now;
  {
    std::lock_guard lk(launch_mu_);
    if (!launch_pending.exchange(false)) return;
    now.swap(launches_);
  }
  for (auto& k : now) cuda::enqueue(k.stream, std::move(k.work));
  ncclResult_t expected = ncclInProgress;
  async.compare_exchange_strong(expected, ncclSuccess, std::memory_order_acq_rel);
}

std::uint64_t communicator::take_ticket() {
  std::lock_guard lk(kmu_);
  ++outstanding_;
  return next_ticket_++;
}

bool communicator::kernel_must_stop(std::uint64_t ticket) const noexcept {
  return aborted.load(std::memory_order_acquire) || revoked.load(std::memory_order_acquire) ||
         ticket < cancel_below_.load(std::memory_order_acquire);
}

bool communicator::kernel_begin(std::uint64_t ticket) {
  std::unique_lock lk(kmu_);
  for (;;) {
    if (kernel_must_stop(ticket)) return false;
    if (next_to_run_ == ticket) {
      ++running_;
      return true;
    }
    kcv_.wait_for(lk, 1ms);
  }
}

void communicator::kernel_done(std::uint64_t ticket, bool ran) {
  {
    std::lock_guard lk(kmu_);
    if (ran) {
      --running_;
      next_to_run_ = std::max(next_to_run_, ticket + 1);
    }
    --outstanding_;
  }
  kcv_.notify_all();
}

int communicator::outstanding_kernels() {
  std::lock_guard lk(kmu_);
  return outstanding_;
}

void communicator::cancel_kernels() {
  std::unique_lock lk(kmu_);
  cancel_below_.store(next_ticket_, std::memory_order_release);
  next_to_run_ = std::max(next_to_run_, next_ticket_);
  kcv_.notify_all();
  while (running_ > 0) kcv_.wait_for(lk, 1ms);  // a running kernel notices within a millisecond
}

bool communicator::wait_kernels_drained(const std::function<bool()>& give_up) {
  std::unique_lock lk(kmu_);
  while (outstanding_ > 0) {
    if (give_up()) return false;
    kcv_.wait_for(lk, 1ms);
  }
  return true;
}

void communicator::start_job(std::function<void()> job, std::shared_ptr<communicator> also) {
  auto count = [](communicator& c, int delta) {
    {
      std::lock_guard lk(c.jmu_);
      c.jobs_ += delta;
    }
    c.jcv_.notify_all();
  };
  count(*this, 1);
  if (also) count(*also, 1);
  // Detached, like NCCL's async job threads; the communicators stay alive while the job runs.
  std::thread([self = shared_from_this(), also = std::move(also), job = std::move(job), count]() mutable {
    cuda::mark_internal_thread();
    {
      std::lock_guard turn(self->job_turn_);
      job();
      job = nullptr;
    }
    if (also) count(*also, -1);
    count(*self, -1);
  }).detach();
}

void communicator::wait_job() {
  std::unique_lock lk(jmu_);
  jcv_.wait(lk, [&] { return jobs_ == 0; });
}

bool communicator::must_stop() const noexcept {
  if (aborted.load(std::memory_order_acquire)) return true;
  const auto p = parent.lock();
  return p && p->aborted.load(std::memory_order_acquire);
}

net::stop_fn communicator::stopper() {
  return [self = shared_from_this()] { return self->must_stop(); };
}

void communicator::close_transport() {
  to_succ.reset();
  from_pred.reset();
  mailbox.close();
}

namespace {
handle_table<communicator>& comms() {
  static auto* t = new handle_table<communicator>();
  return *t;
}
}  // namespace

std::shared_ptr<communicator> find_comm(ncclComm_t h, handle_status* status) { return comms().find(h, status); }

ncclComm_t register_comm(const std::shared_ptr<communicator>& c) {
  c->handle = static_cast<ncclComm_t>(comms().add(c));
  return c->handle;
}

void retire_comm(ncclComm_t h) { comms().retire(h); }

int live_comms() { return comms().live_count(); }

boot::peer_info my_info(const communicator& c) {
  boot::peer_info p;
  p.rank = c.rank;
  p.device = c.device;
  p.version = settings::get().version;
  p.pid = static_cast<std::int32_t>(::getpid());
  p.listen_port = c.mailbox.port();
  std::snprintf(p.host, sizeof p.host, "%s", settings::get().host.c_str());
  return p;
}

ncclResult_t check_peers(const std::vector<boot::peer_info>& peers, int me, std::string* why) {
  for (const auto& p : peers) {
    if (p.version != peers.front().version) {
      *why = strprintf("Mismatched NCCL version detected : rank %d version %d rank %d version %d", p.rank, p.version,
                       peers.front().rank, peers.front().version);
      return ncclInvalidUsage;
    }
  }
  std::map<std::pair<std::string, int>, std::vector<int>> by_gpu;
  for (const auto& p : peers) by_gpu[{std::string(p.host, strnlen(p.host, sizeof p.host)), p.device}].push_back(p.rank);
  const settings& s = settings::get();
  for (const auto& [gpu, ranks] : by_gpu) {
    if (ranks.size() < 2) continue;
    // This rank first if it is one of them (NCCL 2.28 prints "rank <self> and rank <other>").
    const bool mine = std::find(ranks.begin(), ranks.end(), me) != ranks.end();
    const int a = mine ? me : ranks[0];
    const int b = mine ? (ranks[0] == me ? ranks[1] : ranks[0]) : ranks[1];
    const int dev = gpu.second;
    if (s.version < version_code(2, 30, 3)) {
      *why = strprintf("Duplicate GPU detected : rank %d and rank %d both on CUDA device %d", a, b, dev);
      return ncclInvalidUsage;
    }
    if (!s.multi_rank_gpu) {
      *why = strprintf("Multiple Ranks are using the same GPU/Partition (rank %d and rank %d both on CUDA device %d). "
                       "Set NCCL_MULTI_RANK_GPU_ENABLE=1 to enable this configuration.", a, b, dev);
      return ncclInvalidUsage;
    }
    if (ranks.size() > 2) {
      *why = strprintf("%zu ranks share CUDA device %d on host %s: NCCL_MULTI_RANK_GPU_ENABLE supports up to 2 ranks "
                       "per GPU with the default configuration, beyond that NCCL may exhaust the GPU and hang",
                       ranks.size(), dev, gpu.first.c_str());
      return ncclInvalidUsage;
    }
  }
  return ncclSuccess;
}

void hold_init_delay(const communicator& c, std::chrono::steady_clock::time_point started) {
  const auto until = started + faults::get().init_delay;
  while (std::chrono::steady_clock::now() < until && !c.must_stop()) std::this_thread::sleep_for(1ms);
}

bool frees_with_device_sync() { return settings::get().version < version_code(2, 28, 0); }

}  // namespace nccl_model
