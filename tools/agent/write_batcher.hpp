// Group commit for the store relay: the writes its workers send at the same moment reach the
// store as one request (store::apply: one etcd transaction), not one each. The first writer sends
// at once; writers that come while a request is in flight wait, and go together in the next. A
// lone write waits for nothing; a crowd of them (every worker of a host joining a round) costs
// one request per round trip instead of one per worker.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <map>
#include <optional>
#include <string>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include <elastic/rendezvous/store.hpp>

namespace elastic::agent {

class write_batcher {
 public:
  /// Writes to `store` (which must outlive this), at most `most` writes per request.
  explicit write_batcher(rendezvous::store& store, std::size_t most = 64) : store_(store), most_(most) {}

  write_batcher(const write_batcher&) = delete;
  write_batcher& operator=(const write_batcher&) = delete;

  /// Applies `w` with whatever other writes are waiting, and returns what it did; throws what the
  /// store threw for it.
  rendezvous::write_result write(rendezvous::write_request w) {
    pending p{std::move(w), {}, nullptr, false, {}};
    std::unique_lock lk(mu_);
    queue_.push_back(&p);
    while (!p.done) {
      if (sending_) {
        cv_.wait(lk);
        continue;
      }
      // Nobody is sending: this writer sends what waits, its own write among it unless the
      // queue holds more than one request takes (then it sends again).
      sending_ = true;
      std::vector<pending*> batch = take();
      lk.unlock();
      send(batch);
      lk.lock();
      for (auto* b : batch) {
        b->done = true;
        for (auto* r : b->riders) r->done = true;
      }
      sending_ = false;
      cv_.notify_all();
    }
    if (p.failure) std::rethrow_exception(p.failure);
    return std::move(p.result);
  }

 private:
  struct pending {
    rendezvous::write_request request;
    rendezvous::write_result result;
    std::exception_ptr failure;
    bool done = false;
    std::vector<pending*> riders;  // creations of the same key answered by this one's outcome
  };

  /// The oldest waiting writes, at most `most_`, each key once: a second write of a key waits for
  /// the next request (so writes of one key keep their order), except a creation (compare_set
  /// from absent) behind another creation of the key, which rides on it: once the first is
  /// applied the key exists, so the rider fails, seeing what the first left (every worker of a
  /// host claiming a round's closer or the run's registration at once: one request). Under mu_.
  std::vector<pending*> take() {
    std::vector<pending*> batch;
    std::map<std::string_view, pending*> keys;
    for (auto it = queue_.begin(); it != queue_.end();) {
      pending* p = *it;
      const auto seen = keys.find(p->request.key);
      if (seen == keys.end() && batch.size() < most_) {
        keys.emplace(p->request.key, p);
        batch.push_back(p);
        it = queue_.erase(it);
      } else if (seen != keys.end() && creates(*seen->second) && creates(*p)) {
        seen->second->riders.push_back(p);
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    return batch;
  }

  static bool creates(const pending& p) {
    return p.request.what == rendezvous::write_request::kind::compare_set && !p.request.expected;
  }

  /// One request for `batch`; its results or its failure go to each write and its riders.
  /// Outside mu_.
  void send(const std::vector<pending*>& batch) noexcept {
    try {
      std::vector<rendezvous::write_request> requests;
      requests.reserve(batch.size());
      for (auto* b : batch) requests.push_back(b->request);
      auto results = store_.apply(requests);
      for (std::size_t i = 0; i < batch.size(); ++i) {
        batch[i]->failure = results.at(i).failure;
        batch[i]->result = std::move(results.at(i));
      }
    } catch (...) {
      for (auto* b : batch) b->failure = std::current_exception();
    }
    for (auto* b : batch) {
      for (auto* r : b->riders) {
        r->failure = b->failure;
        r->result.done = false;
        r->result.actual = b->result.done ? std::optional<std::string>(b->request.value) : b->result.actual;
      }
    }
  }

  rendezvous::store& store_;
  const std::size_t most_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<pending*> queue_;
  bool sending_ = false;
};

}  // namespace elastic::agent
