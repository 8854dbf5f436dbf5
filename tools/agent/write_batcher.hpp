// Group commit for the store relay: the writes its workers send at the same moment reach the
// store as one request (store::apply: one etcd transaction), not one each. The first writer sends
// at once; writers that come while a request is in flight wait, and go together in the next. A
// lone write waits for nothing; a crowd of them (every worker of a host joining a round) costs
// one request per round trip instead of one per worker.
//
// A request writes each key once (etcd refuses a transaction that touches a key twice). A
// compare_set of a key already in the request rides on that key's write instead of waiting for
// the next request: once the first write is applied, the key holds a value the request's answer
// tells (what was written, or what the failed compare_set found), and a rider whose condition
// that value fails is answered with it, as if applied right after the first in the same
// transaction. That is every worker of a host bumping the round, or claiming the closer or the
// run's registration, at once: one request, not one per worker in turn. A rider whose condition
// would hold waits for the next request, as does a second set or erase of a key.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
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
    pending p{std::move(w), {}, nullptr, false, nullptr};
    std::unique_lock lk(mu_);
    queue_.push_back(&p);
    while (!p.done) {
      if (sending_) {
        cv_.wait(lk);
        continue;
      }
      // Nobody is sending: this writer sends what waits, its own write among it unless the
      // queue holds more than one request takes (then it sends again). What take() allocates
      // it allocates before it moves anything, so a failure leaves every write queued.
      std::vector<pending*> batch, riders, again;
      try {
        take(batch, riders);
        again.reserve(riders.size());
      } catch (...) {  // no memory: this write fails, the others wait for the next sender
        std::erase(queue_, &p);
        cv_.notify_all();
        throw;
      }
      sending_ = true;
      lk.unlock();
      send(batch);
      lk.lock();
      for (auto* b : batch) b->done = true;
      for (auto* r : riders) {
        bool answered = false;
        try {
          answered = answer(*r->leader, *r);
        } catch (...) {  // no memory for the answer: the rider is sent instead
        }
        if (answered) {
          r->done = true;
        } else {
          again.push_back(r);  // reserved: cannot throw
        }
      }
      try {
        queue_.insert(queue_.begin(), again.begin(), again.end());  // riders whose condition would hold: next
      } catch (...) {
        for (auto* r : again) {
          r->failure = std::current_exception();
          r->done = true;
        }
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
    pending* leader = nullptr;  // a rider: the write of its key in the request it rides on
  };

  /// Into `batch`, the oldest waiting writes, at most `most_`, each key once; into `riders`, the
  /// compare_sets of a key already taken, each riding on its write. Under mu_; throws only
  /// before it changes anything.
  void take(std::vector<pending*>& batch, std::vector<pending*>& riders) {
    batch.reserve(most_);
    riders.reserve(queue_.size());
    for (auto it = queue_.begin(); it != queue_.end();) {
      pending* p = *it;
      const auto lead = std::find_if(batch.begin(), batch.end(),
                                     [p](const pending* b) { return b->request.key == p->request.key; });
      if (lead == batch.end() && batch.size() < most_) {
        batch.push_back(p);
        it = queue_.erase(it);
      } else if (lead != batch.end() && p->request.what == rendezvous::write_request::kind::compare_set) {
        p->leader = *lead;
        riders.push_back(p);
        it = queue_.erase(it);
      } else {
        ++it;  // a second set or erase of a key, or a full request: the next one
      }
    }
  }

  /// One request for `batch`; its results or its failure go to each write. Outside mu_.
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
  }

  /// Answers rider `r` of `b` from what `b` left in the key, when `r`'s condition fails on it;
  /// false when it would hold (or `b` failed, leaving the key unknown): `r` must be sent.
  static bool answer(const pending& b, pending& r) {
    if (b.failure) return false;
    std::optional<std::string> after;
    switch (b.request.what) {
      case rendezvous::write_request::kind::set: after = b.request.value; break;
      case rendezvous::write_request::kind::erase: break;
      case rendezvous::write_request::kind::compare_set:
        after = b.result.done ? std::optional<std::string>(b.request.value) : b.result.actual;
        break;
    }
    if (r.request.expected == after) return false;
    r.result = {false, std::move(after), nullptr};
    return true;
  }

  rendezvous::store& store_;
  const std::size_t most_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<pending*> queue_;
  bool sending_ = false;
};

}  // namespace elastic::agent
