// Memory in the CUDA model: a process-wide table of allocations, so that every pointer can be
// classified (device, pinned host, managed, or plain pageable host memory), and the copy/set calls
// that check the direction they are given against it.
//
// Device memory (cudaMalloc) is an address range reserved PROT_NONE: the caller's thread faults on
// a host dereference, as it would on a real GPU, while the bytes live in a separate 256-byte
// aligned heap buffer that streams reach through locate(). Pinned (cudaMallocHost/cudaHostAlloc)
// and managed (cudaMallocManaged) memory are host-accessible heap buffers, registered.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <shared_mutex>

#pragma GCC visibility push(default)
#include <cuda_runtime_api.h>
#pragma GCC visibility pop

#include "cuda_model.hpp"

namespace nccl_model::cuda {
namespace {

constexpr std::size_t device_alignment = 256;  // cudaMalloc's guarantee
constexpr unsigned char fresh_device_byte = 0xa5;  // fresh device memory is not zero: uninitialised reads show

struct allocation {
  memory_kind kind;
  int device;
  std::size_t bytes;
  std::byte* storage;     // where the bytes are
  std::size_t reserved;   // device memory: length of the PROT_NONE range handed out
};

struct memory_table {
  std::shared_mutex mu;
  std::map<std::uintptr_t, allocation> by_address;  // keyed by the address the caller got
};

memory_table& table() {
  static auto* t = new memory_table();  // never destroyed: streams may copy during exit
  return *t;
}

std::size_t page_round(std::size_t n) {
  static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

std::byte* new_storage(std::size_t bytes) {
  return static_cast<std::byte*>(::operator new(bytes, std::align_val_t{device_alignment}, std::nothrow));
}
void delete_storage(std::byte* p) { ::operator delete(p, std::align_val_t{device_alignment}); }

cudaError_t register_host(void** out, std::size_t bytes, memory_kind kind, const char* api) {
  enter_api(api, false);
  if (out == nullptr) return fail(cudaErrorInvalidValue);
  if (bytes == 0) {
    *out = nullptr;
    return cudaSuccess;
  }
  std::byte* p = new_storage(bytes);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  {
    std::unique_lock lk(table().mu);
    table().by_address.emplace(reinterpret_cast<std::uintptr_t>(p), allocation{kind, current_device(), bytes, p, 0});
  }
  *out = p;
  return cudaSuccess;
}

// Removes the allocation that starts at `p` if its kind is one of `kinds`; false if there is none.
bool unregister(void* p, std::initializer_list<memory_kind> kinds, allocation* out) {
  std::unique_lock lk(table().mu);
  auto it = table().by_address.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == table().by_address.end()) return false;
  bool ok = false;
  for (memory_kind k : kinds) ok = ok || it->second.kind == k;
  if (!ok) return false;
  *out = it->second;
  table().by_address.erase(it);
  return true;
}

bool device_side(memory_kind k) { return k == memory_kind::device || k == memory_kind::managed; }

// Checks one side of a copy: registered memory must hold `count` bytes from `p`.
bool fits(const region& r, std::size_t count) { return r.kind == memory_kind::pageable || r.bytes_left >= count; }

// Whether a copy of direction `kind` may run between these two regions (cudaMemcpyDefault infers).
cudaError_t check_direction(int kind, const region& dst, const region& src) {
  switch (kind) {
    case cudaMemcpyHostToHost:
      return dst.kind == memory_kind::device || src.kind == memory_kind::device ? cudaErrorInvalidValue : cudaSuccess;
    case cudaMemcpyHostToDevice:
      return device_side(dst.kind) && src.kind != memory_kind::device ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost:
      return device_side(src.kind) && dst.kind != memory_kind::device ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice:
      return device_side(dst.kind) && device_side(src.kind) ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDefault:
      return cudaSuccess;
  }
  return cudaErrorInvalidMemcpyDirection;
}

cudaError_t copy(void* dst, const void* src, std::size_t count, int kind, cudaStream_t s, bool wait,
                 const char* api) {
  enter_api(api, false);
  if (count == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue);
  const region d = locate(dst);
  const region r = locate(src);
  if (const cudaError_t e = check_direction(kind, d, r); e != cudaSuccess) return fail(e);
  if (!fits(d, count) || !fits(r, count)) return fail(cudaErrorInvalidValue);
  cudaError_t err = cudaSuccess;
  auto st = resolve_stream(s, current_device(), api, &err);
  if (!st) return fail(err);
  std::byte* to = d.host;
  const std::byte* from = r.host;
  const std::uint64_t seq = enqueue(st, [to, from, count] { std::memmove(to, from, count); });
  if (wait) wait_for(st, seq);
  return cudaSuccess;
}

cudaError_t set(void* dst, int value, std::size_t count, cudaStream_t s, bool wait, const char* api) {
  enter_api(api, false);
  if (count == 0) return cudaSuccess;
  const region d = locate(dst);
  if (d.kind == memory_kind::pageable || !fits(d, count)) return fail(cudaErrorInvalidValue);
  cudaError_t err = cudaSuccess;
  auto st = resolve_stream(s, current_device(), api, &err);
  if (!st) return fail(err);
  std::byte* to = d.host;
  const std::uint64_t seq = enqueue(st, [to, value, count] { std::memset(to, value, count); });
  if (wait) wait_for(st, seq);
  return cudaSuccess;
}

}  // namespace

region locate(const void* p) noexcept {
  const auto key = reinterpret_cast<std::uintptr_t>(p);
  std::shared_lock lk(table().mu);
  auto& m = table().by_address;
  auto it = m.upper_bound(key);
  if (it != m.begin()) {
    --it;
    const allocation& a = it->second;
    const std::size_t off = key - it->first;
    if (off < a.bytes) return region{a.kind, a.device, a.storage + off, a.bytes - off};
  }
  return region{memory_kind::pageable, -1, static_cast<std::byte*>(const_cast<void*>(p)), SIZE_MAX};
}

}  // namespace nccl_model::cuda

namespace cuda = nccl_model::cuda;
using cuda::memory_kind;

extern "C" {

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  cuda::enter_api("cudaMalloc", false);
  if (devPtr == nullptr) return cuda::fail(cudaErrorInvalidValue);
  if (size == 0) {
    *devPtr = nullptr;
    return cudaSuccess;
  }
  const std::size_t reserved = cuda::page_round(size);
  void* view = ::mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (view == MAP_FAILED) return cuda::fail(cudaErrorMemoryAllocation);
  std::byte* storage = cuda::new_storage(size);
  if (storage == nullptr) {
    ::munmap(view, reserved);
    return cuda::fail(cudaErrorMemoryAllocation);
  }
  std::memset(storage, cuda::fresh_device_byte, size);
  {
    std::unique_lock lk(cuda::table().mu);
    cuda::table().by_address.emplace(reinterpret_cast<std::uintptr_t>(view),
                                     cuda::allocation{memory_kind::device, cuda::current_device(), size, storage, reserved});
  }
  *devPtr = view;
  return cudaSuccess;
}

cudaError_t cudaFree(void* devPtr) {
  cuda::enter_api("cudaFree", false);
  if (devPtr == nullptr) return cudaSuccess;  // "If devPtr is 0, no operation is performed"
  cuda::region r = cuda::locate(devPtr);
  if (r.kind != memory_kind::device && r.kind != memory_kind::managed) return cuda::fail(cudaErrorInvalidValue);
  // cudaFree synchronises the device first (CUDA Runtime API, "API synchronization behavior"):
  // behind a kernel that never ends, it never returns.
  cuda::synchronize_device(r.device);
  cuda::allocation a{};
  if (!cuda::unregister(devPtr, {memory_kind::device, memory_kind::managed}, &a)) {
    return cuda::fail(cudaErrorInvalidValue);  // not the start of an allocation, or freed meanwhile
  }
  if (a.reserved != 0) ::munmap(devPtr, a.reserved);
  cuda::delete_storage(a.storage);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  return cuda::register_host(ptr, size, memory_kind::pinned, "cudaMallocHost");
}

cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  constexpr unsigned known = cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined;
  if ((flags & ~known) != 0) {
    cuda::enter_api("cudaHostAlloc", false);
    return cuda::fail(cudaErrorInvalidValue);
  }
  return cuda::register_host(pHost, size, memory_kind::pinned, "cudaHostAlloc");
}

cudaError_t cudaMallocManaged(void** devPtr, size_t size, unsigned int flags) {
  if (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost) {
    cuda::enter_api("cudaMallocManaged", false);
    return cuda::fail(cudaErrorInvalidValue);
  }
  return cuda::register_host(devPtr, size, memory_kind::managed, "cudaMallocManaged");
}

cudaError_t cudaFreeHost(void* ptr) {
  cuda::enter_api("cudaFreeHost", false);
  if (ptr == nullptr) return cudaSuccess;
  cuda::allocation a{};
  if (!cuda::unregister(ptr, {memory_kind::pinned}, &a)) return cuda::fail(cudaErrorInvalidValue);
  cuda::delete_storage(a.storage);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attributes, const void* ptr) {
  cuda::enter_api("cudaPointerGetAttributes", false);
  if (attributes == nullptr) return cuda::fail(cudaErrorInvalidValue);
  *attributes = cudaPointerAttributes{};
  const cuda::region r = cuda::locate(ptr);
  attributes->device = r.device;
  void* p = const_cast<void*>(ptr);
  switch (r.kind) {
    case memory_kind::pageable: attributes->type = cudaMemoryTypeUnregistered; break;
    case memory_kind::device:
      attributes->type = cudaMemoryTypeDevice;
      attributes->devicePointer = p;
      break;
    case memory_kind::pinned:
      attributes->type = cudaMemoryTypeHost;
      attributes->devicePointer = p;  // mapped (UVA): the same address on the device
      attributes->hostPointer = p;
      break;
    case memory_kind::managed:
      attributes->type = cudaMemoryTypeManaged;
      attributes->devicePointer = p;
      attributes->hostPointer = p;
      break;
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
  int k = 0;
  std::memcpy(&k, &kind, sizeof k);  // a direction outside the enumeration is checked, not loaded
  return cuda::copy(dst, src, count, k, stream, false, "cudaMemcpyAsync");
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  // On the legacy stream, and waits for it (and, through it, for the blocking streams).
  int k = 0;
  std::memcpy(&k, &kind, sizeof k);
  return cuda::copy(dst, src, count, k, nullptr, true, "cudaMemcpy");
}

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  return cuda::set(devPtr, value, count, stream, false, "cudaMemsetAsync");
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  return cuda::set(devPtr, value, count, nullptr, true, "cudaMemset");
}

}  // extern "C"
