// Checkpoints in object storage, each next to the same bytes moved by curl (its own SigV4,
// `--aws-sigv4`) against the same server in the same iteration:
//   BM_s3_persist/MiB    snapshot to committed step in s3:// (multipart, parallel parts) vs
//                        `curl -T` of the same bytes from memory (/dev/shm) as one PUT
//   BM_s3_restore/MiB    restore() (list, manifests, ranged GETs in parallel, every chunk
//                        verified, then copied into the state) vs `curl -o /dev/null` of the
//                        step's data object
//   BM_s3_final/MiB      a training_loop told to stop (what a preemption notice does) until
//                        its final checkpoint is committed and the loop has ended
//
// The server: a one-node Ceph radosgw on loopback that the benchmark starts
// (tests/support/radosgw_up.sh; Debian: radosgw ceph-mon ceph-osd), or the one that
// AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY name when --use-env is given.
//   s3_bench [--use-env] [google benchmark flags]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include <elastic/checkpoint.hpp>
#include <elastic/checkpoint/detail/s3_steps.hpp>

#include "bench_common.hpp"
#include "support/radosgw_server.hpp"

namespace ck = elastic::checkpoint;
namespace objects = elastic::checkpoint::detail::objects;
using elastic::bench::clock_type;
using elastic::bench::filled;
using elastic::bench::median;
using elastic::bench::since;

namespace {

std::string g_bucket_url;  // s3://BUCKET

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

/// curl with its own SigV4 (curl 7.75+; x-amz-content-sha256 sent by hand, as S3 servers want it).
double curl(const std::string& args) {
  const std::string cmd = "curl -fsS --aws-sigv4 'aws:amz:" + env("AWS_REGION") + ":s3' --user '" +
                          env("AWS_ACCESS_KEY_ID") + ":" + env("AWS_SECRET_ACCESS_KEY") +
                          "' -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' " + args;
  const auto t0 = clock_type::now();
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
  return since(t0);
}

/// s3://BUCKET/NAME as the http URL curl is given.
std::string http_url(const std::string& name) {
  return env("AWS_ENDPOINT_URL") + "/" + g_bucket_url.substr(5) + "/" + name;
}

/// Throughputs of ours and curl's (medians) and curl's time over ours.
void report(benchmark::State& state, std::size_t bytes, const elastic::bench::paired_runs& runs) {
  state.counters["ours_MB_s"] = static_cast<double>(bytes) / median(runs.ours) / 1e6;
  state.counters["curl_MB_s"] = static_cast<double>(bytes) / median(runs.ref) / 1e6;
  state.counters["x_curl"] = median(runs.ratio);
}

ck::checkpointer_options opts(const std::string& dir) {
  return {.dir = dir, .keep_last = 1, .rank = 0, .world_size = 1, .run_id = "bench", .events = elastic::event_log()};
}

void BM_s3_persist_body(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) << 20;
  auto src = filled(bytes);
  ck::state st;
  st.add("state", std::span<std::byte>(src.get(), bytes));
  const std::string prefix = "persist-" + std::to_string(state.range(0));
  const std::string file = "/dev/shm/elastic-s3-bench-" + std::to_string(::getpid());
  std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(src.get()), static_cast<std::streamsize>(bytes));
  elastic::bench::paired_runs runs;
  std::uint64_t step = 0;
  {
    ck::checkpointer c(st, opts(g_bucket_url + "/" + prefix));
    for (auto _ : state) {
      auto persist = [&] { return elastic::bench::persist_seconds(c, ++step); };
      state.SetIterationTime(runs.run(persist, [&] { return curl("-T " + file + " " + http_url(prefix + "-curl.bin")); }));
    }
  }
  std::filesystem::remove(file);
  report(state, bytes, runs);
}

void BM_s3_restore_body(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) << 20;
  auto src = filled(bytes);
  ck::state st;
  st.add("state", std::span<std::byte>(src.get(), bytes));
  const std::string prefix = "restore-" + std::to_string(state.range(0));
  const std::string dir = g_bucket_url + "/" + prefix;
  {
    ck::checkpointer c(st, opts(dir));
    c.snapshot(1);
    c.wait_durable();
  }
  const std::string data = prefix + "/" + ck::format::step_dir_name(1) + "/" + objects::object_dir::parts_folder("bench", 1, 0) +
                           "/" + ck::format::rank_data_name(0);
  elastic::bench::paired_runs runs;
  for (auto _ : state) {
    auto restore = [&] {
      std::memset(src.get(), 0, bytes);
      ck::checkpointer c(st, opts(dir));  // allocates staging once, as a trainer does at start
      const auto t0 = clock_type::now();
      if (!c.restore()) throw std::runtime_error("nothing restored");
      return since(t0);
    };
    state.SetIterationTime(runs.run(restore, [&] { return curl("-o /dev/null " + http_url(data)); }));
  }
  report(state, bytes, runs);
}

void BM_s3_final_body(benchmark::State& state) {
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)) << 20;
  auto src = filled(bytes);
  ck::state st;
  st.add("state", std::span<std::byte>(src.get(), bytes));
  int run = 0;
  std::vector<double> took;
  for (auto _ : state) {
    const std::string dir = g_bucket_url + "/final-" + std::to_string(state.range(0)) + "-" + std::to_string(++run);
    elastic::training_loop loop({.dir = dir, .steps = 1000, .every_steps = 1000, .handle_signals = false,
                                 .events = elastic::event_log()},
                                st);
    clock_type::time_point t0;
    for (auto step : loop) {
      if (step.index() == 3) {
        t0 = clock_type::now();
        loop.stop();
      }
    }
    const double s = since(t0);
    state.SetIterationTime(s);
    took.push_back(s);
  }
  state.counters["final_s"] = median(took);
  state.counters["MB_in_15s"] = static_cast<double>(bytes) / median(took) / 1e6 * 15;
}

/// A failure (the server full or gone) ends that benchmark with its message, not the program.
template <void (*Body)(benchmark::State&)>
void guarded(benchmark::State& state) {
  try {
    Body(state);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool use_env = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--use-env") == 0) {
      use_env = true;
      for (int j = i; j + 1 < argc; ++j) argv[j] = argv[j + 1];
      --argc;
      break;
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::unique_ptr<elastic::test::radosgw_server> server;
  if (!use_env) {
    server = std::make_unique<elastic::test::radosgw_server>();
    if (!server->available()) {
      std::fprintf(stderr, "s3_bench: no S3 server: %s\n", server->why().c_str());
      return 77;
    }
    ::setenv("AWS_ENDPOINT_URL", server->endpoint().c_str(), 1);
    ::setenv("AWS_ACCESS_KEY_ID", elastic::test::radosgw_server::access_key, 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", elastic::test::radosgw_server::secret_key, 1);
  }
  if (env("AWS_REGION").empty()) ::setenv("AWS_REGION", "us-east-1", 1);
  g_bucket_url = "s3://elastic-bench-" + std::to_string(::getpid());
  objects::object_dir(g_bucket_url).client().create_bucket();
  for (long mib : {64L, 256L}) {
    benchmark::RegisterBenchmark(("BM_s3_persist/" + std::to_string(mib)).c_str(), guarded<BM_s3_persist_body>)
        ->Arg(mib)->Iterations(mib >= 256 ? 4 : 8)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_s3_restore/" + std::to_string(mib)).c_str(), guarded<BM_s3_restore_body>)
        ->Arg(mib)->Iterations(mib >= 256 ? 4 : 8)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_s3_final/" + std::to_string(mib)).c_str(), guarded<BM_s3_final_body>)
        ->Arg(mib)->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
