// ncclCommGetUniqueId + ncclCommGrow in the NCCL model (src/init.cc ncclCommGetUniqueId,
// ncclCommGrow; src/bootstrap.cc bootstrapGetUniqueId, bcastGrowHandle at v2.30.7-1).
//
// The coordinator (any existing rank) makes a grow id: a root in its process for the grown
// communicator, with magic hashCombine(parent magic, childCount + 1). It hands the id to the other
// existing ranks over their listeners (NCCL sends it to ranks 0 and N-1 only, and the middle ranks
// learn their neighbours through the parent's bootstrap; the model gives it to every existing rank
// and lets all of them check in at the root: the calls and what they return are the same). New
// ranks get the id out of band. Existing ranks keep their ranks; *newcomm is set at once, in
// progress, and the parent is in progress until the grown communicator is built.
#include <cstring>

#include "cuda_model.hpp"
#include "operations.hpp"
#include "util.hpp"

namespace nccl_model {
namespace {

using namespace std::chrono_literals;

constexpr int id_ints = NCCL_UNIQUE_ID_BYTES / sizeof(std::int32_t);

std::vector<std::int32_t> id_to_ints(const ncclUniqueId& id) {
  std::vector<std::int32_t> v(id_ints);
  std::memcpy(v.data(), id.internal, NCCL_UNIQUE_ID_BYTES);
  return v;
}

// An existing rank that was not given the id waits for the coordinator's (bcastGrowHandle).
ncclResult_t receive_grow_id(communicator& parent, std::uint64_t expected_magic, boot::id_payload& out,
                             const net::stop_fn& stop, std::string* why) {
  net::fd conn;
  boot::hello h;
  std::vector<std::int32_t> extra;
  const boot::outcome o = parent.mailbox.accept(
      [&](const boot::hello& x) {
        return x.kind == boot::hello_kind::grow_handle && x.magic == parent.magic && x.extra_ints == id_ints;
      },
      conn, h, extra, stop);
  if (o != boot::outcome::ok) return ncclInternalError;
  ncclUniqueId id;
  std::memcpy(id.internal, extra.data(), NCCL_UNIQUE_ID_BYTES);
  if (!boot::decode(id, out) || out.magic != expected_magic) {
    *why = strprintf("ncclCommGrow: magic mismatch computed by the root, got %llx expected %llx",
                     static_cast<unsigned long long>(out.magic), static_cast<unsigned long long>(expected_magic));
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

void run_grow(const std::shared_ptr<communicator>& parent, const std::shared_ptr<communicator>& child, bool have_id,
              boot::id_payload id) {
  const auto started = std::chrono::steady_clock::now();
  const net::stop_fn stop = [&] { return child->must_stop(); };
  std::string why = "ncclCommGrow: stopped by ncclCommAbort before it completed";
  ncclResult_t r = ncclSuccess;
  if (!have_id) r = receive_grow_id(*parent, child->magic, id, stop, &why);
  std::vector<boot::peer_info> table;
  boot::outcome o = boot::outcome::ok;
  if (r == ncclSuccess) o = boot::check_in(id, child->nranks, child->rank, my_info(*child), table, stop, &why);
  if (r == ncclSuccess && o == boot::outcome::ok) r = check_peers(table, child->rank, &why);
  if (r == ncclSuccess && o == boot::outcome::ok) {
    o = boot::connect_ring(child->mailbox, child->magic, child->rank, table, child->to_succ, child->from_pred, stop, &why);
  }
  if (r == ncclSuccess && o == boot::outcome::ok) {
    child->peers = std::move(table);
    hold_init_delay(*child, started);
    if (stop()) o = boot::outcome::stopped;
  }
  if (r == ncclSuccess && o != boot::outcome::ok) r = o == boot::outcome::stopped ? ncclInternalError : ncclRemoteError;
  if (r == ncclSuccess) {
    child->built.store(true);
  } else {
    child->warn(why);
  }
  child->async.store(r, std::memory_order_release);
  if (parent) {
    parent->grow_id_pending = false;
    if (!parent->must_stop()) parent->async.store(ncclSuccess, std::memory_order_release);
  }
}

}  // namespace

ncclResult_t grow_unique_id(const std::shared_ptr<communicator>& c, ncclUniqueId* id) {
  if (const ncclResult_t r = c->ensure_ready("ncclCommGetUniqueId"); r != ncclSuccess) return r;
  if (id == nullptr) {
    c->warn("CommGetUniqueId : uniqueId argument is NULL");
    return ncclInvalidArgument;
  }
  if (c->grow_id_pending) {
    c->warn("ncclCommGetUniqueId: the previous grow id has not been consumed by a completed ncclCommGrow (nccl.h: "
            "cannot generate a new UID while a previous UID is unconsumed)");
    return ncclInvalidUsage;
  }
  const std::uint64_t magic = hash_combine(c->magic, static_cast<std::uint64_t>(c->child_count + 1));
  std::string why;
  if (!boot::start_root(magic, boot::id_kind::grow, c->nranks, id, &why)) {
    c->warn("ncclCommGetUniqueId: " + why);
    return ncclSystemError;
  }
  const auto patience = std::chrono::steady_clock::now() + 10s;
  const net::stop_fn give_up = [patience] { return std::chrono::steady_clock::now() >= patience; };
  for (int r = 0; r < c->nranks; ++r) {
    if (r == c->rank) continue;
    net::fd conn;
    if (boot::send_hello(c->peers[static_cast<std::size_t>(r)].listen_port, boot::hello_kind::grow_handle, c->magic,
                         c->rank, id_to_ints(*id), conn, give_up, &why) != boot::outcome::ok) {
      c->warn(strprintf("ncclCommGetUniqueId: cannot hand the grow id to rank %d: %s", r, why.c_str()));
      return ncclRemoteError;
    }
  }
  c->grow_id_pending = true;
  return ncclSuccess;
}

ncclResult_t grow(const std::shared_ptr<communicator>& parent, int nranks, const ncclUniqueId* id, int rank,
                  ncclComm_t* newcomm, const ncclConfig_t* config) {
  if (newcomm == nullptr) {
    warn("ncclCommGrow : newcomm argument is NULL");
    return ncclInvalidArgument;
  }
  if (nranks <= 0) {
    warn(strprintf("ncclCommGrow: total ranks must be positive, got %d", nranks));
    return ncclInvalidArgument;
  }
  if (parent && nranks <= parent->nranks) {
    warn(strprintf("ncclCommGrow: total ranks %d is less than current ranks %d", nranks, parent->nranks));
    return ncclInvalidArgument;
  }
  *newcomm = nullptr;
  auto child = std::make_shared<communicator>();
  std::string why;
  if (parent) {
    if (const ncclResult_t r = parent->ensure_ready("ncclCommGrow"); r != ncclSuccess) return r;
    if (rank != -1) {
      warn(strprintf("ncclCommGrow: existing ranks must pass rank=-1, got %d", rank));
      return ncclInvalidArgument;
    }
    ++parent->child_count;
    child->rank = parent->rank;
    child->device = parent->device;
    child->magic = hash_combine(parent->magic, static_cast<std::uint64_t>(parent->child_count));
    child->parent = parent;
  } else {
    if (rank < 0 || id == nullptr || rank >= nranks) {
      warn(rank < 0          ? strprintf("ncclCommGrow: new ranks must pass valid rank >= 0, got %d", rank)
           : id == nullptr   ? std::string("ncclCommGrow: new ranks must pass non-NULL uniqueId")
                             : strprintf("ncclCommGrow: new rank %d exceeds total ranks %d", rank, nranks));
      return ncclInvalidArgument;
    }
    cuda::enter_api("cudaFree(NULL), which ncclCommGrow makes first on a new rank", false);
    child->rank = rank;
    child->device = cuda::current_device();
  }
  boot::id_payload p;
  if (id != nullptr && (!boot::decode(*id, p) || p.kind != boot::id_kind::grow)) {
    warn("ncclCommGrow: the unique id was not made by ncclCommGetUniqueId (of the NCCL model)");
    return ncclInvalidArgument;
  }
  if (id != nullptr && parent && p.magic != child->magic) {
    warn(strprintf("ncclCommGrow: magic mismatch computed by the root, got %llx expected %llx",
                   static_cast<unsigned long long>(p.magic), static_cast<unsigned long long>(child->magic)));
    return ncclInvalidArgument;
  }
  if (!parent) child->magic = p.magic;
  if (parent && config == nullptr) {
    child->config = parent->config;
  } else if (const ncclResult_t r = parse_config(config, child->config, &why); r != ncclSuccess) {
    warn(why);
    return r;
  }
  child->nranks = nranks;
  child->blocking = blocking_of(child->config);
  child->async.store(ncclInProgress);
  if (!child->mailbox.open(&why)) {
    warn("ncclCommGrow: " + why);
    return ncclSystemError;
  }
  *newcomm = register_comm(child);  // at once, in progress: "newComm->initState = ncclInProgress; *newcomm = newComm"
  const bool have_id = id != nullptr;
  if (parent) {
    parent->async.store(ncclInProgress, std::memory_order_release);
    parent->start_job([parent, child, have_id, p] { run_grow(parent, child, have_id, p); }, child);
  } else {
    child->start_job([child, p] { run_grow(nullptr, child, true, p); });
  }
  // As ncclCommShrink: non-blocking, ncclSuccess with *newcomm in progress (the group end's
  // ncclInProgress passes NCCLCHECK); blocking, the job's result.
  if (!child->blocking) return ncclSuccess;
  child->wait_job();
  return child->state();
}

}  // namespace nccl_model
