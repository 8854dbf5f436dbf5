// Partitioned state recovered from peers' memory (group_options::replicas), each figure next to
// the alternative or limit measured in the same run. Ranks are threads of this process; their
// Gloo communicators talk TCP over 127.0.0.1 and meet in an shm:// store.
//
//   BM_recover_slice/MiB   a world of 2 loses rank 1 (its slice: MiB) and a newcomer takes its
//                          place: resync_shards() on both ranks (comm/detail/shard_resync.hpp), the
//                          path an elastic_group takes at that rebuild, with the replica that the
//                          real peer_replicas sent over TCP at the last snapshot ("memory"), and
//                          as with replicas = 0: both ranks reload the checkpoint that two
//                          checkpointers wrote, after POSIX_FADV_DONTNEED on every file of the
//                          step ("disk", cold page cache, checked with mincore). Plus a cold
//                          pread() of the lost slice's data file: this disk's bandwidth.
//   BM_reshard_4_to_3/MiB  a world of 4 (MiB in all) loses rank 3; the 3 survivors take 3's slice
//                          from rank 0's replica and everything else from their own images and
//                          reshard to 3 (resync_shards, plan_memory, move_slices), against a
//                          memcpy of the same bytes and one Gloo broadcast of them.
//   BM_replication_cost/MiB
//                          one snapshot's replication alone (peer_replicas): keep() against a
//                          memcpy, the transfer to the successor, and the CPU of it all.
//   BM_replication_overhead/every:N/compute:cpu|sleep
//                          two ranks train (training_loop + gloo_group, 64 MiB of partitioned
//                          moments per rank, a snapshot every N steps) with replicas = 1 against
//                          the same loop with replicas = 0; runs alternate, 3 pairs. The slowdown
//                          is the time a snapshot's replication added to the run over the
//                          `every` steps between snapshots (overhead_pct), with the pairs' spread.
//
//   shard_bench [--dir=PATH] [--loop-dir=PATH] [google benchmark flags]
//   --dir:      where the checkpoints of BM_recover_slice go (the disk measured; default $TMPDIR or /tmp)
//   --loop-dir: where the training loops checkpoint (default /dev/shm: persistence then costs a
//               memcpy in both arms instead of this shared disk's drift)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <latch>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include <elastic/checkpoint.hpp>
#include <elastic/comm/detail/peer_replicas.hpp>
#include <elastic/comm/detail/shard_resync.hpp>
#include <elastic/comm/gloo.hpp>
#include <elastic/comm/gloo_group.hpp>
#include <elastic/internal/file.hpp>
#include <elastic/rendezvous/shm_store.hpp>

#include "bench_common.hpp"

namespace fs = std::filesystem;
namespace ck = elastic::checkpoint;
namespace comm = elastic::comm;
namespace cd = elastic::comm::detail;
using namespace std::chrono_literals;
using elastic::bench::clock_type;
using elastic::bench::filled;
using elastic::bench::median;
using elastic::bench::since;

namespace {

const elastic::bench::scratch_dir* g_disk = nullptr;  // --dir: checkpoints read back cold
fs::path g_loop_root;                                 // --loop-dir: the training loops' checkpoints
std::string g_store;                                  // the shm:// store every communicator meets in
std::atomic<int> g_serial{0};                         // fresh Gloo prefixes, run ids, directories

std::string fresh_name(const std::string& what) {
  return what + "-" + std::to_string(::getpid()) + "-" + std::to_string(g_serial++);
}

/// Runs f(r) for r in [0, n) on n threads released together; returns the seconds from the
/// release to the last one's return, and rethrows the first exception one of them threw.
template <class F>
double together(int n, F&& f) {
  std::latch ready(n), go(1);
  std::vector<clock_type::time_point> done(static_cast<std::size_t>(n));
  std::vector<std::exception_ptr> failed(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ready.count_down();
      go.wait();
      try {
        f(r);
      } catch (...) {
        failed[static_cast<std::size_t>(r)] = std::current_exception();
      }
      done[static_cast<std::size_t>(r)] = clock_type::now();
    });
  }
  ready.wait();
  const auto t0 = clock_type::now();
  go.count_down();
  for (auto& t : threads) t.join();
  for (auto& e : failed)
    if (e) std::rethrow_exception(e);
  return std::chrono::duration<double>(*std::max_element(done.begin(), done.end()) - t0).count();
}

/// `n` Gloo communicators of one world over loopback (connected together, as a round does).
std::vector<std::unique_ptr<comm::gloo_communicator>> gloo_world(int n) {
  elastic::rendezvous::shm_store store(g_store);
  const std::string prefix = "/" + fresh_name("gloo");
  std::vector<std::unique_ptr<comm::gloo_communicator>> c(static_cast<std::size_t>(n));
  together(n, [&](int r) {
    c[static_cast<std::size_t>(r)] = std::make_unique<comm::gloo_communicator>(store, prefix, r, n, 300s, "127.0.0.1");
  });
  return c;
}

/// What an elastic_group hands resync_shards: run(what, f(Comm&)), true unless a collective
/// failed (a failure throws here). Notes when each collective returned.
struct timed_runner {
  comm::gloo_communicator* c = nullptr;
  std::vector<clock_type::time_point> returned;
  template <class F>
  bool operator()(std::string_view, F&& f) {
    f(*c);
    returned.push_back(clock_type::now());
    return true;
  }
};

/// A ZeRO-1 trainer's state: replicated weights and a value, and its slice of the moments.
struct rank_state {
  std::vector<float> w = std::vector<float>(1u << 16, 0.5f);
  std::uint64_t seen = 0;
  std::vector<float> m;
  ck::state st;
  rank_state(std::uint64_t global, int rank, int world) {
    st.add("w", w).add_value("seen", seen).add_partitioned("moments", m, global, rank, world);
    const std::uint64_t lo = st.find("moments")->shard->offset;
    for (std::size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>((lo + i) % 1000003);
  }
  rank_state(const rank_state&) = delete;
  rank_state& operator=(const rank_state&) = delete;
};

/// The checkpointer's staged snapshot of a state, as its copier hands it to the group (records
/// without callbacks; the bytes are the state's own here: what is measured is what comes after).
struct staged {
  std::vector<ck::entry> records;
  std::vector<ck::staged_entry> entries;
  explicit staged(const ck::state& st) : records(st.entries()) {
    for (auto& r : records) {
      r.partition = nullptr;
      r.resize = nullptr;
    }
    for (std::size_t i = 0; i < records.size(); ++i) {
      entries.push_back({&records[i], {static_cast<const std::byte*>(st.entries()[i].data), st.entries()[i].bytes}});
    }
  }
  ck::staged_snapshot at(std::uint64_t step) const { return {step, entries}; }
};

/// Waits (up to 10 minutes: a gigabyte on a loaded loopback) until `f` holds.
template <class F>
void wait_for(F&& f, const char* what) {
  const auto until = clock_type::now() + 10min;
  while (!f()) {
    if (clock_type::now() > until) throw std::runtime_error(std::string("timed out waiting for ") + what);
    std::this_thread::sleep_for(2ms);
  }
}

std::vector<fs::path> files_under(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path());
  return out;
}

/// Flushes and drops every file under `dir` from the page cache, so the next read comes from
/// the disk (as far as this guest can tell: a VM's host may still cache the image).
void evict(const fs::path& dir) {
  for (const auto& p : files_under(dir)) {
    auto fd = elastic::internal::open_file(p, O_RDONLY);
    ::fdatasync(fd.get());
    ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  }
}

/// Share of the pages of the files under `dir` that are in the page cache (mincore).
double resident_fraction(const fs::path& dir) {
  const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  std::size_t pages = 0, resident = 0;
  for (const auto& p : files_under(dir)) {
    auto fd = elastic::internal::open_file(p, O_RDONLY);
    struct stat sb {};
    if (::fstat(fd.get(), &sb) != 0 || sb.st_size == 0) continue;
    const auto size = static_cast<std::size_t>(sb.st_size);
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
    if (m == MAP_FAILED) continue;
    std::vector<unsigned char> v((size + page - 1) / page);
    if (::mincore(m, size, v.data()) == 0) {
      pages += v.size();
      for (unsigned char c : v) resident += c & 1u;
    }
    ::munmap(m, size);
  }
  return pages ? static_cast<double>(resident) / static_cast<double>(pages) : 0;
}

/// What the loop hands its group: reload `st` from the committed checkpoints in `dir`
/// (loop_ending.hpp's attach_group), timing each call into `seconds`.
ck::restore_fn restorer(const fs::path& dir, ck::state& st, double& seconds) {
  return [&dir, &st, &seconds](std::optional<std::uint64_t> step, int rank) -> std::optional<std::uint64_t> {
    const auto t0 = clock_type::now();
    std::optional<std::uint64_t> out;
    if (step) {
      out = ck::storage::load_step(dir, *step, st, rank).step;
    } else if (const auto m = ck::storage::restore_newest(dir, st, rank, elastic::event_log())) {
      out = m->step;
    }
    seconds += since(t0);
    return out;
  };
}

// ---- BM_recover_slice ----

void BM_recover_slice(benchmark::State& state, std::size_t mib) {
  const std::size_t slice_bytes = mib << 20;
  const std::uint64_t global = 2 * slice_bytes / sizeof(float);
  const std::string run = fresh_name("sb");
  const fs::path dir = g_disk->fresh(fresh_name("recover"));
  constexpr std::uint64_t snap_step = 10, live_step = 15;

  // Rank 0 survives; rank 1 snapshots step 10 with it (peer replicas and a checkpoint), then dies.
  auto s0 = std::make_unique<rank_state>(global, 0, 2);
  std::unique_ptr<cd::peer_replicas> r0;
  {
    auto s1 = std::make_unique<rank_state>(global, 1, 2);
    r0 = std::make_unique<cd::peer_replicas>(s0->st, run, "127.0.0.1", 1, elastic::event_log());
    auto r1 = std::make_unique<cd::peer_replicas>(s1->st, run, "127.0.0.1", 1, elastic::event_log());
    const std::vector<cd::peer_address> peers{r0->address(), r1->address()};
    r0->follow(0, 2, peers, r0->key());  // a group's ranks all take rank 0's key
    r1->follow(1, 2, peers, r0->key());
    const staged snap0(s0->st), snap1(s1->st);
    r0->keep(snap0.at(snap_step));
    r1->keep(snap1.at(snap_step));
    wait_for([&] { return r0->stats().received == 1 && r1->stats().received == 1; }, "the replicas");
    // The same step on disk, each rank writing its part (one staging slot each, to spare memory).
    auto opts = [&](int rank, const ck::state& st) {
      return ck::checkpointer_options{.dir = dir,
                                      .keep_last = 1,
                                      .rank = rank,
                                      .world_size = 2,
                                      .run_id = run,
                                      .staging_budget = st.fixed_bytes() + st.fixed_bytes() / 2,
                                      .events = elastic::event_log()};
    };
    ck::checkpointer c0(s0->st, opts(0, s0->st)), c1(s1->st, opts(1, s1->st));
    c0.snapshot(snap_step);
    c1.snapshot(snap_step);
    c0.before_update();
    c1.before_update();
    c1.wait_durable();
    c0.wait_durable();
  }  // rank 1 is gone, and its replica of rank 0's slice with it
  // Its successor in the group: a newcomer, rank 1 again, with nothing but its empty slice.
  auto sn = std::make_unique<rank_state>(global, 1, 2);
  std::fill(sn->m.begin(), sn->m.end(), 0.0f);
  cd::peer_replicas rn(sn->st, run, "127.0.0.1", 1, elastic::event_log());
  auto gloo = gloo_world(2);
  const fs::path lost_part = dir / ck::format::step_dir_name(snap_step) / ck::format::rank_data_name(1);
  auto buf = filled(4u << 20);

  std::vector<double> memory, disk, ratio, slice_memory, slice_disk, slice_ratio, raw, cached, bcast;
  auto check = [&](const char* path) {
    const auto* e = sn->st.find("moments");
    const std::uint64_t lo = e->shard->offset;
    for (std::size_t i = 0; i < sn->m.size(); i += 4099) {
      if (sn->m[i] != static_cast<float>((lo + i) % 1000003)) {
        throw std::runtime_error(std::string(path) + ": the newcomer's slice is wrong");
      }
    }
    std::fill(sn->m.begin(), sn->m.end(), 0.0f);
  };
  // Memory: the survivor holds its own image and rank 1's replica at step 10 (plan_memory).
  auto from_memory = [&] {
    timed_runner run0{gloo[0].get()}, run1{gloo[1].get()};
    clock_type::time_point end1;
    const double s = together(2, [&](int r) {
      auto& run = r == 0 ? run0 : run1;
      auto& st = r == 0 ? s0->st : sn->st;
      const auto out = cd::resync_shards<comm::gloo_communicator>(
          run, r, 2, r == 0 ? live_step : -1, live_step, r == 0, false, st, nullptr, r == 0 ? r0.get() : &rn);
      if (!out || out->step != static_cast<std::int64_t>(snap_step) || out->from_disk) {
        throw std::runtime_error("the memory path did not recover from memory at step 10");
      }
      if (r == 1) end1 = clock_type::now();
    });
    // The lost slice's own share, on the newcomer: from the return of the collective before it
    // (the last of the holdings' exchange; slice 0 stays with its holder, which takes it back
    // from its own image after the broadcasts) to its slice received, straight into its memory.
    const auto& b = run1.returned;
    slice_memory.push_back(std::chrono::duration<double>(end1 - b[b.size() - 2]).count());
    check("memory");
    return s;
  };
  // Disk, as with replicas = 0: nothing in memory, so rank 0 reloads the newest committed
  // step and names it, then the newcomer loads it as rank 1 (its slice: rank 1's part).
  auto from_disk = [&] {
    evict(dir);
    cached.push_back(resident_fraction(dir));
    double t0 = 0, t1 = 0;
    const auto restore0 = restorer(dir, s0->st, t0), restore1 = restorer(dir, sn->st, t1);
    timed_runner run0{gloo[0].get()}, run1{gloo[1].get()};
    const double s = together(2, [&](int r) {
      const auto out = cd::resync_shards<comm::gloo_communicator>(
          r == 0 ? run0 : run1, r, 2, r == 0 ? live_step : -1, live_step, r == 0, false, r == 0 ? s0->st : sn->st,
          r == 0 ? restore0 : restore1, nullptr);
      if (!out || !out->reloaded || out->step != static_cast<std::int64_t>(snap_step)) {
        throw std::runtime_error("the disk path did not reload step 10");
      }
    });
    slice_disk.push_back(t1);
    check("disk");
    return s;
  };
  auto raw_read = [&] {
    evict(dir);
    const auto t0 = clock_type::now();
    auto fd = elastic::internal::open_file(lost_part, O_RDONLY);
    for (std::size_t at = 0; at < slice_bytes; at += 4u << 20) {
      elastic::internal::pread_all(fd.get(), buf.get(), std::min<std::size_t>(4u << 20, slice_bytes - at), at, lost_part);
    }
    raw.push_back(since(t0));
  };

  // The transport alone: one Gloo broadcast of the slice's bytes from rank 0 to rank 1.
  auto raw_bcast = [&] {
    std::vector<std::vector<std::int64_t>> words(2, std::vector<std::int64_t>(slice_bytes / 8, 1));
    bcast.push_back(together(2, [&](int r) {
      gloo[static_cast<std::size_t>(r)]->broadcast(std::span<std::int64_t>(words[static_cast<std::size_t>(r)]), 0);
    }));
  };

  bool memory_first = true;
  for (auto _ : state) {
    raw_read();
    raw_bcast();
    double m = 0, d = 0;
    if (memory_first) {
      m = from_memory();
      d = from_disk();
    } else {
      d = from_disk();
      m = from_memory();
    }
    memory_first = !memory_first;
    memory.push_back(m);
    disk.push_back(d);
    ratio.push_back(d / m);
    slice_ratio.push_back(slice_disk.back() / slice_memory.back());
    state.SetIterationTime(m);
  }
  const double mb = static_cast<double>(slice_bytes) / 1e6;
  state.counters["memory_ms"] = median(memory) * 1e3;
  state.counters["disk_ms"] = median(disk) * 1e3;
  state.counters["x_disk_over_memory"] = median(ratio);
  state.counters["slice_memory_ms"] = median(slice_memory) * 1e3;
  state.counters["slice_disk_ms"] = median(slice_disk) * 1e3;
  state.counters["x_slice"] = median(slice_ratio);
  state.counters["slice_memory_MB_s"] = mb / median(slice_memory);
  state.counters["slice_disk_MB_s"] = mb / median(slice_disk);
  state.counters["raw_read_MB_s"] = mb / median(raw);
  state.counters["bcast_MB_s"] = mb / median(bcast);
  state.counters["cached_pct"] = *std::max_element(cached.begin(), cached.end()) * 100;
  gloo.clear();
  fs::remove_all(dir);
}

// ---- BM_reshard_4_to_3 ----

void BM_reshard_4_to_3(benchmark::State& state, std::size_t mib) {
  const std::size_t bytes = mib << 20;
  const std::uint64_t global = bytes / sizeof(float);
  const std::string run = fresh_name("sb");
  constexpr std::uint64_t snap_step = 10, live_step = 15;

  // Four ranks snapshot step 10: each keeps its image and sends its slice to its successor.
  std::vector<std::unique_ptr<cd::peer_replicas>> reps(4);
  {
    std::vector<std::unique_ptr<rank_state>> s(4);
    std::vector<cd::peer_address> peers;
    for (int r = 0; r < 4; ++r) {
      s[static_cast<std::size_t>(r)] = std::make_unique<rank_state>(global, r, 4);
      reps[static_cast<std::size_t>(r)] =
          std::make_unique<cd::peer_replicas>(s[static_cast<std::size_t>(r)]->st, run, "127.0.0.1", 1, elastic::event_log());
      peers.push_back(reps[static_cast<std::size_t>(r)]->address());
    }
    for (int r = 0; r < 4; ++r) reps[static_cast<std::size_t>(r)]->follow(r, 4, peers, reps[0]->key());
    for (int r = 0; r < 4; ++r) reps[static_cast<std::size_t>(r)]->keep(staged(s[static_cast<std::size_t>(r)]->st).at(snap_step));
    wait_for([&] { return std::all_of(reps.begin(), reps.end(), [](const auto& p) { return p->stats().received == 1; }); },
             "the replicas");
  }
  reps[3].reset();  // rank 3 dies; rank 0 holds its replica
  auto gloo = gloo_world(3);
  auto src = filled(bytes), dst = filled(bytes);

  std::vector<double> ours, copy, bcast, ratio;
  for (auto _ : state) {
    // The survivors' live state, slices of the world of 4 (fresh: growing them is part of it).
    std::vector<std::unique_ptr<rank_state>> s(3);
    for (int r = 0; r < 3; ++r) s[static_cast<std::size_t>(r)] = std::make_unique<rank_state>(global, r, 4);
    auto t0 = clock_type::now();
    std::memcpy(dst.get(), src.get(), bytes);
    benchmark::ClobberMemory();
    const double c = since(t0);
    // One Gloo broadcast of the same bytes from rank 0 to the two others: the transport alone.
    std::vector<std::vector<std::int64_t>> words(3, std::vector<std::int64_t>(bytes / 8, 1));
    const double b = together(3, [&](int r) {
      gloo[static_cast<std::size_t>(r)]->broadcast(std::span<std::int64_t>(words[static_cast<std::size_t>(r)]), 0);
    });
    words.clear();
    const double o = together(3, [&](int r) {
      timed_runner run{gloo[static_cast<std::size_t>(r)].get()};
      const auto out = cd::resync_shards<comm::gloo_communicator>(run, r, 3, live_step, live_step, true, false,
                                                                  s[static_cast<std::size_t>(r)]->st, nullptr,
                                                                  reps[static_cast<std::size_t>(r)].get());
      if (!out || out->world_before != 4 || out->step != static_cast<std::int64_t>(snap_step) ||
          out->sources != "own@0,own@1,own@2,replica@0") {
        throw std::runtime_error("the survivors did not reshard 4 -> 3 from memory (sources: " +
                                 (out ? out->sources : std::string("-")) + ")");
      }
    });
    for (int r = 0; r < 3; ++r) {  // every survivor holds its new slice of the whole buffer
      const auto& rs = *s[static_cast<std::size_t>(r)];
      const std::uint64_t lo = rs.st.find("moments")->shard->offset;
      if (rs.m.size() != ck::even_partition(global, r, 3).count) throw std::runtime_error("wrong slice size");
      for (std::size_t i = 0; i < rs.m.size(); i += 4099) {
        if (rs.m[i] != static_cast<float>((lo + i) % 1000003)) throw std::runtime_error("a resharded slice is wrong");
      }
    }
    state.SetIterationTime(o);
    ours.push_back(o);
    copy.push_back(c);
    bcast.push_back(b);
    ratio.push_back(o / c);
  }
  state.counters["reshard_ms"] = median(ours) * 1e3;
  state.counters["memcpy_ms"] = median(copy) * 1e3;
  state.counters["x_memcpy"] = median(ratio);
  state.counters["bcast_ms"] = median(bcast) * 1e3;
  state.counters["x_bcast"] = median(ours) / median(bcast);
  state.counters["reshard_MB_s"] = static_cast<double>(bytes) / median(ours) / 1e6;
  gloo.clear();
}

// ---- BM_replication_cost ----

/// CPU time of the whole process (every thread), in ns.
long cpu_ns_of_process() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1'000'000'000L + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1000L;
}

double thread_cpu_s() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) / 1e9;
}

/// What one snapshot's replication costs, with nothing else running: keep() (the own image: a
/// copy of the staged state, on the checkpointer's copier thread in a loop, here on this one)
/// against a memcpy of the same bytes, then the slice's way to the successor (CRC-32C and TCP
/// out, a fresh buffer, TCP in and CRC-32C at the listener) until it is kept there. CPU time
/// is the process's, every thread: in a group each rank keeps, sends and receives one slice per
/// snapshot, so this is one rank's CPU per snapshot. CPU time hardly depends on what else the
/// machine runs; it is what the training loop loses per snapshot where no core is spare.
void BM_replication_cost(benchmark::State& state, std::size_t mib) {
  const std::size_t slice_bytes = mib << 20;
  const std::uint64_t global = 2 * slice_bytes / sizeof(float);
  const std::string run = fresh_name("sb");
  rank_state s0(global, 0, 2), s1(global, 1, 2);
  cd::peer_replicas r0(s0.st, run, "127.0.0.1", 1, elastic::event_log());
  cd::peer_replicas r1(s1.st, run, "127.0.0.1", 1, elastic::event_log());
  const std::vector<cd::peer_address> peers{r0.address(), r1.address()};
  r0.follow(0, 2, peers, r0.key());
  r1.follow(1, 2, peers, r0.key());
  const staged snap(s0.st);
  auto src = filled(slice_bytes), dst = filled(slice_bytes);
  std::uint64_t step = 0;
  // The first two keeps allocate the two own images (later ones reuse the older): apart.
  double first_keep = 0;
  for (int i = 0; i < 2; ++i) {
    const auto t0 = clock_type::now();
    r0.keep(snap.at(step += 10));
    if (i == 0) first_keep = since(t0);
    wait_for([&] { return r1.stats().received == step / 10; }, "the replica");
  }
  std::vector<double> keep, keep_cpu, copy, transfer, cpu;
  for (auto _ : state) {
    auto t0 = clock_type::now();
    std::memcpy(dst.get(), src.get(), slice_bytes);
    benchmark::ClobberMemory();
    copy.push_back(since(t0));
    const long cpu0 = cpu_ns_of_process();
    const double tc0 = thread_cpu_s();
    t0 = clock_type::now();
    r0.keep(snap.at(step += 10));
    keep.push_back(since(t0));
    keep_cpu.push_back(thread_cpu_s() - tc0);
    wait_for([&] { return r1.stats().received == step / 10; }, "the replica");
    transfer.push_back(since(t0) - keep.back());
    cpu.push_back(static_cast<double>(cpu_ns_of_process() - cpu0) / 1e9);
    state.SetIterationTime(since(t0));
  }
  state.counters["keep_ms"] = median(keep) * 1e3;
  state.counters["keep_cpu_ms"] = median(keep_cpu) * 1e3;
  state.counters["first_keep_ms"] = first_keep * 1e3;
  state.counters["memcpy_ms"] = median(copy) * 1e3;
  state.counters["x_memcpy"] = median(keep) / median(copy);
  state.counters["transfer_ms"] = median(transfer) * 1e3;
  state.counters["transfer_MB_s"] = static_cast<double>(slice_bytes) / median(transfer) / 1e6;
  state.counters["cpu_ms"] = median(cpu) * 1e3;
  state.counters["cpu_ms_per_GiB"] = median(cpu) * 1e3 * 1024.0 / static_cast<double>(mib);
}

// ---- BM_replication_overhead ----

constexpr std::size_t loop_slice_bytes = 64u << 20;  // moments per rank
constexpr std::size_t grad_count = 1u << 16;         // floats allreduced per step
std::uint64_t g_burn_iters = 0;                      // CPU work of a 30 ms forward/backward, one core

/// A fixed amount of arithmetic on a few registers (a stand-in for forward/backward).
float burn(std::uint64_t iters) {
  float a = 1.0f, b = 0.5f, c = 0.25f, d = 0.125f;
  for (std::uint64_t i = 0; i < iters; ++i) {
    a = a * 0.999999f + 1e-7f;
    b = b * 0.999998f + 2e-7f;
    c = c * 0.999997f + 3e-7f;
    d = d * 0.999996f + 4e-7f;
    benchmark::DoNotOptimize(a);
  }
  return a + b + c + d;
}

void calibrate_burn() {
  std::uint64_t n = 1u << 20;
  for (;;) {
    const auto t0 = clock_type::now();
    benchmark::DoNotOptimize(burn(n));
    const double s = since(t0);
    if (s > 0.05) {
      g_burn_iters = static_cast<std::uint64_t>(static_cast<double>(n) * 0.030 / s);
      return;
    }
    n *= 2;
  }
}

struct loop_run {
  double step_s = 0;      // rank 0's mean step, snapshots included, the first step (the join) excluded
  double stall_s = 0;     // rank 0's training thread blocked in snapshot() + before_update(), per snapshot
  double cpu_s = 0;       // CPU of the whole process (both ranks and all their threads)
  std::uint64_t snapshots = 0, sent = 0, received = 0;
};

/// Two ranks train `steps` steps with a snapshot every `every`; `busy`: forward/backward is CPU
/// work (this machine's cores), else a 30 ms sleep (the host idle while a device computes).
loop_run train(int replicas, std::uint64_t every, std::uint64_t steps, bool busy) {
  const std::string run = fresh_name("sb");
  const fs::path dir = g_loop_root / run;
  const std::uint64_t global = 2 * loop_slice_bytes / sizeof(float);
  loop_run out;
  const long cpu0 = cpu_ns_of_process();
  together(2, [&](int r) {
    elastic::rendezvous::shm_store store(g_store);
    std::vector<float> w(grad_count, 0.0f), grad(grad_count, 0.0f), m;
    std::uint64_t seen = 0;
    ck::state st;
    // Registered as a world of one: the group gives each rank its slice at the join.
    st.add("w", w).add_value("seen", seen).add_partitioned("moments", m, global, 0, 1);
    comm::group_options go;
    go.rendezvous.run_id = run;
    go.rendezvous.min_ranks = go.rendezvous.max_ranks = 2;
    go.rendezvous.join_timeout = 120s;
    go.rendezvous.events = elastic::event_log();
    go.replicas = replicas;
    go.replica_host = "127.0.0.1";
    go.events = elastic::event_log();
    comm::gloo_group group(store, go, comm::gloo_factory(120s, "127.0.0.1"));
    elastic::training_loop loop({.dir = dir,
                                 .steps = steps,
                                 .every_steps = every,
                                 .keep_last = 1,
                                 .checkpoint_at_end = false,
                                 .handle_signals = false,
                                 .run_id = run,
                                 .events = elastic::event_log(),
                                 .group = &group},
                                st);
    clock_type::time_point first{};
    for (auto& step : loop) {
      if (step.index() == 1) first = clock_type::now();
      if (busy) {
        benchmark::DoNotOptimize(burn(g_burn_iters));
      } else {
        std::this_thread::sleep_for(30ms);
      }
      for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i % 7) * 1e-3f;
      if (!group.allreduce(std::span<float>(grad), comm::reduce_op::sum)) throw std::runtime_error("allreduce failed");
      step.before_update();
      for (std::size_t k = 0; k < m.size(); ++k) m[k] = 0.9f * m[k] + 0.1f * grad[k & (grad_count - 1)];  // Adam-like
      for (std::size_t k = 0; k < w.size(); ++k) w[k] -= grad[k];
      ++seen;
    }
    if (r != 0) return;
    out.step_s = since(first) / static_cast<double>(steps - 1);
    const auto cs = loop.checkpointer().stats();
    out.snapshots = cs.snapshots;
    out.stall_s = cs.snapshots ? cs.stall_seconds / static_cast<double>(cs.snapshots) : 0;
    if (const auto rs = group.replica_stats()) {
      out.sent = rs->sent;
      out.received = rs->received;
    }
  });
  out.cpu_s = static_cast<double>(cpu_ns_of_process() - cpu0) / 1e9;
  fs::remove_all(dir);
  return out;
}

void BM_replication_overhead(benchmark::State& state, std::uint64_t every, bool busy) {
  // Snapshots after every, 2 every, ... steps (the last step is not snapshotted), the last one
  // followed by at least 50 steps, long enough for its replica to be sent and kept: 100 steps and
  // 9 snapshots at every 10, 150 and 2 at every 50, 150 and 1 at every 100.
  const std::uint64_t steps = every <= 10 ? 100 : 150;
  constexpr int pairs = 3;
  std::vector<double> with_step, without_step, with_stall, without_stall, cpu_added, wall_added;
  std::uint64_t sent = 0, received = 0, taken = 0;
  bool with_first = false;
  for (auto _ : state) {
    for (int pair = 0; pair < pairs; ++pair) {
      loop_run with, without;
      if (with_first) {
        with = train(1, every, steps, busy);
        without = train(0, every, steps, busy);
      } else {
        without = train(0, every, steps, busy);
        with = train(1, every, steps, busy);
      }
      with_first = !with_first;
      with_step.push_back(with.step_s);
      without_step.push_back(without.step_s);
      with_stall.push_back(with.stall_s);
      without_stall.push_back(without.stall_s);
      // What replication added to the run, per snapshot: the runs differ in nothing else.
      const auto n = static_cast<double>(std::max<std::uint64_t>(1, with.snapshots));
      cpu_added.push_back((with.cpu_s - without.cpu_s) / n);
      wall_added.push_back((with.step_s - without.step_s) * static_cast<double>(steps - 1) / n);
      sent = with.sent;
      received = with.received;
      taken = with.snapshots;
    }
    state.SetIterationTime(median(with_step) * static_cast<double>(steps));
  }
  // The slowdown in steady state at this interval: one snapshot's added time over the `every`
  // steps it comes with (a run's own mean would dilute it over the steps after its last snapshot).
  const double interval_s = static_cast<double>(every) * median(without_step);
  state.counters["steps"] = static_cast<double>(steps);
  state.counters["snapshots"] = static_cast<double>(taken);
  state.counters["replicas_sent"] = static_cast<double>(sent);  // by rank 0: one per snapshot when it keeps up
  state.counters["replicas_received"] = static_cast<double>(received);
  state.counters["step_ms_with"] = median(with_step) * 1e3;
  state.counters["step_ms_without"] = median(without_step) * 1e3;
  state.counters["wall_ms_per_snapshot_added"] = median(wall_added) * 1e3;  // rank 0's training time
  state.counters["overhead_pct"] = median(wall_added) / interval_s * 100;
  // The spread of the pairs: what other load on the machine does to one pair.
  state.counters["overhead_min_pct"] = *std::min_element(wall_added.begin(), wall_added.end()) / interval_s * 100;
  state.counters["overhead_max_pct"] = *std::max_element(wall_added.begin(), wall_added.end()) / interval_s * 100;
  state.counters["stall_ms_with"] = median(with_stall) * 1e3;
  state.counters["stall_ms_without"] = median(without_stall) * 1e3;
  state.counters["cpu_ms_per_snapshot_added"] = median(cpu_added) * 1e3;  // both ranks, all threads
}

/// --loop-dir=PATH, taken out of argv (default /dev/shm).
fs::path take_loop_dir(int& argc, char** argv) {
  fs::path root = "/dev/shm";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--loop-dir=", 11) != 0) continue;
    root = argv[i] + 11;
    for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
    --argc;
    --i;
  }
  return root / ("elastic-shard-bench-" + std::to_string(::getpid()));
}

}  // namespace

int main(int argc, char** argv) {
  const elastic::bench::scratch_dir scratch(argc, argv, "elastic-shard-bench");
  g_disk = &scratch;
  g_loop_root = take_loop_dir(argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  comm::detail::ignore_sigpipe();
  g_store = "elastic-shard-bench-" + std::to_string(::getpid());
  elastic::rendezvous::shm_store store(g_store);  // kept open for the whole run
  fs::create_directories(g_loop_root);
  calibrate_burn();
  for (std::size_t mib : {64, 256, 1024}) {
    benchmark::RegisterBenchmark(("BM_recover_slice/" + std::to_string(mib)).c_str(), BM_recover_slice, mib)
        ->Iterations(mib >= 1024 ? 2 : 4)->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  for (std::size_t mib : {64, 256, 1024}) {
    benchmark::RegisterBenchmark(("BM_reshard_4_to_3/" + std::to_string(mib)).c_str(), BM_reshard_4_to_3, mib)
        ->Iterations(mib >= 1024 ? 2 : 4)->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  for (std::size_t mib : {64, 256}) {
    benchmark::RegisterBenchmark(("BM_replication_cost/" + std::to_string(mib)).c_str(), BM_replication_cost, mib)
        ->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  for (const bool busy : {true, false}) {
    for (std::uint64_t every : {10, 50, 100}) {
      benchmark::RegisterBenchmark(("BM_replication_overhead/every:" + std::to_string(every) +
                                    (busy ? "/compute:cpu" : "/compute:sleep")).c_str(),
                                   BM_replication_overhead, every, busy)
          ->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::error_code ec;
  fs::remove_all(g_loop_root, ec);
  elastic::rendezvous::shm_store::remove(g_store);
  return 0;
}
