// Scenarios in which each probe is one rank of a communicator spread over several processes.
#include <cstring>
#include <vector>

#include "probe.hpp"

namespace probe {
namespace {

struct type_info {
  ncclDataType_t type;
  const char* name;
  std::size_t size;
};
constexpr type_info types[] = {
    {ncclInt8, "int8", 1},         {ncclUint8, "uint8", 1},       {ncclInt32, "int32", 4},
    {ncclUint32, "uint32", 4},     {ncclInt64, "int64", 8},       {ncclUint64, "uint64", 8},
    {ncclFloat16, "float16", 2},   {ncclBfloat16, "bfloat16", 2}, {ncclFloat32, "float32", 4},
    {ncclFloat64, "float64", 8},   {ncclFloat8e4m3, "fp8e4m3", 1}, {ncclFloat8e5m2, "fp8e5m2", 1}};
constexpr ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
constexpr const char* op_names[] = {"sum", "prod", "max", "min", "avg"};
constexpr std::size_t count = 37;

long long int_value(int rank, std::size_t i) { return static_cast<long long>((rank * 37 + i * 11) % 23) - 11; }

// Rank `rank`'s input of type `t`: finite values of mixed sign and magnitude.
std::vector<unsigned char> input(const type_info& t, int rank) {
  std::vector<unsigned char> out(count * t.size);
  for (std::size_t i = 0; i < count; ++i) {
    unsigned char* p = out.data() + i * t.size;
    const unsigned sign = static_cast<unsigned>((i + static_cast<std::size_t>(rank)) % 2);
    const unsigned r = static_cast<unsigned>(rank);
    const auto u = static_cast<unsigned>(i);
    auto put = [&](auto v) { std::memcpy(p, &v, sizeof v); };
    switch (t.type) {
      case ncclInt8: put(static_cast<std::int8_t>(int_value(rank, i))); break;
      case ncclUint8: put(static_cast<std::uint8_t>(int_value(rank, i) + 11)); break;
      case ncclInt32: put(static_cast<std::int32_t>(int_value(rank, i))); break;
      case ncclUint32: put(static_cast<std::uint32_t>(int_value(rank, i) + 11)); break;
      case ncclInt64: put(static_cast<std::int64_t>(int_value(rank, i) * 1000003)); break;
      case ncclUint64: put(static_cast<std::uint64_t>(int_value(rank, i) + 11)); break;
      case ncclFloat32: put(static_cast<float>((static_cast<int>((r * 7 + u * 13) % 17) - 8) * 0.37 + rank * 1e-3)); break;
      case ncclFloat64: put((static_cast<int>((r * 7 + u * 13) % 17) - 8) * 0.37 + rank * 1e-3); break;
      case ncclFloat16: put(static_cast<std::uint16_t>(sign << 15 | ((r + u) % 5 + 13) << 10 | ((r * 131 + u * 17) & 0x3ff))); break;
      case ncclBfloat16: put(static_cast<std::uint16_t>(sign << 15 | ((r + u) % 5 + 125) << 7 | ((r * 131 + u * 17) & 0x7f))); break;
      case ncclFloat8e4m3: put(static_cast<std::uint8_t>(sign << 7 | ((r + u) % 6 + 4) << 3 | ((r * 3 + u) & 7))); break;
      case ncclFloat8e5m2: put(static_cast<std::uint8_t>(sign << 7 | ((r + u) % 5 + 13) << 2 | ((r + u) & 3))); break;
      default: break;
    }
  }
  return out;
}

struct device_buffer {
  void* p = nullptr;
  explicit device_buffer(std::size_t bytes) { check_cuda(cudaMalloc(&p, bytes), "cudaMalloc"); }
  ~device_buffer() { cudaFree(p); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
};

// Waits until the collective just issued on `c` has run on `s`: first the communicator leaves
// ncclInProgress (until then the kernel may not be on the stream at all: a non-blocking NCCL
// launches it from a thread of its own), then the stream drains; an error ends the probe.
void finish(ncclComm_t c, cudaStream_t s, const char* what) {
  const auto until = std::chrono::steady_clock::now() + 20s;
  for (;;) {
    ncclResult_t st = ncclSuccess;
    ncclCommGetAsyncError(c, &st);
    if (st != ncclSuccess && st != ncclInProgress) fail(std::string(what) + ": " + ncclGetLastError(c));
    if (st == ncclSuccess && cudaStreamQuery(s) == cudaSuccess) return;
    if (std::chrono::steady_clock::now() >= until) fail(std::string(what) + " did not finish");
    std::this_thread::sleep_for(1ms);
  }
}

// An int32 sum of "rank + 1" over the communicator: every rank checks the total.
void sum_of_ranks(ncclComm_t c, cudaStream_t s, int expected, const char* label) {
  std::vector<std::int32_t> host(8, 0);
  int rank = -1;
  ncclCommUserRank(c, &rank);
  std::vector<std::int32_t> mine(8, rank + 1);
  device_buffer d(sizeof(std::int32_t) * 8);
  check_cuda(cudaMemcpy(d.p, mine.data(), 32, cudaMemcpyHostToDevice), "cudaMemcpy");
  if (const ncclResult_t r = ncclAllReduce(d.p, d.p, 8, ncclInt32, ncclSum, c, s); !enqueued(r)) {
    fail(std::string(label) + ": ncclAllReduce: " + ncclGetErrorString(r));
  }
  finish(c, s, label);
  check_cuda(cudaMemcpy(host.data(), d.p, 32, cudaMemcpyDeviceToHost), "cudaMemcpy");
  say("%s %s", label, host[0] == expected && host[7] == expected ? "ok" : "bad");
}

void all_types(ncclComm_t c, cudaStream_t s, int rank) {
  device_buffer send(count * 8);
  device_buffer recv(count * 8);
  std::vector<unsigned char> out(count * 8);
  for (const type_info& t : types) {
    const auto in = input(t, rank);
    check_cuda(cudaMemcpy(send.p, in.data(), in.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
    for (std::size_t o = 0; o < std::size(ops); ++o) {
      if (!enqueued(ncclAllReduce(send.p, recv.p, count, t.type, ops[o], c, s))) fail("ncclAllReduce");
      finish(c, s, "allreduce");
      check_cuda(cudaMemcpy(out.data(), recv.p, in.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
      say("allreduce %s %s %016llx", t.name, op_names[o], static_cast<unsigned long long>(digest(out.data(), in.size())));
    }
  }
}

// Exact results where the arithmetic is exact: int32 sum, and avg truncating toward zero.
void int32_checks(ncclComm_t c, cudaStream_t s, int rank, int nranks) {
  device_buffer buf(count * 4);
  std::vector<std::int32_t> host(count);
  for (ncclRedOp_t op : {ncclSum, ncclAvg}) {
    for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<std::int32_t>(int_value(rank, i));
    check_cuda(cudaMemcpy(buf.p, host.data(), count * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    if (!enqueued(ncclAllReduce(buf.p, buf.p, count, ncclInt32, op, c, s))) fail("ncclAllReduce in place");
    finish(c, s, "allreduce");
    check_cuda(cudaMemcpy(host.data(), buf.p, count * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
    bool ok = true;
    for (std::size_t i = 0; i < count; ++i) {
      long long sum = 0;
      for (int r = 0; r < nranks; ++r) sum += int_value(r, i);
      ok = ok && host[i] == (op == ncclSum ? sum : sum / nranks);
    }
    say("check int32 %s %s", op == ncclSum ? "sum" : "avg", ok ? "ok" : "bad");
  }
}

void broadcast_and_gather(ncclComm_t c, cudaStream_t s, int rank, int nranks) {
  const int root = nranks - 1;
  std::vector<unsigned char> pattern(1000);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<unsigned char>(i * 7 + static_cast<std::size_t>(root));
  device_buffer b(pattern.size());
  std::vector<unsigned char> host(pattern.size(), 0);
  if (rank == root) check_cuda(cudaMemcpy(b.p, pattern.data(), pattern.size(), cudaMemcpyHostToDevice), "cudaMemcpy");
  if (!enqueued(ncclBroadcast(b.p, b.p, pattern.size(), ncclUint8, root, c, s))) fail("ncclBroadcast");
  finish(c, s, "broadcast");
  check_cuda(cudaMemcpy(host.data(), b.p, host.size(), cudaMemcpyDeviceToHost), "cudaMemcpy");
  say("broadcast %016llx", static_cast<unsigned long long>(digest(host.data(), host.size())));
  say("check broadcast %s", host == pattern ? "ok" : "bad");

  constexpr std::size_t per = 16;
  std::vector<float> mine(per);
  for (std::size_t i = 0; i < per; ++i) mine[i] = static_cast<float>(rank * 100) + static_cast<float>(i);
  device_buffer send(per * 4);
  device_buffer recv(per * 4 * static_cast<std::size_t>(nranks));
  check_cuda(cudaMemcpy(send.p, mine.data(), per * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
  if (!enqueued(ncclAllGather(send.p, recv.p, per, ncclFloat32, c, s))) fail("ncclAllGather");
  finish(c, s, "allgather");
  std::vector<float> all(per * static_cast<std::size_t>(nranks));
  check_cuda(cudaMemcpy(all.data(), recv.p, all.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
  bool ok = true;
  for (std::size_t i = 0; i < all.size(); ++i) ok = ok && all[i] == static_cast<float>((i / per) * 100 + i % per);
  say("allgather %016llx", static_cast<unsigned long long>(digest(all.data(), all.size() * 4)));
  say("check allgather %s", ok ? "ok" : "bad");
}

int collectives(const args& a) {
  const int rank = a.num("rank"), nranks = a.num("nranks");
  check_cuda(cudaSetDevice(a.num("device")), "cudaSetDevice");
  ncclComm_t c = init(id_from_hex(a.text("id")), nranks, rank);
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  all_types(c, s, rank);
  int32_checks(c, s, rank, nranks);
  broadcast_and_gather(c, s, rank, nranks);
  if (const ncclResult_t f = ncclCommFinalize(c); f != ncclSuccess && f != ncclInProgress) fail("ncclCommFinalize");
  if (wait_ready(c) != ncclSuccess || ncclCommDestroy(c) != ncclSuccess) fail("finalize/destroy");
  cudaStreamDestroy(s);
  say("done");
  return 0;
}

// Four ranks, one killed; the survivors shrink without it.
int shrink(const args& a) {
  const int rank = a.num("rank"), nranks = a.num("nranks"), victim = a.num("victim");
  check_cuda(cudaSetDevice(a.num("device")), "cudaSetDevice");
  ncclComm_t c = init(id_from_hex(a.text("id")), nranks, rank);
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  sum_of_ranks(c, s, nranks * (nranks + 1) / 2, "parent-allreduce");
  say("ready");
  wait_for_test();  // the victim never gets past this: the test kills it
  int exclude[1] = {victim};
  const auto sentinel = reinterpret_cast<ncclComm_t>(&exclude);
  ncclComm_t child = sentinel;
  const ncclResult_t rc = ncclCommShrink(c, exclude, 1, &child, nullptr, NCCL_SHRINK_DEFAULT);
  ncclResult_t parent = ncclSuccess;
  ncclCommGetAsyncError(c, &parent);
  const ncclComm_t now = load_comm(&child);
  say("shrink rc=%d newcomm=%s parent=%d", rc, now == nullptr ? "null" : now == sentinel ? "untouched" : "set", parent);
  parent = wait_ready(c);
  ncclComm_t nc = load_comm(&child);
  say("parent-ready state=%d newcomm=%s", parent, nc == nullptr ? "null" : nc == sentinel ? "untouched" : "set");
  if (nc == nullptr || nc == sentinel) fail("no child");
  int r = -1, n = -1;
  ncclCommUserRank(nc, &r);
  ncclCommCount(nc, &n);
  say("child rank=%d count=%d", r, n);
  sum_of_ranks(nc, s, n * (n + 1) / 2, "child-allreduce");
  ncclCommAbort(nc);
  ncclCommAbort(c);
  cudaStreamDestroy(s);
  say("done");
  return 0;
}

// Survivors that disagree on the exclude list ("exclude=3" or "exclude=0,3"); rank `idle` takes
// no part. Each survivor says what its parent's state became within `wait_ms`.
int shrink_mismatch(const args& a) {
  const int rank = a.num("rank"), nranks = a.num("nranks");
  check_cuda(cudaSetDevice(a.num("device")), "cudaSetDevice");
  ncclComm_t c = init(id_from_hex(a.text("id")), nranks, rank);
  say("ready");
  if (rank == a.num("idle", nranks - 1)) {
    wait_for_test();
    return 0;
  }
  std::vector<int> exclude;
  for (const std::string& e : {a.text("exclude")}) {
    std::size_t at = 0;
    while (at < e.size()) {
      const std::size_t comma = e.find(',', at);
      exclude.push_back(std::atoi(e.substr(at, comma - at).c_str()));
      at = comma == std::string::npos ? e.size() : comma + 1;
    }
  }
  ncclComm_t child = nullptr;
  const ncclResult_t rc = ncclCommShrink(c, exclude.data(), static_cast<int>(exclude.size()), &child, nullptr, 0);
  const ncclResult_t st = wait_ready(c, std::chrono::milliseconds(a.num("wait_ms", 3000)));
  say("shrink rc=%d parent=%d newcomm=%s error=%s", rc, st, load_comm(&child) ? "set" : "null",
      st == ncclInProgress ? "" : ncclGetLastError(c));
  ncclCommAbort(c);
  if (ncclComm_t nc = load_comm(&child)) ncclCommAbort(nc);  // stopped by the abort: NCCL publishes it
  say("done");
  return 0;
}

// Two ranks; the test kills rank 1 while rank 0's second allreduce waits for it.
int peer_death(const args& a) {
  const int rank = a.num("rank"), nranks = a.num("nranks"), victim = a.num("victim", 1);
  const bool net = a.text("mode") == "net";
  check_cuda(cudaSetDevice(a.num("device")), "cudaSetDevice");
  ncclComm_t c = init(id_from_hex(a.text("id")), nranks, rank);
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  sum_of_ranks(c, s, nranks * (nranks + 1) / 2, "first-allreduce");
  say("ready");
  if (rank == victim) {
    wait_for_test();
    return 0;
  }
  device_buffer d(64);
  const ncclResult_t second = ncclAllReduce(d.p, d.p, 16, ncclFloat32, ncclSum, c, s);
  const ncclResult_t launched = wait_ready(c);  // the kernel is on the stream (and waits for rank 1)
  if (enqueued(second) && launched == ncclSuccess) {
    say("enqueued");
  } else {
    say("enqueue failed rc=%d state=%d", second, launched);
  }
  wait_for_test();  // "killed"
  ncclResult_t st = ncclSuccess;
  if (!net) {
    std::this_thread::sleep_for(300ms);
    ncclCommGetAsyncError(c, &st);
    say("after-kill state=%d stream=%d", st, cudaStreamQuery(s));
  } else {
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (ncclCommGetAsyncError(c, &st) == ncclSuccess && st == ncclSuccess && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(1ms);
    }
    say("after-kill state=%d stream=%d error=%s", st, cudaStreamQuery(s), ncclGetLastError(c));
    int exclude[1] = {victim};
    const auto sentinel = reinterpret_cast<ncclComm_t>(&exclude);
    ncclComm_t child = sentinel;
    const ncclResult_t rc = ncclCommShrink(c, exclude, 1, &child, nullptr, NCCL_SHRINK_ABORT);
    const ncclComm_t now = load_comm(&child);
    say("shrink rc=%d newcomm=%s", rc, now == nullptr ? "null" : now == sentinel ? "untouched" : "set");
    say("stream-after-shrink-abort=%d", wait_stream(s, 5s) ? 1 : 0);
  }
  if (symbol<revoke_fn>("ncclCommRevoke") != nullptr) {  // NCCL 2.28.7 and later
    const ncclResult_t rc = revoke(c);
    st = wait_ready(c, 5s);
    say("revoke rc=%d state=%d stream-done=%d", rc, st, wait_stream(s, 5s) ? 1 : 0);
    say("allreduce-after-revoke rc=%d", ncclAllReduce(d.p, d.p, 16, ncclFloat32, ncclSum, c, s));
  } else {
    say("no ncclCommRevoke in this libnccl");
  }
  ncclCommAbort(c);
  cudaStreamDestroy(s);
  say("done");
  return 0;
}

// Two existing ranks and one new: 2 -> 3.
int grow(const args& a) {
  auto get_id = symbol<grow_id_fn>("ncclCommGetUniqueId");
  auto grow_comm = symbol<grow_fn>("ncclCommGrow");
  if (get_id == nullptr || grow_comm == nullptr) fail("this libnccl has no ncclCommGrow");
  const int rank = a.num("rank"), size = a.num("size");
  check_cuda(cudaSetDevice(a.num("device")), "cudaSetDevice");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t parent = nullptr;
  ncclComm_t nc = nullptr;
  ncclResult_t rc = ncclSuccess;
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  if (a.text("role") == "new") {
    const ncclUniqueId gid = id_from_hex(a.text("growid"));
    rc = grow_comm(nullptr, size, &gid, rank, &nc, &config);
    say("grow rc=%d newcomm=%s", rc, load_comm(&nc) ? "set" : "null");
  } else {
    parent = init(id_from_hex(a.text("id")), a.num("nranks"), rank);
    sum_of_ranks(parent, s, a.num("nranks") * (a.num("nranks") + 1) / 2, "parent-allreduce");
    ncclUniqueId gid;
    const bool coordinator = rank == 0;
    if (coordinator) {
      rc = get_id(parent, &gid);
      say("growid rc=%d hex=%s", rc, hex(&gid, sizeof gid).c_str());
      ncclUniqueId again;
      say("growid-again rc=%d", get_id(parent, &again));
    }
    rc = grow_comm(parent, size, coordinator ? &gid : nullptr, -1, &nc, &config);
    ncclResult_t ps = ncclSuccess, cs = ncclSuccess;
    ncclCommGetAsyncError(parent, &ps);
    if (load_comm(&nc)) ncclCommGetAsyncError(load_comm(&nc), &cs);
    say("grow rc=%d newcomm=%s parent=%d child=%d", rc, load_comm(&nc) ? "set" : "null", ps, cs);
  }
  if (nc == nullptr) fail("no grown communicator");
  say("grown state=%d", wait_ready(nc));
  if (parent && wait_ready(parent) != ncclSuccess) fail("parent did not come back");
  int r = -1, n = -1;
  ncclCommUserRank(nc, &r);
  ncclCommCount(nc, &n);
  say("grown rank=%d count=%d", r, n);
  sum_of_ranks(nc, s, n * (n + 1) / 2, "grown-allreduce");
  ncclCommAbort(nc);
  if (parent) say("parent-destroy rc=%d", ncclCommDestroy(parent));
  cudaStreamDestroy(s);
  say("done");
  return 0;
}

// Init only: what the state and the last error say (a duplicate GPU, say).
int init_only(const args& a) {
  check_cuda(cudaSetDevice(a.num("device")), "cudaSetDevice");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t c = nullptr;
  const ncclResult_t rc = ncclCommInitRankConfig(&c, a.num("nranks"), id_from_hex(a.text("id")), a.num("rank"), &config);
  const ncclResult_t st = c ? wait_ready(c) : rc;
  say("init rc=%d state=%d error=%s", rc, st, c ? ncclGetLastError(c) : "");
  if (c) ncclCommAbort(c);
  say("done");
  return 0;
}

}  // namespace

int run_ranks(const std::string& scenario, const args& a) {
  if (scenario == "collectives") return collectives(a);
  if (scenario == "shrink") return shrink(a);
  if (scenario == "shrink-mismatch") return shrink_mismatch(a);
  if (scenario == "peer-death") return peer_death(a);
  if (scenario == "grow") return grow(a);
  if (scenario == "init") return init_only(a);
  if (scenario == "make-id") {  // an id made in this process; the root lives until this probe exits
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) fail("ncclGetUniqueId");
    say("id %s", hex(&id, sizeof id).c_str());
    wait_for_test();
    return 0;
  }
  return -1;
}

}  // namespace probe
