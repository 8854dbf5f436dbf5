// A feed of the keys in a range of a store: first what the range holds, then every change to it,
// so a reader keeps a mirror of the range without asking the store again. Stores that can push
// changes (etcd: one watch stream) make waiting and watching cost nothing while nothing happens;
// the others are polled (store::watch's default), one list() per look.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace elastic::inline v1::rendezvous {

/// One change to a key: its new value, or nothing when it was erased (or its lease expired).
struct key_event {
  std::string key;
  std::optional<std::string> value;
  std::optional<std::string> previous;  ///< an erasure's last value, when feed_options::previous
};

/// What a feed reports. A reader that only needs to hear of erasures (heartbeat keys: a
/// departure) says so, and a store that pushes changes sends it nothing else: N participants
/// starting together then cost each other no N puts apiece.
struct feed_options {
  bool snapshot = true;   ///< first the range's contents, as puts (false: changes from now on only)
  bool puts = true;       ///< report puts (false: erasures only)
  bool previous = false;  ///< an erasure carries the value the key held (key_event::previous)
};

/// The keys of a range [from, to) and their changes, in the store's order. The first take()
/// returns the range's contents as puts (unless feed_options say otherwise). Thread-safe for one
/// reader and the feed's own thread.
class key_feed {
 public:
  virtual ~key_feed() = default;

  /// What arrived since the last call. `reset` becomes true when the feed lost its place (the
  /// store forgot the history it was following): the events returned are then a fresh copy of
  /// the whole range, and a mirror must drop what it held first.
  [[nodiscard]] virtual std::vector<key_event> take(bool& reset) = 0;

  /// Blocks until take() may have something, for at most `timeout`; false when nothing came. A
  /// polled feed cannot tell: it sleeps a short while and returns true.
  virtual bool wait(std::chrono::milliseconds timeout) = 0;

  /// A descriptor that polls readable while take() may have something, so that one thread can
  /// wait on several feeds at once (poll(2)); -1 when the feed has none (wait() is then the only
  /// way to wait on it). Owned by the feed; the reader only polls it.
  [[nodiscard]] virtual int readable_fd() const noexcept { return -1; }
};

}  // namespace elastic::inline v1::rendezvous
