// Checkpointed training that survives a preemption notice and a hard kill, and ends with the
// same weights, bit for bit, as a run that was never disturbed.
//
//   train_resume                 the demo: runs the trainer four times and compares
//   train_resume --train DIR N   one trainer process (what a real job runs)
//
// The model is a small two-layer MLP classifying a synthetic two-spiral dataset (generated from
// a fixed seed: no dataset ships with Debian that fits here). Its state is registered once:
// weights and momentum (host buffers), the RNG and step counter (values), and the data loader
// cursor (an object with an elastic_checkpoint() hook).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <elastic/checkpoint.hpp>
#include <elastic/crc32c.hpp>

// "SIGKILL" for 9; glibc names every signal it knows.
static std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

namespace {

constexpr int in = 2, hidden = 64, classes = 2, batch = 32, samples = 4096;

/// The two-spiral dataset, the same every time.
struct dataset {
  std::vector<float> x;
  std::vector<int> y;
  dataset() : x(samples * in), y(samples) {
    std::mt19937 g(7);
    std::normal_distribution<float> noise(0.0f, 0.15f);
    for (int i = 0; i < samples; ++i) {
      const int c = i % 2;
      const float t = 0.5f + 3.5f * static_cast<float>(i / 2) / (samples / 2);
      const float sign = c ? -1.0f : 1.0f;
      x[i * in] = sign * t * std::cos(2.5f * t) / 4 + noise(g) / 4;
      x[i * in + 1] = sign * t * std::sin(2.5f * t) / 4 + noise(g) / 4;
      y[i] = c;
    }
  }
};

/// Which samples come next: an epoch counter and a shuffled order, checkpointed as an object.
struct loader {
  std::uint64_t epoch = 0, cursor = 0;
  std::vector<std::uint32_t> order;
};
template <class Archive>
void elastic_checkpoint(Archive& ar, loader& l) {
  ar(l.epoch, l.cursor, l.order);
}

struct mlp {
  std::vector<float> w1 = std::vector<float>(in * hidden), b1 = std::vector<float>(hidden);
  std::vector<float> w2 = std::vector<float>(hidden * classes), b2 = std::vector<float>(classes);
  std::vector<float> v1 = std::vector<float>(w1.size()), v2 = std::vector<float>(w2.size());
  std::vector<float> vb1 = std::vector<float>(hidden), vb2 = std::vector<float>(classes);
};

std::uint32_t checksum(const mlp& m) {
  std::uint32_t c = 0;
  for (const auto* v : {&m.w1, &m.b1, &m.w2, &m.b2, &m.v1, &m.v2, &m.vb1, &m.vb2})
    c = elastic::crc32c(std::as_bytes(std::span(*v)), c);
  return c;
}

int train(const std::string& dir, std::uint64_t steps) {
  const dataset data;
  mlp m;
  std::mt19937_64 init(1234);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  for (auto& w : m.w1) w = n01(init) * 0.7f;
  for (auto& w : m.w2) w = n01(init) * 0.2f;
  std::uint64_t rng = 99, step = 0;
  loader l;
  l.order.resize(samples);
  for (std::uint32_t i = 0; i < samples; ++i) l.order[i] = i;

  elastic::checkpoint::state st;
  st.add("w1", m.w1).add("b1", m.b1).add("w2", m.w2).add("b2", m.b2);
  st.add("v1", m.v1).add("v2", m.v2).add("vb1", m.vb1).add("vb2", m.vb2);
  st.add_value("rng", rng).add_value("step", step).add_object("loader", l);

  elastic::training_loop loop({.dir = dir, .steps = steps, .every_steps = 100, .keep_last = 2,
                               .step_timeout = std::chrono::seconds(30)}, st);
  std::printf("  [trainer %d] %s at step %" PRIu64 "\n", static_cast<int>(::getpid()),
              loop.start_step() ? "resumed" : "started", loop.start_step());
  std::fflush(stdout);

  std::vector<float> h(batch * hidden), p(batch * classes), gh(hidden);
  for (auto& s : loop) {
    // Forward and backward over one minibatch (softmax cross-entropy).
    std::vector<float> gw1(m.w1.size()), gb1(hidden), gw2(m.w2.size()), gb2(classes);
    double loss = 0;
    int correct = 0;
    for (int b = 0; b < batch; ++b) {
      if (l.cursor == samples) {
        l.cursor = 0;
        ++l.epoch;
        for (std::size_t i = samples - 1; i > 0; --i) std::swap(l.order[i], l.order[(rng = rng * 6364136223846793005ULL + 1442695040888963407ULL) % (i + 1)]);
      }
      const std::uint32_t idx = l.order[l.cursor++];
      const float* x = &data.x[idx * in];
      float* hb = &h[b * hidden];
      for (int j = 0; j < hidden; ++j) hb[j] = std::max(0.0f, m.b1[j] + x[0] * m.w1[j] + x[1] * m.w1[hidden + j]);
      float z[classes];
      for (int c = 0; c < classes; ++c) {
        z[c] = m.b2[c];
        for (int j = 0; j < hidden; ++j) z[c] += hb[j] * m.w2[j * classes + c];
      }
      const float mx = std::max(z[0], z[1]);
      const float e0 = std::exp(z[0] - mx), e1 = std::exp(z[1] - mx);
      const float pr[classes] = {e0 / (e0 + e1), e1 / (e0 + e1)};
      loss -= std::log(std::max(pr[data.y[idx]], 1e-12f));
      correct += (pr[1] > pr[0]) == (data.y[idx] == 1);
      for (int j = 0; j < hidden; ++j) gh[j] = 0;
      for (int c = 0; c < classes; ++c) {
        const float g = (pr[c] - (data.y[idx] == c ? 1.0f : 0.0f)) / batch;
        gb2[c] += g;
        for (int j = 0; j < hidden; ++j) {
          gw2[j * classes + c] += hb[j] * g;
          gh[j] += m.w2[j * classes + c] * g;
        }
      }
      for (int j = 0; j < hidden; ++j) {
        if (hb[j] <= 0) continue;
        gb1[j] += gh[j];
        gw1[j] += x[0] * gh[j];
        gw1[hidden + j] += x[1] * gh[j];
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a real step takes a while
    s.before_update();  // an in-flight snapshot must have copied the weights first
    auto sgd = [](std::vector<float>& w, std::vector<float>& v, const std::vector<float>& g) {
      for (std::size_t i = 0; i < w.size(); ++i) {
        v[i] = 0.9f * v[i] + g[i];
        w[i] -= 0.1f * v[i];
      }
    };
    sgd(m.w1, m.v1, gw1);
    sgd(m.b1, m.vb1, gb1);
    sgd(m.w2, m.v2, gw2);
    sgd(m.b2, m.vb2, gb2);
    step = s.index() + 1;
    if (step % 500 == 0) {
      std::printf("  [trainer %d] step %5" PRIu64 "  loss %.4f  accuracy %.2f\n", static_cast<int>(::getpid()), step,
                  loss / batch, static_cast<double>(correct) / batch);
      std::fflush(stdout);
    }
  }
  std::printf("  [trainer %d] %s at step %" PRIu64 "; weights checksum %08x\n", static_cast<int>(::getpid()),
              std::string(to_string(loop.reason())).c_str(), loop.completed_steps(), checksum(m));
  std::fflush(stdout);
  if (loop.reason() == elastic::loop_reason::finished) {
    std::FILE* f = std::fopen((std::filesystem::path(dir) / "final-checksum").c_str(), "w");
    if (f) {
      std::fprintf(f, "%08x\n", checksum(m));
      std::fclose(f);
    }
  }
  return loop.exit_code();
}

std::string read_checksum(const std::filesystem::path& dir) {
  char buf[16] = {};
  std::FILE* f = std::fopen((dir / "final-checksum").c_str(), "r");
  if (!f) return "(none)";
  if (!std::fgets(buf, sizeof buf, f)) buf[0] = 0;
  std::fclose(f);
  std::string s(buf);
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

/// Runs `self --train dir steps`; after `after` sends `sig` (0: none). Returns the wait status.
int run(const char* self, const std::string& dir, std::uint64_t steps, std::chrono::milliseconds after, int sig) {
  std::fflush(stdout);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const std::string n = std::to_string(steps);
    ::execl(self, self, "--train", dir.c_str(), n.c_str(), static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  int status = 0;
  if (sig) {
    std::this_thread::sleep_for(after);
    ::kill(pid, sig);
  }
  ::waitpid(pid, &status, 0);
  return status;
}

std::string describe(int status) {
  if (WIFSIGNALED(status)) return std::string("killed by ") + signal_name(WTERMSIG(status));
  return "exited " + std::to_string(WEXITSTATUS(status)) + (WEXITSTATUS(status) == elastic::exit_preempted ? " (preempted: retry me)" : "");
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc == 4 && std::strcmp(argv[1], "--train") == 0) return train(argv[2], std::strtoull(argv[3], nullptr, 10));

  const std::uint64_t steps = 3000;
  const auto root = std::filesystem::temp_directory_path() / ("train-resume-" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  const auto events = root / "events.jsonl";
  std::filesystem::create_directories(root);
  ::setenv("ELASTIC_EVENTS", events.c_str(), 1);
  const std::string self = "/proc/self/exe";

  std::printf("1. an undisturbed run of %" PRIu64 " steps\n", steps);
  run(self.c_str(), (root / "reference").string(), steps, {}, 0);

  const std::string dir = (root / "disturbed").string();
  std::printf("2. the same run, sent SIGTERM (a preemption notice) after 2 s\n");
  std::printf("   -> %s\n", describe(run(self.c_str(), dir, steps, std::chrono::seconds(2), SIGTERM)).c_str());
  std::printf("3. restarted, then SIGKILLed (no notice) after 2 s\n");
  std::printf("   -> %s\n", describe(run(self.c_str(), dir, steps, std::chrono::seconds(2), SIGKILL)).c_str());
  std::printf("4. restarted again, runs to the end\n");
  std::printf("   -> %s\n", describe(run(self.c_str(), dir, steps, {}, 0)).c_str());

  std::printf("checkpoint events:\n");
  std::FILE* f = std::fopen(events.c_str(), "r");
  char line[4096];
  while (f && std::fgets(line, sizeof line, f)) {
    if (std::strstr(line, "\"loop_") || std::strstr(line, "checkpoint_restore") || std::strstr(line, "checkpoint_skipped"))
      std::printf("  %s", line);
  }
  if (f) std::fclose(f);
  const std::string want = read_checksum(root / "reference"), got = read_checksum(dir);
  const bool same = want == got && want != "(none)";
  std::printf("final weights: undisturbed %s, disturbed %s: %s\n", want.c_str(), got.c_str(),
              same ? "identical, bit for bit" : "DIFFERENT");
  std::filesystem::remove_all(root);
  return same ? 0 : 1;
}
