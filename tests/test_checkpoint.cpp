// The state registry, the archive of user objects, and storage: round trips, retention,
// resharding, and every kind of damage a checkpoint directory can suffer.
#include <sys/resource.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <elastic/checkpoint.hpp>
#include <elastic/checkpoint/detail/interval_policy.hpp>

#include "support/catch.hpp"
#include "support/damage.hpp"
#include "support/errors.hpp"
#include "support/other_user.hpp"
#include "support/process.hpp"

namespace fs = std::filesystem;
namespace ck = elastic::checkpoint;
using elastic::errc;

namespace {

struct cursor {
  std::uint64_t epoch = 0;
  std::vector<std::uint32_t> order;
  std::string tag;
};
template <class Archive>
void elastic_checkpoint(Archive& ar, cursor& c) {
  ar(c.epoch, c.order, c.tag);
}

using elastic::test::error_of;

/// A small state with one of everything, filled from `seed`.
struct model {
  std::vector<float> w = std::vector<float>(300000);
  std::vector<double> m = std::vector<double>(1000);
  std::uint64_t step = 0;
  cursor c;
  ck::state st;

  explicit model(int seed = 0) {
    fill(seed);
    st.add("w", w).add("m", m).add_value("step", step).add_object("cursor", c);
  }
  void fill(int seed) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i * 7 + seed);
    for (std::size_t i = 0; i < m.size(); ++i) m[i] = static_cast<double>(i) / 3.0 + seed;
    step = static_cast<std::uint64_t>(seed);
    c.epoch = static_cast<std::uint64_t>(seed) * 10;
    c.order.assign(static_cast<std::size_t>(5 + seed), static_cast<std::uint32_t>(seed));
    c.tag = "seed-" + std::to_string(seed);
  }
  bool same_as(const model& o) const { return w == o.w && m == o.m && step == o.step && c.epoch == o.c.epoch && c.order == o.c.order && c.tag == o.c.tag; }
};

ck::checkpointer_options opts(const std::string& dir, const std::string& events, int rank = 0, int world = 1) {
  return {.dir = dir, .keep_last = 3, .rank = rank, .world_size = world, .run_id = "test",
          .commit_timeout = std::chrono::seconds(10), .chunk_bytes = 64 * 1024, .events = elastic::event_log::to_file(events)};
}

/// Saves `m` as `step` into `dir`, durably.
void save(model& m, const std::string& dir, std::uint64_t step, const std::string& events) {
  ck::checkpointer c(m.st, opts(dir, events));
  c.snapshot(step);
  c.before_update();
  c.wait_durable();
}

/// Rank `rank` of `world` writes its part of `step`: its slice of `truth` as the partitioned entry
/// "adam_m", beside the value `counter`.
void write_partitioned(const std::string& dir, const std::string& events, std::uint64_t step,
                       const std::vector<float>& truth, int rank, int world, std::uint64_t counter) {
  std::vector<float> m;
  ck::state st;
  st.add_partitioned("adam_m", m, truth.size(), rank, world).add_value("counter", counter);
  std::copy_n(truth.begin() + static_cast<std::ptrdiff_t>(st.find("adam_m")->shard->offset), m.size(), m.begin());
  ck::checkpointer c(st, opts(dir, events, rank, world));
  c.snapshot(step);
  c.wait_durable();
}

/// Step `step` loaded by every rank of `world`: "adam_m" reassembled from their slices in rank
/// order, the world that wrote it, and the counter each rank read.
struct partitioned_load {
  std::vector<float> whole;
  int written_by = 0;
  std::vector<std::uint64_t> counters;
};
partitioned_load load_partitioned(const std::string& dir, std::uint64_t step, std::uint64_t global, int world) {
  partitioned_load out;
  for (int r = 0; r < world; ++r) {
    std::vector<float> part;
    std::uint64_t counter = 0;
    ck::state st;
    st.add_partitioned("adam_m", part, global, r, world).add_value("counter", counter);
    const auto m = ck::storage::load_step(dir, step, st, r);
    REQUIRE(m.step == step);
    out.written_by = m.world_size;
    CHECK(st.find("adam_m")->shard->offset == out.whole.size());  // slices in rank order
    out.whole.insert(out.whole.end(), part.begin(), part.end());
    out.counters.push_back(counter);
  }
  return out;
}

std::string step_dir(const std::string& dir, std::uint64_t s) { return dir + "/" + ck::format::step_dir_name(s); }

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// The steps of `dir` once they are `want` (retention runs after wait_durable() returns), or
/// as they are after a bounded wait.
std::vector<std::uint64_t> steps_once(const std::string& dir, const std::vector<std::uint64_t>& want) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    auto steps = ck::storage::list_steps(dir);
    if (steps == want || std::chrono::steady_clock::now() >= until) return steps;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

TEST_CASE("the registry refuses duplicates, bad names and wrong shapes") {
  std::vector<float> a(10);
  std::uint64_t v = 0;
  ck::state st;
  st.add("a", a).add_value("v", v);
  CHECK(error_of([&] { st.add("a", a); }).code() == errc::invalid_argument);
  CHECK(error_of([&] { st.add("", a); }).code() == errc::invalid_argument);
  CHECK(error_of([&] { st.add("bad\nname", a); }).code() == errc::invalid_argument);
  CHECK(error_of([&] { st.add("shaped", a, {3, 4}); }).code() == errc::invalid_argument);
  CHECK_NOTHROW(st.add("shaped", a, {2, 5}));
  CHECK(error_of([&] { st.add_shard("s", std::span<float>(a), 95, 100); }).code() == errc::invalid_argument);
  const auto e = error_of([&] { st.add("dev", elastic::device_span<float>(a.data(), a.size())); });
  if (!ELASTIC_WITH_CUDA) {
    CHECK(e.code() == errc::not_supported);
    CHECK(std::string(e.what()).find("CUDA") != std::string::npos);
  }
  CHECK(st.find("shaped")->type == ck::dtype::f32);
  CHECK(st.fixed_bytes() == 2 * 10 * sizeof(float) + sizeof v);
}

TEST_CASE("objects round-trip through their hook and refuse a changed layout") {
  cursor c{7, {1, 2, 3}, "x"};
  std::vector<std::byte> bytes;
  ck::output_archive out(bytes);
  out(c);
  cursor d;
  ck::input_archive in(bytes, "cursor");
  in(d);
  in.finish();
  CHECK(d.epoch == 7);
  CHECK(d.order == std::vector<std::uint32_t>{1, 2, 3});
  CHECK(d.tag == "x");
  // Fewer bytes than the hook reads, or more: a clear mismatch, never garbage.
  std::vector<std::byte> shorter(bytes.begin(), bytes.end() - 1);
  ck::input_archive in2(shorter, "cursor");
  CHECK(error_of([&] { in2(d); }).code() == errc::mismatch);
  bytes.push_back(std::byte{0});
  ck::input_archive in3(bytes, "cursor");
  in3(d);
  CHECK(error_of([&] { in3.finish(); }).code() == errc::mismatch);
}

TEST_CASE("a snapshot restores bit for bit, and the newest of several steps wins") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  model a(1);
  {
    ck::checkpointer c(a.st, opts(dir, events));
    CHECK(c.staging_slots() == 2);
    for (int s = 1; s <= 5; ++s) {
      a.fill(s);
      c.snapshot(static_cast<std::uint64_t>(s) * 10);
      c.before_update();
      a.fill(100);  // the "update" after the fence must not reach the snapshot
    }
    c.wait_durable();
    CHECK(c.stats().committed == 5);
  }
  CHECK(ck::storage::list_steps(dir) == std::vector<std::uint64_t>{50, 40, 30});  // keep_last = 3
  model b(0), expect(5);
  ck::checkpointer c(b.st, opts(dir, events));
  const auto m = c.restore();
  REQUIRE(m);
  CHECK(m->step == 50);
  CHECK(m->run_id == "test");
  CHECK(b.same_as(expect));
  CHECK(elastic::test::events_named(events, "checkpoint_commit").size() == 5);
  CHECK(elastic::test::events_named(events, "checkpoint_restore").size() == 1);
}

TEST_CASE("an empty directory is a fresh start") {
  elastic::test::temp_dir tmp;
  model b(3), expect(3);
  ck::checkpointer c(b.st, opts(tmp.file("none"), tmp.file("e")));
  CHECK_FALSE(c.restore());
  CHECK(b.same_as(expect));
}

TEST_CASE("damaged steps are skipped with an event and the previous one is loaded") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  model a(1);
  save(a, dir, 1, events);
  a.fill(2);
  save(a, dir, 2, events);
  const fs::path newest = step_dir(dir, 2);

  using damage = std::function<void()>;
  const std::vector<std::pair<std::string, damage>> cases = {
      {"flipped data byte", [&] { elastic::test::flip_byte(newest / "rank-00000.data", 1000); }},
      {"flipped byte in the last chunk", [&] { elastic::test::flip_byte(newest / "rank-00000.data", 300000 * 4 - 1); }},
      {"truncated data", [&] { fs::resize_file(newest / "rank-00000.data", 4096); }},
      {"flipped manifest byte", [&] { elastic::test::flip_byte(newest / "manifest.json", 30); }},
      {"flipped rank manifest byte", [&] { elastic::test::flip_byte(newest / "rank-00000.json", 120); }},
      {"truncated rank manifest", [&] { fs::resize_file(newest / "rank-00000.json", 50); }},
      {"missing rank file", [&] { fs::remove(newest / "rank-00000.json"); }},
      {"missing data file", [&] { fs::remove(newest / "rank-00000.data"); }},
      {"missing manifest", [&] { fs::remove(newest / "manifest.json"); }},
  };
  for (const auto& [what, hurt] : cases) {
    INFO(what);
    fs::remove_all(newest);
    a.fill(2);
    save(a, dir, 2, events);
    hurt();
    fs::remove(events);
    model b(9), expect(1);
    ck::checkpointer c(b.st, opts(dir, events));
    const auto m = c.restore();
    REQUIRE(m);
    CHECK(m->step == 1);
    CHECK(b.same_as(expect));
    const auto skipped = elastic::test::events_named(events, "checkpoint_skipped");
    REQUIRE(skipped.size() == 1);
    CHECK(skipped[0].find("\"step\":2") != std::string::npos);
  }
}

TEST_CASE("a corrupt only step leaves the caller's state untouched") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  model a(4);
  save(a, dir, 7, events);
  elastic::test::flip_byte(fs::path(step_dir(dir, 7)) / "rank-00000.data", 300000 * 4 - 10);  // the last chunk of 'w'
  model b(5), expect(5);
  ck::checkpointer c(b.st, opts(dir, events));
  CHECK_FALSE(c.restore());
  CHECK(b.same_as(expect));
}

TEST_CASE("a manifest of a newer format version is refused with a clear reason") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  model a(1);
  save(a, dir, 1, events);
  save(a, dir, 2, events);
  // Rewrite step 2's manifest as a future version, correctly sealed: only the version is wrong.
  ck::format::step_manifest m;
  m.version = ck::format_version + 1;
  m.step = 2;
  m.run_id = "test";
  m.time = "2030-01-01T00:00:00Z";
  std::ofstream(fs::path(step_dir(dir, 2)) / "manifest.json", std::ios::trunc) << ck::format::encode(m);
  const auto e = error_of([&] { ck::storage::load_step(dir, 2, a.st, 0); });
  CHECK(e.code() == errc::version_mismatch);
  CHECK(std::string(e.what()).find("upgrade elastic") != std::string::npos);
  model b(0);
  ck::checkpointer c(b.st, opts(dir, events));
  CHECK(c.restore()->step == 1);
  const auto skipped = elastic::test::events_named(events, "checkpoint_skipped");
  REQUIRE(skipped.size() == 1);
  CHECK(skipped[0].find("version_mismatch") != std::string::npos);
}

TEST_CASE("a step that does not fit the registered state is an error, not a fallback") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  model a(1);
  save(a, dir, 1, events);
  std::vector<float> w(300000);
  std::vector<double> other(5);
  std::uint64_t step = 0;
  cursor c;
  ck::state renamed;
  renamed.add("weights", w).add("m", other).add_value("step", step).add_object("cursor", c);
  const auto e = error_of([&] { ck::checkpointer(renamed, opts(dir, events)).restore(); });
  CHECK(e.code() == errc::mismatch);
  const std::string what = e.what();
  CHECK(what.find("'weights' is registered but not in the checkpoint") != std::string::npos);
  CHECK(what.find("'w' is in the checkpoint but not registered") != std::string::npos);
  CHECK(what.find("'m' is 40 bytes here but 8000 in the checkpoint") != std::string::npos);
  CHECK(w == std::vector<float>(300000));  // untouched
}

TEST_CASE("pending directories are invisible to readers and swept after the next commit") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  model a(1);
  save(a, dir, 5, events);
  fs::create_directories(fs::path(dir) / ck::format::pending_dir_name(3));
  fs::create_directories(fs::path(dir) / ck::format::pending_dir_name(9));
  std::ofstream(fs::path(dir) / ck::format::pending_dir_name(9) / "rank-00000.data") << "partial";
  CHECK(ck::storage::list_steps(dir) == std::vector<std::uint64_t>{5});
  save(a, dir, 10, events);
  CHECK_FALSE(fs::exists(fs::path(dir) / ck::format::pending_dir_name(3)));
  CHECK_FALSE(fs::exists(fs::path(dir) / ck::format::pending_dir_name(9)));
}

TEST_CASE("sharded entries are reassembled for another number of ranks") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  const std::size_t global = 100003;
  std::vector<float> truth(global);
  std::iota(truth.begin(), truth.end(), 0.5f);
  auto slice = [&](int r, int world) {
    return std::pair{global * static_cast<std::size_t>(r) / static_cast<std::size_t>(world),
                     global * static_cast<std::size_t>(r + 1) / static_cast<std::size_t>(world)};
  };
  // Written by 2 ranks (rank 1 first: rank 0 waits for it before committing).
  std::uint64_t counter = 77;
  for (int r : {1, 0}) {
    auto [lo, hi] = slice(r, 2);
    std::vector<float> part(truth.begin() + static_cast<std::ptrdiff_t>(lo), truth.begin() + static_cast<std::ptrdiff_t>(hi));
    ck::state st;
    st.add_shard("emb", std::span<float>(part), lo, global).add_value("counter", counter);
    ck::checkpointer c(st, opts(dir, events, r, 2));
    c.snapshot(4);
    c.wait_durable();
  }
  REQUIRE(ck::storage::list_steps(dir) == std::vector<std::uint64_t>{4});
  // Read back by 3 ranks, then by 1.
  for (int world : {3, 1}) {
    for (int r = 0; r < world; ++r) {
      auto [lo, hi] = slice(r, world);
      std::vector<float> part(hi - lo);
      std::uint64_t c0 = 0;
      ck::state st;
      st.add_shard("emb", std::span<float>(part), lo, global).add_value("counter", c0);
      REQUIRE(ck::storage::load_step(dir, 4, st, r).step == 4);
      CHECK(std::equal(part.begin(), part.end(), truth.begin() + static_cast<std::ptrdiff_t>(lo)));
      CHECK(c0 == 77);
    }
  }
}

TEST_CASE("the even partition tiles a buffer in rank order, and a partition that does not tile it is refused") {
  using ck::slice;
  CHECK(ck::partition_slices(ck::even_partition, "m", 10, 3) == std::vector<slice>{{0, 4}, {4, 3}, {7, 3}});
  CHECK(ck::partition_slices(ck::even_partition, "m", 2, 3) == std::vector<slice>{{0, 1}, {1, 1}, {2, 0}});
  CHECK(ck::partition_slices(ck::even_partition, "m", 0, 2) == std::vector<slice>{{0, 0}, {0, 0}});
  // Any order is fine as long as the slices tile the buffer: here rank 0 holds the tail.
  const ck::partition_fn reversed = [](std::uint64_t n, int r, int w) { return ck::even_partition(n, w - 1 - r, w); };
  CHECK(ck::partition_slices(reversed, "m", 10, 3) == std::vector<slice>{{7, 3}, {4, 3}, {0, 4}});
  const ck::partition_fn overlapping = [](std::uint64_t n, int r, int) { return slice{r == 0 ? 0u : n / 2 - 1, n / 2 + 1}; };
  const ck::partition_fn gapped = [](std::uint64_t n, int r, int) { return slice{r == 0 ? 0u : n / 2 + 1, n / 2 - 1}; };
  for (const auto* bad : {&overlapping, &gapped}) {
    const auto e = error_of([&] { (void)ck::partition_slices(*bad, "adam_m", 10, 2); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK(std::string(e.what()).find("sharded entry 'adam_m'") != std::string::npos);
  }
  CHECK(error_of([] { (void)ck::partition_slices(ck::even_partition, "m", 10, 0); }).code() == errc::invalid_argument);
}

TEST_CASE("a partitioned entry holds this rank's slice and follows the world when repartitioned") {
  std::vector<float> m;
  std::vector<double> user(100);  // storage the caller manages: slices of it are handed out
  std::uint64_t asked = 0;
  ck::state st;
  st.add_partitioned("m", m, 10, 1, 3).add_partitioned(
      "v",
      [&](std::uint64_t count) {
        asked = count;
        return std::span<double>(user.data(), static_cast<std::size_t>(count));
      },
      10, 1, 3);
  CHECK(m.size() == 3);
  CHECK(asked == 3);
  const auto* e = st.find("m");
  REQUIRE(e);
  CHECK(e->shard->offset == 4);
  CHECK(e->shard->global_count == 10);
  CHECK(e->bytes == 3 * sizeof(float));
  st.repartition(0, 2);  // the world became 2: rank 0 holds [0, 5)
  CHECK(m.size() == 5);
  CHECK(asked == 5);
  CHECK(st.find("m")->data == m.data());
  CHECK(st.find("m")->shard->offset == 0);
  CHECK(st.find("v")->bytes == 5 * sizeof(double));
  CHECK(error_of([&] { st.repartition(2, 2); }).code() == errc::invalid_argument);  // no rank 2 of 2
  CHECK(m.size() == 5);  // nothing changed
  ck::state bad;
  const auto e2 = error_of([&] {
    bad.add_partitioned("w", [&](std::uint64_t) { return std::span<double>(user.data(), 1); }, 10, 0, 2);
  });
  CHECK(e2.code() == errc::invalid_argument);
  CHECK(std::string(e2.what()).find("resize(5) returned 1 elements") != std::string::npos);
}

TEST_CASE("a checkpoint of partitioned state written by 4 ranks loads into 3 and into 5") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  const std::uint64_t global = 100003;
  std::vector<float> truth(global);
  std::iota(truth.begin(), truth.end(), 0.25f);
  // Rank 0 last: it commits once the others' parts are there.
  for (int r : {3, 2, 1, 0}) write_partitioned(dir, events, 9, truth, r, 4, 0);
  REQUIRE(ck::storage::list_steps(dir) == std::vector<std::uint64_t>{9});
  for (int world : {3, 5}) CHECK(load_partitioned(dir, 9, global, world).whole == truth);
}

TEST_CASE("rank 0 does not commit a step while another rank's part is missing") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  std::vector<float> part(10);
  ck::state st;
  st.add_shard("emb", std::span<float>(part), 0, 20);
  auto o = opts(dir, events, 0, 2);
  o.commit_timeout = std::chrono::milliseconds(200);
  ck::checkpointer c(st, o);
  c.snapshot(1);
  const auto e = error_of([&] { c.wait_durable(); });
  CHECK(e.code() == errc::timeout);
  CHECK(ck::storage::list_steps(dir).empty());
  CHECK(elastic::test::events_named(events, "checkpoint_failed").size() == 1);
}

TEST_CASE("set_world abandons a step still waiting for a rank of the old world, and the new world commits") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  std::vector<float> w(1000, 1.5f);
  std::uint64_t counter = 5;
  ck::state st;
  st.add("w", w).add_value("counter", counter);
  auto o = opts(dir, events, 0, 2);
  o.commit_timeout = std::chrono::seconds(60);
  ck::checkpointer c(st, o);
  c.snapshot(5);
  c.before_update();
  // Rank 0's part is written, then it waits for rank 1's, which never comes (rank 1 is gone).
  const auto own_part = fs::path(dir) / ck::format::pending_dir_name(5) / ck::format::rank_manifest_name(0);
  for (int i = 0; i < 2000 && !fs::exists(own_part); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto t0 = std::chrono::steady_clock::now();
  c.set_world(0, 1);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));  // not the 60 s commit timeout
  CHECK(c.rank() == 0);
  CHECK(c.world_size() == 1);
  CHECK(ck::storage::list_steps(dir).empty());
  const auto abandoned = elastic::test::events_named(events, "checkpoint_abandoned");
  REQUIRE(abandoned.size() == 1);
  CHECK(contains(abandoned[0], "\"step\":5"));
  CHECK(contains(abandoned[0], "the group changed"));
  CHECK(elastic::test::events_named(events, "checkpoint_failed").empty());
  CHECK_NOTHROW(c.wait_durable());
  CHECK(c.stats().abandoned == 1);
  CHECK(c.stats().failed == 0);
  // The new world of one commits on its own.
  counter = 6;
  c.snapshot(6);
  c.before_update();
  CHECK_NOTHROW(c.wait_durable());
  CHECK(steps_once(dir, {6}) == std::vector<std::uint64_t>{6});
  counter = 0;
  CHECK(ck::storage::load_step(dir, 6, st, 0).world_size == 1);
  CHECK(counter == 6);
}

TEST_CASE("rank 0 never commits a step from a part an earlier world left for it") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  std::vector<float> w0(1000, 1.0f), w1(1000, 1.0f);
  ck::state s0, s1;
  s0.add("w", w0);
  s1.add("w", w1);
  auto o0 = opts(dir, events, 0, 2), o1 = opts(dir, events, 1, 2);
  o0.commit_timeout = std::chrono::milliseconds(400);
  ck::checkpointer c0(s0, o0), c1(s1, o1);
  // Round 1's rank 1 wrote its part of step 5; that world then died before rank 0 committed.
  c1.set_world(1, 2, 1);
  c1.snapshot(5);
  c1.before_update();
  c1.wait_durable();
  // Round 2, the same size, went back to step 4 and reaches step 5 again: its rank 0 must not
  // take round 1's part for its own.
  c0.set_world(0, 2, 2);
  c1.set_world(1, 2, 2);
  w0[0] = w1[0] = 2.0f;
  c0.snapshot(5);
  c0.before_update();
  CHECK_THROWS_AS(c0.wait_durable(), elastic::error);
  CHECK(ck::storage::list_steps(dir).empty());
  const auto failed = elastic::test::events_named(events, "checkpoint_failed");
  REQUIRE(failed.size() == 1);
  CHECK(contains(failed[0], "an earlier world's: world size 2, epoch 1"));
  // Once round 2's rank 1 writes its part, the step commits, with round 2's bytes.
  c0.snapshot(5);
  c0.before_update();
  c1.snapshot(5);
  c1.before_update();
  c1.wait_durable();
  CHECK_NOTHROW(c0.wait_durable());
  REQUIRE(steps_once(dir, {5}) == std::vector<std::uint64_t>{5});
  w0[0] = 0;
  ck::storage::load_step(dir, 5, s0, 0);
  CHECK(w0[0] == 2.0f);
}

TEST_CASE("set_world after a repartition lays the staging out again, and the new world's step loads into any world") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  const std::uint64_t global = 100003;
  std::vector<float> truth(global);
  std::iota(truth.begin(), truth.end(), 0.75f);
  auto fill_slice = [&](const ck::state& st, std::vector<float>& m) {
    std::copy_n(truth.begin() + static_cast<std::ptrdiff_t>(st.find("adam_m")->shard->offset), m.size(), m.begin());
  };
  std::uint64_t counter = 42;
  std::vector<float> m;
  ck::state st;
  st.add_partitioned("adam_m", m, global, 1, 4).add_value("counter", counter);
  fill_slice(st, m);
  ck::checkpointer c(st, opts(dir, events, 1, 4));
  const std::size_t before = c.staging_bytes();
  // A snapshot of the old world, still being written while the world changes: its part keeps
  // the old slice, whatever the state says by then.
  c.snapshot(3);
  c.before_update();
  st.repartition(0, 3);  // rank 1 of 4 becomes rank 0 of 3: a larger slice
  fill_slice(st, m);
  CHECK(error_of([&] { c.snapshot(4); }).code() == errc::mismatch);  // the staging no longer fits
  c.set_world(0, 3);
  CHECK(c.rank() == 0);
  CHECK(c.world_size() == 3);
  CHECK(c.staging_bytes() > before);
  const auto old_part = ck::storage::read_rank_manifest(fs::path(dir) / ck::format::pending_dir_name(3), 1);
  CHECK(old_part.world_size == 4);
  REQUIRE(old_part.entries.at(0).shard);
  CHECK(old_part.entries.at(0).shard->offset == ck::even_partition(global, 1, 4).offset);
  // Ranks 1 and 2 of the new world write theirs; rank 0 commits.
  for (int r : {1, 2}) write_partitioned(dir, events, 7, truth, r, 3, counter);
  c.snapshot(7);
  c.before_update();
  c.wait_durable();
  REQUIRE(ck::storage::list_steps(dir) == std::vector<std::uint64_t>{7});
  for (int world : {3, 2}) {
    const auto loaded = load_partitioned(dir, 7, global, world);
    REQUIRE(loaded.written_by == 3);
    CHECK(loaded.counters == std::vector<std::uint64_t>(static_cast<std::size_t>(world), 42));
    REQUIRE(loaded.whole.size() == truth.size());
    CHECK(std::memcmp(loaded.whole.data(), truth.data(), truth.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("set_world refuses a rank outside the world, or a layout over the budget, and changes nothing") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  std::vector<float> m;
  ck::state st;
  st.add_partitioned("m", m, 4000, 1, 2);  // 2000 floats
  auto o = opts(dir, events, 1, 2);
  o.staging_budget = 9000;  // one slot of 8000 bytes
  ck::checkpointer c(st, o);
  REQUIRE(c.staging_bytes() == 8000);
  for (auto [rank, world] : {std::pair{-1, 2}, {2, 2}, {0, 0}, {3, 1}}) {
    // Copies: Clang before 16 cannot capture a structured binding (the ASan build is Clang).
    const auto e = error_of([&c, rank = rank, world = world] { c.set_world(rank, world); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK(contains(e.what(), "rank " + std::to_string(rank) + " of world size " + std::to_string(world)));
  }
  CHECK(c.rank() == 1);
  CHECK(c.world_size() == 2);
  st.repartition(0, 1);  // all 4000 floats: over the budget
  const auto e = error_of([&] { c.set_world(0, 1); });
  CHECK(e.code() == errc::capacity_exhausted);
  CHECK(contains(e.what(), "raise staging_budget"));
  CHECK(c.rank() == 1);
  CHECK(c.world_size() == 2);
  CHECK(c.staging_bytes() == 8000);
  st.repartition(1, 2);  // back to the world the checkpointer has: its snapshots work as before
  c.snapshot(1);
  c.before_update();
  CHECK_NOTHROW(c.wait_durable());
  CHECK(ck::storage::read_rank_manifest(fs::path(dir) / ck::format::pending_dir_name(1), 1).world_size == 2);
}

TEST_CASE("a full disk fails the write with a clear error and keeps the previous step") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  model a(1);
  save(a, dir, 1, events);
  // A child process whose file size limit is 100 KB: the kernel fails its writes (EFBIG) as a
  // full disk would (ENOSPC); both take the same path.
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{100 * 1024, 100 * 1024};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    try {
      model b(2);
      ck::checkpointer c(b.st, opts(dir, events));
      c.snapshot(2);
      c.wait_durable();
      std::_Exit(10);  // should have thrown
    } catch (const elastic::error& e) {
      std::_Exit(e.code() == errc::os_error && std::string(e.what()).find("cannot write") != std::string::npos ? 0 : 11);
    } catch (...) {
      std::_Exit(12);
    }
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(ck::storage::list_steps(dir) == std::vector<std::uint64_t>{1});
  const auto failed = elastic::test::events_named(events, "checkpoint_failed");
  REQUIRE(failed.size() == 1);
  CHECK(failed[0].find("File too large") != std::string::npos);
  model b(0), expect(1);
  ck::checkpointer c(b.st, opts(dir, events));
  CHECK(c.restore()->step == 1);
  CHECK(b.same_as(expect));
}

TEST_CASE("a staging budget too small for the state is refused up front") {
  elastic::test::temp_dir tmp;
  model a(1);
  auto o = opts(tmp.file("ckpt"), tmp.file("e"));
  o.staging_budget = 1000;
  const auto e = error_of([&] { ck::checkpointer c(a.st, o); });
  CHECK(e.code() == errc::capacity_exhausted);
  CHECK(std::string(e.what()).find("raise staging_budget") != std::string::npos);
  o.staging_budget = a.st.fixed_bytes() + 4096;  // room for one copy: no double buffering
  ck::checkpointer c(a.st, o);
  CHECK(c.staging_slots() == 1);
}

TEST_CASE("try_snapshot never waits for a slot: with none free it does nothing and says so") {
  elastic::test::temp_dir tmp;
  model a(3);
  auto o = opts(tmp.file("ckpt"), tmp.file("e"));
  o.staging_budget = a.st.fixed_bytes() + 4096;  // one slot: busy from snapshot() until durable
  ck::checkpointer c(a.st, o);
  REQUIRE(c.staging_slots() == 1);
  // Right after a snapshot its slot is still being copied and written, so the next try finds
  // none free; a machine fast enough to finish first just takes the snapshot, so try a few times.
  std::uint64_t step = 0, taken = 0, refused = 0;
  for (int i = 0; i < 20 && refused == 0; ++i) {
    c.snapshot(++step);
    ++taken;
    const auto before = c.stats().snapshots;
    if (c.try_snapshot(++step)) {
      ++taken;
      CHECK(c.stats().snapshots == before + 1);
    } else {
      ++refused;
      CHECK(c.stats().snapshots == before);  // nothing staged, nothing queued
      --step;
    }
    c.before_update();
  }
  CHECK(refused == 1);
  c.wait_durable();
  CHECK(c.stats().snapshots == taken);
  model b(0);
  ck::checkpointer r(b.st, opts(tmp.file("ckpt"), tmp.file("e")));
  REQUIRE(r.restore()->step == step);
  CHECK(b.same_as(a));
}

TEST_CASE("the interval policy keeps every_steps fixed without max_overhead, and guesses 10 with it") {
  using elastic::checkpoint::detail::interval_policy;
  CHECK(interval_policy(7, 0).interval() == 7);
  CHECK_FALSE(interval_policy(7, 0).adaptive());
  CHECK(interval_policy(0, 0).interval() == 0);
  CHECK(interval_policy(0, 0.1).interval() == 10);
  CHECK(interval_policy(4, 0.1).interval() == 4);
  // A fixed interval never changes, whatever the checkpoints cost.
  interval_policy fixed(5, 0);
  fixed.on_step(1.0, [] { return std::uint64_t{0}; });
  fixed.on_snapshot(10.0, 0);
  fixed.on_step(2.0, [] { return std::uint64_t{1}; });
  CHECK_FALSE(fixed.update_pending());
  CHECK_FALSE(fixed.update(100.0));
  CHECK(fixed.interval() == 5);
}

TEST_CASE("the interval policy charges a checkpoint its call and the excess of the steps it overlapped") {
  elastic::checkpoint::detail::interval_policy p(2, 0.1);
  p.on_step(1.0, [] { return std::uint64_t{0}; });  // undisturbed: the first step sets the average
  p.on_step(1.0, [] { return std::uint64_t{0}; });
  CHECK(p.step_seconds() == 1.0);
  p.on_snapshot(0.5, 0);
  p.on_snapshot(9.0, 1);  // a second snapshot while the first is tracked is not measured
  CHECK(p.cost_seconds() == 0.5);
  p.on_step(1.5, [] { return std::uint64_t{0}; });  // not done yet: 0.5 s excess
  CHECK_FALSE(p.update_pending());
  p.on_step(0.5, [] { return std::uint64_t{1}; });  // faster than usual: no negative charge; done now
  CHECK(p.cost_seconds() == 1.0);
  CHECK(p.step_seconds() == 1.0);  // steps during a checkpoint do not move the average
  REQUIRE(p.update_pending());
  // cost 1 s / (0.1 * 1 s) = every 10 steps, unless persistence is slower than that.
  CHECK(p.update(3.0));
  CHECK(p.interval() == 10);
  CHECK_FALSE(p.update_pending());
  CHECK_FALSE(p.update(3.0));  // nothing pending: no change
}

TEST_CASE("the interval policy checkpoints no more often than persistence keeps up with, and at least every step") {
  elastic::checkpoint::detail::interval_policy p(10, 0.5);
  p.on_step(2.0, [] { return std::uint64_t{0}; });
  p.on_snapshot(0.01, 0);
  p.on_step(2.0, [] { return std::uint64_t{1}; });
  CHECK(p.update(30.0));  // persisting takes 15 steps
  CHECK(p.interval() == 15);
  p.on_snapshot(0.01, 1);
  p.on_step(2.0, [] { return std::uint64_t{2}; });
  CHECK(p.update(0.0));  // cheap: 0.01 / (0.5 * 2) rounds up to 1
  CHECK(p.interval() == 1);
  p.on_snapshot(0.01, 2);
  p.on_step(2.0, [] { return std::uint64_t{3}; });
  CHECK_FALSE(p.update(0.0));  // the same interval again is no change
}

namespace {

/// The loop's side of the group contract, scripted: which steps fail, which step the group
/// hands back at a safe point, and whether this rank writes. The real group over real processes
/// is tests/test_elastic_group.cpp; this pins down what the loop does with each answer.
struct scripted_group final : elastic::group_hook {
  std::vector<std::uint64_t> fail_steps;  // the collective of these step indices fails once
  std::optional<std::pair<std::uint64_t, std::uint64_t>> jump;  // at safe point of step a, go to b
  bool writer = true;
  std::vector<std::uint64_t> safe_points;
  bool failed = false;
  std::uint64_t safe_point(std::uint64_t step, ck::state&) override {
    safe_points.push_back(step);
    failed = false;
    if (jump && jump->first == step) {
      const auto to = jump->second;
      jump.reset();
      return to;
    }
    return step;
  }
  bool step_failed() const noexcept override { return failed; }
  bool writes_checkpoints() const noexcept override { return writer; }
  void run_step(std::uint64_t index) {
    auto it = std::find(fail_steps.begin(), fail_steps.end(), index);
    if (it != fail_steps.end()) {
      failed = true;
      fail_steps.erase(it);
    }
  }
};

}  // namespace

TEST_CASE("a loop with a group redoes failed steps, takes the group's step, and only the writer checkpoints") {
  elastic::test::temp_dir d;
  const std::string events = d.file("events.jsonl");
  model m(1);
  scripted_group g;
  g.fail_steps = {3, 7};
  g.jump = std::make_pair(std::uint64_t{5}, std::uint64_t{9});  // a rebuild hands rank 0's step 9
  {
    elastic::training_loop loop({.dir = d.file("ck"), .steps = 12, .every_steps = 4, .handle_signals = false,
                                 .events = elastic::event_log::to_file(events), .group = &g},
                                m.st);
    std::vector<std::uint64_t> bodies;
    for (auto& step : loop) {
      bodies.push_back(step.index());
      g.run_step(step.index());
    }
    // 0 1 2 3(failed) 3 4 5 -> 9 10 11: steps 6..8 were done by the group before us.
    CHECK(bodies == std::vector<std::uint64_t>{0, 1, 2, 3, 3, 4, 9, 10, 11});
    CHECK(loop.redone_steps() == 1);
    CHECK(loop.completed_steps() == 12);
    CHECK(loop.reason() == elastic::loop_reason::finished);
  }
  CHECK(g.safe_points.size() == 9);  // one before every step body
  const auto steps = ck::storage::list_steps(d.file("ck"));
  CHECK(std::find(steps.begin(), steps.end(), 12u) != steps.end());
  CHECK(elastic::test::events_named(events, "loop_resynced").size() == 1);

  // A rank that does not write leaves the directory alone, even at the end.
  model other(2);
  scripted_group reader;
  reader.writer = false;
  {
    elastic::training_loop loop({.dir = d.file("ck2"), .steps = 8, .every_steps = 2, .handle_signals = false,
                                 .events = elastic::event_log::to_file(events), .group = &reader},
                                other.st);
    for (auto& step : loop) (void)step;
    CHECK(loop.completed_steps() == 8);
  }
  CHECK(ck::storage::list_steps(d.file("ck2")).empty());
}

TEST_CASE("retention keeps the newest valid steps, moves unreadable ones aside, and never deletes a step at or after "
          "the one resumed from or committed") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  model a(1);
  for (int s : {1, 2, 3}) {
    a.fill(s);
    save(a, dir, static_cast<std::uint64_t>(s), events);
  }
  elastic::test::flip_byte(fs::path(step_dir(dir, 3)) / "manifest.json", 30);
  fs::create_directory(fs::path(dir) / "corrupt-step-000000000003");  // the name is taken: -2 is used
  auto o = opts(dir, events);
  o.keep_last = 2;
  model b(0), expect(2);
  ck::checkpointer c(b.st, o);
  // The unreadable newest step is moved aside at restore instead of shadowing the others.
  REQUIRE(c.restore()->step == 2);
  CHECK(b.same_as(expect));
  CHECK(fs::is_directory(fs::path(dir) / "corrupt-step-000000000003-2"));
  CHECK(ck::storage::list_steps(dir) == std::vector<std::uint64_t>{2, 1});

  // An unreadable step that turns up later is moved aside by retention and not counted.
  fs::create_directory(step_dir(dir, 9));
  std::ofstream(fs::path(step_dir(dir, 9)) / "manifest.json") << "{\"not\": \"a manifest\"}";
  c.snapshot(4);
  c.wait_durable();
  CHECK(steps_once(dir, {4, 2}) == std::vector<std::uint64_t>{4, 2});
  CHECK(fs::is_directory(fs::path(dir) / "corrupt-step-000000000009"));

  // Valid steps newer than ours (another writer's) count toward keep_last, but never push out the
  // step this run committed; older ones go.
  {
    model x(7);
    auto ox = opts(dir, events);
    ox.keep_last = 10;
    ck::checkpointer other(x.st, ox);
    other.snapshot(40);
    other.snapshot(50);
    other.wait_durable();
  }
  c.snapshot(5);
  c.wait_durable();
  CHECK(steps_once(dir, {50, 40, 5}) == std::vector<std::uint64_t>{50, 40, 5});

  const auto moved = elastic::test::events_named(events, "checkpoint_quarantined");
  REQUIRE(moved.size() == 2);
  CHECK(contains(moved[0], "\"step\":3"));
  CHECK(contains(moved[0], "corrupt-step-000000000003-2"));
  CHECK(contains(moved[1], "\"step\":9"));
  CHECK(contains(moved[1], "\"reason\":"));
  // Quarantined steps are never deleted.
  CHECK(fs::exists(fs::path(dir) / "corrupt-step-000000000003"));
  CHECK(fs::exists(fs::path(dir) / "corrupt-step-000000000009"));
}

TEST_CASE("a checkpoint directory that cannot be listed is an error naming it, never a fresh start") {
  elastic::test::temp_dir tmp;
  const auto file = tmp.file("ckpt");
  std::ofstream(file) << "not a directory";
  const auto e = error_of([&] { (void)ck::storage::list_steps(file); });
  CHECK(e.code() == errc::os_error);
  CHECK(contains(e.what(), file));
  CHECK(contains(e.what(), "cannot be read"));
  model b(0);
  CHECK(error_of([&] { (void)ck::storage::restore_newest(file, b.st, 0); }).code() == errc::os_error);
  // Only a directory that does not exist is a fresh start.
  CHECK(ck::storage::list_steps(tmp.file("missing")).empty());
}

TEST_CASE("wait_durable throws only when the newest snapshot failed, not for a failure a later commit superseded") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  model a(1);
  ck::checkpointer c(a.st, opts(dir, events));
  // A path that is briefly a file: step 1's pending directory cannot be made.
  std::ofstream(fs::path(dir) / ck::format::pending_dir_name(1)) << "in the way";
  c.snapshot(1);
  c.before_update();
  c.snapshot(2);
  c.before_update();
  CHECK_NOTHROW(c.wait_durable());
  CHECK(c.stats().failed == 1);
  CHECK(elastic::test::events_named(events, "checkpoint_failed").size() == 1);
  CHECK(steps_once(dir, {2}) == std::vector<std::uint64_t>{2});

  // A failed newest snapshot is reported, for as long as it is the newest.
  std::ofstream(fs::path(dir) / ck::format::pending_dir_name(3)) << "in the way";
  c.snapshot(3);
  const auto e = error_of([&] { c.wait_durable(); });
  CHECK(e.code() == errc::os_error);
  CHECK(contains(e.what(), ck::format::pending_dir_name(3)));
  CHECK(error_of([&] { (void)c.wait_durable_for(std::chrono::seconds(30)); }).code() == errc::os_error);
  c.snapshot(4);
  CHECK_NOTHROW(c.wait_durable());
  CHECK(steps_once(dir, {4, 2}) == std::vector<std::uint64_t>{4, 2});
}

TEST_CASE("links left in a pending directory of ours are replaced, never written through") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  const auto secret = tmp.file("secret");
  std::ofstream(secret) << "keep me";
  const fs::path pending = fs::path(dir) / ck::format::pending_dir_name(1);
  fs::create_directories(pending);
  for (const char* name : {"rank-00000.data", "rank-00000.json", ".tmp.rank-00000.json", "manifest.json", ".tmp.manifest.json"}) {
    fs::create_symlink(secret, pending / name);
  }
  model a(1), expect(1);
  {
    ck::checkpointer c(a.st, opts(dir, events));
    c.snapshot(1);
    c.wait_durable();
  }
  CHECK(read_all(secret) == "keep me");
  model b(0);
  ck::checkpointer c(b.st, opts(dir, events));
  REQUIRE(c.restore()->step == 1);
  CHECK(b.same_as(expect));
}

TEST_CASE("a pending directory planted by another user is refused, and nothing is written through its links") {
  const auto other = elastic::test::require_other_user();
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  // A shared checkpoint directory like /tmp: anyone may create names in it, the sticky bit keeps
  // them from renaming ours.
  fs::create_directory(dir);
  REQUIRE(::chmod(dir.c_str(), 01777) == 0);
  const auto secret = tmp.file("secret");
  std::ofstream(secret) << "root only";
  REQUIRE(::chmod(secret.c_str(), 0600) == 0);
  const fs::path pending = fs::path(dir) / ck::format::pending_dir_name(1);
  fs::create_directory(pending);
  REQUIRE(::chmod(pending.c_str(), 0777) == 0);
  REQUIRE(::chown(pending.c_str(), other.uid, other.gid) == 0);
  for (const char* name : {"rank-00000.data", "rank-00000.json", ".tmp.rank-00000.json", "manifest.json", ".tmp.manifest.json"}) {
    fs::create_symlink(secret, pending / name);
    REQUIRE(::lchown((pending / name).c_str(), other.uid, other.gid) == 0);
  }
  model a(1);
  ck::checkpointer c(a.st, opts(dir, events));
  c.snapshot(1);
  const auto e = error_of([&] { c.wait_durable(); });
  CHECK(e.code() == errc::unsafe_path);
  CHECK(contains(e.what(), pending.string()));
  CHECK(contains(e.what(), "belongs to uid " + std::to_string(other.uid)));
  CHECK(read_all(secret) == "root only");
  CHECK(ck::storage::list_steps(dir).empty());
  const auto failed = elastic::test::events_named(events, "checkpoint_failed");
  REQUIRE(failed.size() == 1);
  CHECK(contains(failed[0], "unsafe_path"));
}

TEST_CASE("a symbolic link planted in a committed step is not read through: the step is skipped and moved aside") {
  elastic::test::temp_dir tmp;
  const auto dir = tmp.file("ckpt"), events = tmp.file("events.jsonl");
  model a(1);
  save(a, dir, 1, events);
  a.fill(2);
  save(a, dir, 2, events);
  // The same bytes, reached through a link: a reader that follows links would load step 2.
  fs::create_directory(tmp.file("elsewhere"));
  fs::rename(fs::path(step_dir(dir, 2)) / "rank-00000.json", tmp.file("elsewhere/rank-00000.json"));
  fs::create_symlink(tmp.file("elsewhere/rank-00000.json"), fs::path(step_dir(dir, 2)) / "rank-00000.json");
  model b(0), expect(1);
  ck::checkpointer c(b.st, opts(dir, events));
  REQUIRE(c.restore()->step == 1);
  CHECK(b.same_as(expect));
  const auto skipped = elastic::test::events_named(events, "checkpoint_skipped");
  REQUIRE(skipped.size() == 1);
  CHECK(contains(skipped[0], "unsafe_path"));
  CHECK(fs::is_directory(fs::path(dir) / "corrupt-step-000000000002"));
  CHECK(ck::storage::list_steps(dir) == std::vector<std::uint64_t>{1});
}

TEST_CASE("an object whose save throws fails that snapshot only: the next one is taken and the checkpointer ends", "[checkpoint]") {
  elastic::test::temp_dir dir;
  std::vector<float> w(1024, 1.0f);
  bool refuse = true;
  ck::state st;
  st.add("w", w);
  st.add_object(
      "guard",
      [&refuse](std::vector<std::byte>& out) {
        if (refuse) throw elastic::error(errc::invalid_argument, "not now");
        out.assign(3, std::byte{7});
      },
      [](std::span<const std::byte>) {});
  {
    ck::checkpointer c(st, opts(dir.path(), dir.file("events.jsonl")));
    CHECK(error_of([&] { c.snapshot(1); }).code() == errc::invalid_argument);
    refuse = false;
    c.snapshot(2);  // the slot the failed one took is free again
    c.wait_durable();
  }  // and the destructor does not wait for it
  ck::checkpointer c(st, opts(dir.path(), dir.file("events.jsonl")));
  const auto m = c.restore();
  REQUIRE(m);
  CHECK(m->step == 2);
}
