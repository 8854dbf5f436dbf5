// Checkpoints in object storage (checkpoint/detail/s3_steps.hpp) against a real S3 server:
// Ceph's radosgw on a one-node cluster started once for the file (tests/support/radosgw_server.hpp),
// each case in a bucket of its own. Round trips through the checkpointer (multipart, ranged
// parallel reads), the commit without rename (If-None-Match: two writers never both commit),
// damage (a flipped byte, a truncated or missing object) skipped with an event and moved aside,
// retention (manifest first) and the sweep of uploads a crash left open, and the errors a user
// meets first: no bucket, wrong keys, no server.
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <elastic/checkpoint.hpp>
#include <elastic/checkpoint/detail/s3_retention.hpp>
#include <elastic/checkpoint/detail/s3_step_loading.hpp>
#include <elastic/checkpoint/detail/s3_steps.hpp>

#include "support/catch.hpp"
#include "support/errors.hpp"
#include "support/radosgw_server.hpp"

namespace ck = elastic::checkpoint;
namespace objects = elastic::checkpoint::detail::objects;
using elastic::errc;
using elastic::test::error_of;

namespace {

/// The file's one server (started at first use, ~12 s), with the environment pointing at it.
elastic::test::radosgw_server* server() {
  static const auto s = [] {
    auto p = std::make_unique<elastic::test::radosgw_server>();
    if (p->available()) {
      ::setenv("AWS_ENDPOINT_URL", p->endpoint().c_str(), 1);
      ::setenv("AWS_ACCESS_KEY_ID", elastic::test::radosgw_server::access_key, 1);
      ::setenv("AWS_SECRET_ACCESS_KEY", elastic::test::radosgw_server::secret_key, 1);
      ::setenv("AWS_REGION", "us-east-1", 1);
    }
    return p;
  }();
  return s->available() ? s.get() : nullptr;
}

#define NEED_SERVER()                                         \
  if (server() == nullptr) {                                  \
    WARN("skipped: no S3 server here: " << [] {               \
      static elastic::test::radosgw_server probe;             \
      return probe.why();                                     \
    }());                                                     \
    return;                                                   \
  }

/// A fresh bucket; returns s3://BUCKET/PREFIX.
std::string fresh_dir(const std::string& prefix = "run/ckpt") {
  static int n = 0;
  const std::string bucket = "ckpt-" + std::to_string(++n);
  objects::object_dir d("s3://" + bucket);
  d.client().create_bucket();
  return "s3://" + bucket + "/" + prefix;
}

struct model {
  std::vector<float> w;
  std::vector<double> m = std::vector<double>(1000);
  std::uint64_t step = 0;
  std::string note;
  ck::state st;

  explicit model(std::size_t floats = 300000, int seed = 0) : w(floats) {
    fill(seed);
    st.add("w", w).add("m", m).add_value("step", step).add_object("note", note);
  }
  void fill(int seed) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i * 7 + static_cast<std::size_t>(seed));
    for (std::size_t i = 0; i < m.size(); ++i) m[i] = static_cast<double>(i) / 3.0 + seed;
    step = static_cast<std::uint64_t>(seed);
    note = "seed-" + std::to_string(seed);
  }
  bool same_as(const model& o) const { return w == o.w && m == o.m && step == o.step && note == o.note; }
};

ck::checkpointer_options opts(const std::string& dir, const std::string& events = {}, std::size_t keep = 3) {
  return {.dir = dir,
          .keep_last = keep,
          .rank = 0,
          .world_size = 1,
          .run_id = "s3-test",
          .commit_timeout = std::chrono::seconds(20),
          .chunk_bytes = 1 << 20,
          .events = events.empty() ? elastic::event_log() : elastic::event_log::to_file(events)};
}

void save(model& m, const std::string& dir, std::uint64_t step, const std::string& events = {}, std::size_t keep = 3) {
  ck::checkpointer c(m.st, opts(dir, events, keep));
  c.snapshot(step);
  c.before_update();
  c.wait_durable();
}

std::vector<std::string> names(const std::string& dir) {
  objects::object_dir d(dir);
  std::vector<std::string> out;
  for (const auto& o : d.client().list()) out.push_back(o.name);
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("object storage: a step saved to s3:// restores bit-identical, large data in parallel parts") {
  NEED_SERVER();
  const std::string dir = fresh_dir();
  model a(6'000'000, 3);  // 24 MB of floats: a multipart upload of two 16 MiB parts
  save(a, dir, 40);
  const auto listed = names(dir);
  CHECK(std::find(listed.begin(), listed.end(), "step-000000000040/manifest.json") != listed.end());
  CHECK(std::find(listed.begin(), listed.end(), "step-000000000040/w1-e0/rank-00000.data") != listed.end());

  model b(6'000'000, 0);
  ck::checkpointer c(b.st, opts(dir));
  const auto m = c.restore();
  REQUIRE(m.has_value());
  CHECK(m->step == 40);
  CHECK(b.same_as(a));
}

TEST_CASE("object storage: a flipped byte, a truncated or a missing object is skipped with an event and moved aside") {
  NEED_SERVER();
  elastic::test::temp_dir tmp;
  const std::string events = tmp.file("events.jsonl");
  for (const std::string damage : {"flip", "truncate", "missing"}) {
    DYNAMIC_SECTION(damage) {
      const std::string dir = fresh_dir();
      model a(300000, 1);
      save(a, dir, 10);
      a.fill(2);
      save(a, dir, 20);
      objects::object_dir d(dir);
      const std::string data = "step-000000000020/w1-e0/rank-00000.data";
      auto bytes = d.client().get(data);
      REQUIRE(bytes.has_value());
      if (damage == "flip") {
        (*bytes)[5000] = static_cast<char>((*bytes)[5000] ^ 0x40);
        d.client().put(data, *bytes);
      } else if (damage == "truncate") {
        d.client().put(data, std::string_view(*bytes).substr(0, bytes->size() / 2));
      } else {
        d.client().erase(data);
      }
      model b(300000, 0);
      ck::checkpointer c(b.st, opts(dir, events));
      const auto m = c.restore();
      REQUIRE(m.has_value());
      CHECK(m->step == 10);
      model expect(300000, 1);
      CHECK(b.same_as(expect));
      const std::string said = slurp(events);
      CHECK(said.find("\"checkpoint_skipped\"") != std::string::npos);
      CHECK(said.find("\"checkpoint_quarantined\"") != std::string::npos);
      const auto listed = names(dir);
      CHECK(std::find(listed.begin(), listed.end(), "step-000000000020/manifest.json") == listed.end());
      CHECK(std::find(listed.begin(), listed.end(), "corrupt-step-000000000020/manifest.json") != listed.end());
    }
  }
}

TEST_CASE("object storage: of two writers of one step only one commits; a retried commit of the same parts is no conflict") {
  NEED_SERVER();
  const std::string dir = fresh_dir();
  model a(1000, 1);
  save(a, dir, 5);
  objects::object_dir d(dir);
  ck::format::step_manifest mine;
  mine.step = 5;
  mine.world_size = 1;
  mine.run_id = "s3-test";
  mine.time = "2100-01-01T00:00:00Z";
  // The same run and parts again (our own write whose answer was lost): committed.
  CHECK(objects::commit_step(d, mine, std::chrono::seconds(5)));
  // Another run's writer, live: refused, the step left as it was.
  auto other = mine;
  other.run_id = "another-job";
  CHECK(error_of([&] { (void)objects::commit_step(d, other, std::chrono::seconds(5), {}, nullptr, 0, "2000-01-01T00:00:00Z"); }).code() ==
        errc::mismatch);
  // ...unless that step was written before this writer started (an earlier incarnation's).
  // (The parts it names are run s3-test's, so this writer waits for parts of its own run.)
}

TEST_CASE("object storage: retention keeps the newest steps, and sweeps parts and uploads a crash left") {
  NEED_SERVER();
  const std::string dir = fresh_dir();
  objects::object_dir d(dir);
  // What a writer killed during step 15 leaves: a part without a manifest, an upload left open.
  d.client().put("step-000000000015/w1-e0/rank-00000.data", std::string(100, 'x'));
  const std::string upload = d.client().start_upload("step-000000000015/w1-e0/rank-00001.data");
  model a(1000, 1);
  for (std::uint64_t s = 10; s <= 40; s += 10) save(a, dir, s, {}, 2);
  const auto listed = names(dir);
  std::vector<std::string> manifests;
  for (const auto& n : listed) {
    if (n.ends_with("manifest.json")) manifests.push_back(n);
    CHECK_FALSE(n.starts_with("step-000000000010/"));
    CHECK_FALSE(n.starts_with("step-000000000015/"));
    CHECK_FALSE(n.starts_with("step-000000000020/"));
  }
  CHECK(manifests == std::vector<std::string>{"step-000000000030/manifest.json", "step-000000000040/manifest.json"});
  CHECK(d.client().uploads().empty());
}

TEST_CASE("object storage: a rank's part that never comes leaves the step uncommitted and says which rank") {
  NEED_SERVER();
  const std::string dir = fresh_dir();
  model a(1000, 1);
  auto o = opts(dir);
  o.world_size = 2;
  o.commit_timeout = std::chrono::milliseconds(800);
  ck::checkpointer c(a.st, o);
  c.snapshot(7);
  c.before_update();
  const auto e = error_of([&] { c.wait_durable(); });
  CHECK(e.code() == errc::timeout);
  CHECK(e.message().find("rank 1") != std::string::npos);
  const auto listed = names(dir);
  CHECK(std::find(listed.begin(), listed.end(), "step-000000000007/manifest.json") == listed.end());
}

TEST_CASE("object storage: no bucket, wrong keys and no server are refused up front, saying what to fix") {
  NEED_SERVER();
  model a(1000, 1);
  const auto none = error_of([&] { ck::checkpointer c(a.st, opts("s3://no-such-bucket/x")); });
  CHECK(none.code() == errc::not_found);
  CHECK(none.message().find("create the bucket") != std::string::npos);

  const std::string dir = fresh_dir();
  const std::string secret = std::getenv("AWS_SECRET_ACCESS_KEY");
  ::setenv("AWS_SECRET_ACCESS_KEY", "wrong", 1);
  const auto keys = error_of([&] { ck::checkpointer c(a.st, opts(dir)); });
  ::setenv("AWS_SECRET_ACCESS_KEY", secret.c_str(), 1);
  CHECK(keys.code() == errc::invalid_argument);
  CHECK(keys.message().find("keys are wrong") != std::string::npos);

  const std::string endpoint = std::getenv("AWS_ENDPOINT_URL");
  ::setenv("AWS_ENDPOINT_URL", ("http://127.0.0.1:" + std::to_string(elastic::test::free_port())).c_str(), 1);
  objects::client_options quick;
  quick.unavailable_timeout = std::chrono::milliseconds(500);
  const auto down = error_of([&] { objects::object_dir d(dir, quick); (void)d.client().list(); });
  ::setenv("AWS_ENDPOINT_URL", endpoint.c_str(), 1);
  CHECK(down.code() == errc::unavailable);
}
