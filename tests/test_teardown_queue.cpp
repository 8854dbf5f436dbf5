// teardown_queue: what an elastic group gives up is destroyed on a thread of the queue's own, in
// order, while the caller goes on; draining (and the queue's destructor) waits for all of it.
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <elastic/comm/detail/teardown_queue.hpp>

#include "support/catch.hpp"

using namespace std::chrono_literals;
using elastic::comm::detail::teardown_queue;

namespace {

/// Something slow to destroy, as an NCCL communicator is (its abort joins NCCL's threads).
struct slow {
  slow(std::atomic<bool>* r, std::vector<int>* o, std::mutex* m, int i) : released(r), order(o), mu(m), id(i) {}
  slow(const slow&) = delete;
  slow& operator=(const slow&) = delete;
  std::atomic<bool>* released;  // the test holds the destructor until it sets this
  std::vector<int>* order;
  std::mutex* mu;
  int id;
  ~slow() {
    while (!released->load()) std::this_thread::sleep_for(1ms);
    std::lock_guard lk(*mu);
    order->push_back(id);
  }
};

}  // namespace

TEST_CASE("a discarded object is destroyed on the queue's thread, not the caller's, and in order") {
  std::atomic<bool> released{false};
  std::vector<int> order;
  std::mutex mu;
  std::atomic<int> reported{0};
  teardown_queue<slow> q([&](double ms) {
    CHECK(ms >= 0);
    ++reported;
  });
  for (int i = 0; i < 3; ++i) q.discard(std::make_unique<slow>(&released, &order, &mu, i));
  // The destructors are held: had discard() destroyed anything here it would not have returned.
  CHECK(q.finished() == 0);
  released = true;
  q.drain();
  CHECK(q.finished() == 3);
  CHECK(reported == 3);
  CHECK(order == std::vector<int>{0, 1, 2});
}

TEST_CASE("a teardown queue destroyed with work pending destroys all of it first, and a null is nothing") {
  std::atomic<bool> released{true};
  std::vector<int> order;
  std::mutex mu;
  {
    teardown_queue<slow> q;
    q.discard(nullptr);
    for (int i = 0; i < 5; ++i) q.discard(std::make_unique<slow>(&released, &order, &mu, i));
  }
  CHECK(order == std::vector<int>{0, 1, 2, 3, 4});
}

TEST_CASE("after a drain a teardown queue takes more, on a new thread") {
  std::atomic<bool> released{true};
  std::vector<int> order;
  std::mutex mu;
  teardown_queue<slow> q;
  q.discard(std::make_unique<slow>(&released, &order, &mu, 1));
  q.drain();
  q.discard(std::make_unique<slow>(&released, &order, &mu, 2));
  q.drain();
  CHECK(order == std::vector<int>{1, 2});
  CHECK(q.finished() == 2);
}
