// etcd_store's key feed: one /v3/watch stream, held open on a thread of the feed's own, and the
// range's contents read at the revision the watch began after. While nothing changes in the
// range the feed asks etcd nothing (the stream is idle); a change reaches the reader as one
// event. A stream that breaks (etcd restarted, the connection dropped) is opened again from the
// revision after the last event delivered, so nothing is lost; when etcd compacted that history
// away, the feed starts over from a fresh read and says so (take()'s `reset`).
//
// The watch comes first, from "now" (no start revision), and the range is read at the revision
// etcd names in its answer; events up to that revision are the read's, and the stream's copies
// of them are dropped (etcd 3.4's answer may name a revision the watch already delivers: seen
// when the range was written to while the watch was being created). etcd serves a watch that
// starts at a past revision (what a read followed by a watch from the revision after it asks
// for whenever anything was written in between) from its unsynced set, which a loop catches up
// every 100 ms: that was the lag between a round's last join and its closer seeing it (16
// participants, 2026-12-07: 50 ms of the 110 ms a first round took). A watch that is not created
// within etcd_options::request_timeout (etcd away) falls back to the read-then-watch order,
// whose read says what is wrong.
#pragma once

#include <curl/curl.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <elastic/internal/json.hpp>
#include <elastic/internal/curl.hpp>
#include <elastic/internal/unique_fd.hpp>
#include <elastic/rendezvous/detail/etcd_gateway.hpp>
#include <elastic/rendezvous/detail/etcd_reply.hpp>
#include <elastic/rendezvous/key_feed.hpp>

namespace elastic::inline v1::rendezvous::detail {

class etcd_feed final : public key_feed {
 public:
  /// Follows the etcd keys [from, to) (full keys); reports them without their first `strip`
  /// bytes (the store's namespace). Reads the range now: throws what the store's reads throw.
  etcd_feed(etcd_gateway& gateway, std::string from, std::string to, std::size_t strip, feed_options o = {})
      : gateway_(gateway), from_(std::move(from)), to_(std::move(to)), strip_(strip), options_(o),
        ready_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {  // none to be had: readable_fd() says -1
    thread_ = std::jthread([this](std::stop_token st) { follow(st); });
    std::int64_t began = 0;
    {
      std::unique_lock lk(mu_);
      cv_.wait_for(lk, gateway_.options().request_timeout, [&] { return read_through_ > 0 || first_failed_; });
      began = read_through_;  // not revision_: events after it may have come already
    }
    if (began == 0) {
      // The watch did not begin: read first (its errors name what is wrong), then watch from the
      // revision after the read, as a reopened stream does.
      stop();
      std::vector<key_event> first;
      revision_ = read_range(first);
      read_through_ = revision_;
      stopping_ = false;
      queue_ = std::move(first);
      if (!queue_.empty()) announce();
      thread_ = std::jthread([this](std::stop_token st) { follow(st); });
      return;
    }
    if (!options_.snapshot) return;
    std::vector<key_event> first;
    try {
      read_range(first, began);
    } catch (...) {
      stop();
      throw;
    }
    // Events after `began` may have come already: the contents go before them.
    std::lock_guard lk(mu_);
    queue_.insert(queue_.begin(), std::make_move_iterator(first.begin()), std::make_move_iterator(first.end()));
    if (!queue_.empty()) announce();
  }

  etcd_feed(const etcd_feed&) = delete;
  etcd_feed& operator=(const etcd_feed&) = delete;

  ~etcd_feed() override { stop(); }

  std::vector<key_event> take(bool& reset) override {
    std::lock_guard lk(mu_);
    if (ready_) {
      std::uint64_t n = 0;
      (void)!::read(ready_.get(), &n, sizeof n);  // drained with the queue: it rings again with the next event
    }
    reset = std::exchange(reset_, false);
    return std::exchange(queue_, {});
  }

  bool wait(std::chrono::milliseconds timeout) override {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return !queue_.empty() || reset_; });
  }

  [[nodiscard]] int readable_fd() const noexcept override { return ready_ ? ready_.get() : -1; }

 private:
  using json = internal::json;
  using clock = std::chrono::steady_clock;

  /// Ends the feed's thread (a stream blocked in recv() wakes when its socket is shut down
  /// under it).
  void stop() noexcept {
    thread_.request_stop();
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
      if (socket_ != CURL_SOCKET_BAD) ::shutdown(socket_, SHUT_RDWR);
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

  /// The range as it is now, or at revision `at` (0: now), as puts (none without
  /// feed_options::snapshot: then only the revision is read); returns the revision it was read at.
  std::int64_t read_range(std::vector<key_event>& out, std::int64_t at = 0) {
    json body;
    body["key"] = base64_encode(from_);
    body["range_end"] = base64_encode(to_);
    if (at > 0) body["revision"] = std::to_string(at);
    if (!options_.snapshot) body["count_only"] = true;
    return gateway_.request("/v3/kv/range", body, [&](const json& r) {
      if (const auto* kvs = r.find("kvs")) {
        for (const auto& e : kvs->elements()) {
          out.push_back({bytes_field(e, "key").substr(strip_), bytes_field(e, "value"), std::nullopt});
        }
      }
      return int_field(r.at("header"), "revision");
    });
  }

  /// The feed's thread: a stream from the revision after the last event, again after each end.
  void follow(const std::stop_token& st) {
    auto backoff = std::chrono::milliseconds(50);
    while (!st.stop_requested()) {
      const bool delivered = stream(st);
      if (st.stop_requested()) return;
      {
        std::lock_guard lk(mu_);
        if (read_through_ == 0) {
          first_failed_ = true;  // the constructor reads first instead, and starts a thread anew
          cv_.notify_all();
          return;
        }
      }
      if (compacted_) {
        compacted_ = false;
        if (!resync()) continue;
      }
      // A stream that ended at once (etcd away): back off, up to a second, before the next.
      std::unique_lock lk(mu_);
      cv_.wait_for(lk, delivered ? std::chrono::milliseconds(0) : backoff, [&] { return st.stop_requested(); });
      backoff = delivered ? std::chrono::milliseconds(50) : std::min(backoff * 2, std::chrono::milliseconds(1000));
    }
  }

  /// etcd forgot the revisions we follow from: read the range again and tell the reader to drop
  /// its copy. False when etcd did not answer (the next turn tries again).
  bool resync() {
    std::vector<key_event> fresh;
    try {
      const std::int64_t rev = read_range(fresh);
      std::lock_guard lk(mu_);
      revision_ = rev;
      queue_ = std::move(fresh);
      reset_ = true;
      announce();
      return true;
    } catch (...) {
      compacted_ = true;
      return false;
    }
  }

  /// One watch stream, until it ends; true when it delivered anything.
  bool stream(const std::stop_token& st) {
    json create;
    create["key"] = base64_encode(from_);
    create["range_end"] = base64_encode(to_);
    {
      std::lock_guard lk(mu_);
      // The first stream starts from now, and etcd's answer says which revision that is.
      if (read_through_ > 0) create["start_revision"] = std::to_string(revision_ + 1);
    }
    if (!options_.puts) create["filters"].push_back("NOPUT");
    if (options_.previous) create["prev_kv"] = true;
    json body;
    body["create_request"] = std::move(create);
    const std::string text = body.dump();
    internal::curl_ptr h(::curl_easy_init());
    if (!h) return false;
    auto hdrs = gateway_.headers(true);
    char errbuf[CURL_ERROR_SIZE];
    // A window of minutes: an idle stream costs nothing, and one that outlives it is reopened.
    gateway_.prepare(h.get(), gateway_.preferred_endpoint(), "/v3/watch", text, hdrs.get(), std::chrono::minutes(5),
                     errbuf);
    ::curl_easy_setopt(h.get(), CURLOPT_WRITEFUNCTION, &etcd_feed::on_data);
    ::curl_easy_setopt(h.get(), CURLOPT_WRITEDATA, this);
    ::curl_easy_setopt(h.get(), CURLOPT_OPENSOCKETFUNCTION, &etcd_feed::open_socket);
    ::curl_easy_setopt(h.get(), CURLOPT_OPENSOCKETDATA, this);
    ::curl_easy_setopt(h.get(), CURLOPT_CLOSESOCKETFUNCTION, &etcd_feed::close_socket);
    ::curl_easy_setopt(h.get(), CURLOPT_CLOSESOCKETDATA, this);
    ::curl_easy_setopt(h.get(), CURLOPT_NOPROGRESS, 0L);
    ::curl_easy_setopt(h.get(), CURLOPT_XFERINFOFUNCTION, &etcd_feed::on_progress);
    ::curl_easy_setopt(h.get(), CURLOPT_XFERINFODATA, &st);
    // A peer that vanished without closing (a frozen host) is found by TCP keep-alive.
    ::curl_easy_setopt(h.get(), CURLOPT_TCP_KEEPALIVE, 1L);
    ::curl_easy_setopt(h.get(), CURLOPT_TCP_KEEPIDLE, 5L);
    ::curl_easy_setopt(h.get(), CURLOPT_TCP_KEEPINTVL, 2L);
    delivered_ = false;
    buffer_.clear();
    if (!st.stop_requested()) ::curl_easy_perform(h.get());
    h.reset();  // closes the socket (close_socket) before the next stream opens one
    return delivered_;
  }

  static curl_socket_t open_socket(void* p, curlsocktype, curl_sockaddr* a) {
    auto& f = *static_cast<etcd_feed*>(p);
    const curl_socket_t s = ::socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
    std::lock_guard lk(f.mu_);
    f.socket_ = s;
    if (f.stopping_ && s != CURL_SOCKET_BAD) ::shutdown(s, SHUT_RDWR);
    return s;
  }

  static int close_socket(void* p, curl_socket_t s) {
    auto& f = *static_cast<etcd_feed*>(p);
    std::lock_guard lk(f.mu_);
    if (f.socket_ == s) f.socket_ = CURL_SOCKET_BAD;
    return ::close(s);
  }

  static int on_progress(void* p, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    return static_cast<const std::stop_token*>(p)->stop_requested() ? 1 : 0;
  }

  static std::size_t on_data(char* data, std::size_t, std::size_t n, void* p) {
    auto& f = *static_cast<etcd_feed*>(p);
    try {
      return take_lines(f.buffer_, data, n, [&](const std::string& line) { return f.on_message(json::parse(line)); })
                 ? n
                 : 0;
    } catch (...) {
      return 0;  // a message we cannot read: end this stream; the next one starts where we were
    }
  }

  /// One message of the stream; false when the stream must end (cancelled, or an error).
  bool on_message(const json& m) {
    const auto* r = m.find("result");
    if (!r) return false;
    if (const auto* c = r->find("canceled"); c && c->is_bool() && c->as_bool()) {
      compacted_ = int_field(*r, "compact_revision") > 0;
      return false;
    }
    if (const auto* c = r->find("created"); c && c->is_bool() && c->as_bool()) {
      std::lock_guard lk(mu_);
      if (read_through_ == 0) {
        revision_ = int_field(r->at("header"), "revision");
        read_through_ = revision_;
        cv_.notify_all();
      }
    }
    const auto* events = r->find("events");
    if (!events || events->size() == 0) return true;  // "created", or a progress notice
    std::vector<key_event> got;
    std::int64_t last = revision_;
    for (const auto& e : events->elements()) {
      const auto& kv = e.at("kv");
      const auto* type = e.find("type");
      const bool erased = type && type->as_string() == "DELETE";
      std::string key = bytes_field(kv, "key");
      const std::int64_t at = int_field(kv, "mod_revision");
      if (key.size() < strip_ || at <= read_through_) continue;
      std::optional<std::string> previous;
      if (const auto* p = e.find("prev_kv"); erased && p && options_.previous) previous = bytes_field(*p, "value");
      got.push_back({key.substr(strip_), erased ? std::nullopt : std::optional(bytes_field(kv, "value")),
                     std::move(previous)});
      last = std::max(last, at);
    }
    if (got.empty()) return true;  // only what the first read had
    std::lock_guard lk(mu_);
    queue_.insert(queue_.end(), std::make_move_iterator(got.begin()), std::make_move_iterator(got.end()));
    revision_ = last;
    delivered_ = true;
    announce();
    return true;
  }

  /// Tells readers that events wait: wait() returns, and readable_fd() polls readable until the
  /// next take(). With mu_ held, so that a take() never drains a ring whose events it does not
  /// return.
  void announce() noexcept {
    if (ready_) {
      const std::uint64_t one = 1;
      (void)!::write(ready_.get(), &one, sizeof one);
    }
    cv_.notify_all();
  }

  etcd_gateway& gateway_;
  const std::string from_, to_;
  const std::size_t strip_;
  const feed_options options_;
  internal::unique_fd ready_;  // an eventfd, readable while events wait for take()

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<key_event> queue_;       // guarded by mu_
  bool reset_ = false;                 // guarded by mu_
  std::int64_t revision_ = 0;          // the last revision delivered (mu_ for writes off-thread)
  curl_socket_t socket_ = CURL_SOCKET_BAD;  // the stream's socket, for the destructor (mu_)
  bool stopping_ = false;                   // the destructor began (mu_)
  // The revision the first read is at, events up to it being its own; 0 (etcd's revisions start
  // at 1) until the first stream began or a read came first (mu_ to write).
  std::int64_t read_through_ = 0;
  bool first_failed_ = false;  // the first stream ended before etcd created its watch (mu_)

  // The feed thread's own.
  std::string buffer_;
  bool delivered_ = false;
  bool compacted_ = false;

  std::jthread thread_;  // last: it stops before the members it uses go away
};

}  // namespace elastic::inline v1::rendezvous::detail
