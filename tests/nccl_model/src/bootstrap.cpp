#include "bootstrap.hpp"

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "errors.hpp"
#include "util.hpp"

namespace nccl_model::boot {
namespace {

using namespace std::chrono_literals;
using clock = std::chrono::steady_clock;

constexpr char id_tag[8] = {'n', 'c', 'c', 'l', 'm', 'd', 'l', '1'};
constexpr std::uint32_t checkin_tag = 0x4e4d4349;  // "NMCI"
constexpr std::uint32_t table_tag = 0x4e4d5442;    // "NMTB"
constexpr std::uint32_t hello_tag = 0x4e4d484c;    // "NMHL"
constexpr std::int32_t max_extra_ints = 4096;
constexpr std::size_t max_stash = 64;

struct checkin_msg {
  std::uint32_t tag = checkin_tag;
  std::int32_t nranks = 0;
  std::int32_t rank = 0;
  std::int32_t pad = 0;
  std::uint64_t magic = 0;
  peer_info info;
};

struct table_header {
  std::uint32_t tag = table_tag;
  std::int32_t nranks = 0;
};

std::atomic<int> roots{0};

// A stop condition for talking to a peer that should answer at once: gives up after `limit`.
net::stop_fn patience(std::chrono::milliseconds limit) {
  const auto until = clock::now() + limit;
  return [until] { return clock::now() >= until; };
}

// Waits, without a timeout, for the next connection on the root's listener.
bool next_connection(const net::listener& l, net::fd& out) {
  pollfd p{l.sock.get(), POLLIN, 0};
  if (::poll(&p, 1, -1) <= 0) return false;
  return net::accept_one(l, out, [] { return true; }) == net::io::ok;
}

// The root's loop (bootstrap.cc bootstrapRoot): every rank checks in once; when all nranks have,
// each gets the whole table. It returns early, leaving the ranks to wait, exactly where
// bootstrapRoot jumps to "out".
void root_main(net::listener l, std::uint64_t magic) {
  std::vector<net::fd> conns;
  std::vector<peer_info> table;
  int nranks = -1;
  int count = 0;
  bool complete = false;
  while (!complete) {
    net::fd c;
    if (!next_connection(l, c)) continue;
    checkin_msg m;
    if (net::recv_all(c.get(), &m, sizeof m, patience(10s)) != net::io::ok || m.tag != checkin_tag ||
        m.magic != magic) {
      continue;  // not one of this root's ranks (NCCL's sockets refuse a wrong magic)
    }
    if (nranks < 0) {
      nranks = m.nranks;
      if (nranks < 1) break;
      conns.resize(static_cast<std::size_t>(nranks));
      table.resize(static_cast<std::size_t>(nranks));
    }
    if (m.nranks != nranks) {
      warn(strprintf("Bootstrap Root : mismatch in info from procs, nranks %d vs %d", nranks, m.nranks));
      break;
    }
    if (m.rank < 0 || m.rank >= nranks) {
      warn(strprintf("Bootstrap Root : localId %d is out of range", m.rank));
      break;
    }
    if (conns[static_cast<std::size_t>(m.rank)]) {
      warn(strprintf("Bootstrap Root : rank %d of %d ranks has already checked in", m.rank, nranks));
      break;
    }
    conns[static_cast<std::size_t>(m.rank)] = std::move(c);
    table[static_cast<std::size_t>(m.rank)] = m.info;
    complete = ++count == nranks;
  }
  if (complete) {
    const table_header h{table_tag, nranks};
    for (auto& c : conns) {
      if (net::send_all(c.get(), &h, sizeof h, patience(10s)) != net::io::ok) continue;
      (void)net::send_all(c.get(), table.data(), table.size() * sizeof(peer_info), patience(10s));
    }
  }
  roots.fetch_sub(1);
}

// Waits for `stop`: what a rank does when the peer it waits for will never answer.
outcome hang_until(const net::stop_fn& stop) {
  while (!stop()) std::this_thread::sleep_for(1ms);
  return outcome::stopped;
}

outcome from_io(net::io r, std::string* why, const char* what) {
  if (r == net::io::ok) return outcome::ok;
  if (r == net::io::stopped) return outcome::stopped;
  *why = std::string(what) + (r == net::io::closed ? ": the peer closed the connection" : ": socket error");
  return outcome::failed;
}

}  // namespace

bool decode(const ncclUniqueId& id, id_payload& out) {
  std::memcpy(&out, id.internal, sizeof out);
  return std::memcmp(out.tag, id_tag, sizeof id_tag) == 0;
}

bool start_root(std::uint64_t magic, id_kind kind, int parent_nranks, ncclUniqueId* out, std::string* why) {
  net::listener l;
  if (!net::listen_loopback(l, why)) return false;
  id_payload p;
  std::memcpy(p.tag, id_tag, sizeof id_tag);
  p.magic = magic;
  p.port = l.port;
  p.kind = kind;
  p.parent_nranks = parent_nranks;
  std::memset(out->internal, 0, sizeof out->internal);
  std::memcpy(out->internal, &p, sizeof p);
  roots.fetch_add(1);
  std::thread(root_main, std::move(l), magic).detach();  // like bootstrapCreateRoot: detached
  return true;
}

int live_roots() { return roots.load(); }

outcome check_in(const id_payload& id, int nranks, int rank, const peer_info& me, std::vector<peer_info>& table,
                 const net::stop_fn& stop, std::string* why) {
  net::fd s;
  std::string err;
  if (const auto r = net::connect_loopback(id.port, s, stop, 30s, &err); r != net::io::ok) {
    if (r == net::io::stopped) return outcome::stopped;
    *why = "bootstrap: cannot reach the root (" + err + ")";
    return outcome::failed;
  }
  checkin_msg m;
  m.nranks = nranks;
  m.rank = rank;
  m.magic = id.magic;
  m.info = me;
  if (net::send_all(s.get(), &m, sizeof m, stop) == net::io::stopped) return outcome::stopped;
  table_header h;
  const net::io r = net::recv_all(s.get(), &h, sizeof h, stop);
  if (r == net::io::stopped) return outcome::stopped;
  if (r != net::io::ok) return hang_until(stop);  // the root left early: it never answers
  if (h.tag != table_tag || h.nranks != nranks) {
    *why = "bootstrap: malformed answer from the root";
    return outcome::failed;
  }
  table.assign(static_cast<std::size_t>(nranks), peer_info{});
  const net::io t = net::recv_all(s.get(), table.data(), table.size() * sizeof(peer_info), stop);
  if (t == net::io::stopped) return outcome::stopped;
  return t == net::io::ok ? outcome::ok : hang_until(stop);
}

outcome send_hello(std::uint16_t port, hello_kind kind, std::uint64_t magic, int from_rank,
                   const std::vector<std::int32_t>& extra, net::fd& out, const net::stop_fn& stop, std::string* why) {
  std::string err;
  if (const auto r = net::connect_loopback(port, out, stop, 10s, &err); r != net::io::ok) {
    if (r == net::io::stopped) return outcome::stopped;
    *why = err;
    return outcome::failed;
  }
  const hello h{hello_tag, kind, magic, from_rank, static_cast<std::int32_t>(extra.size())};
  if (const auto r = net::send_all(out.get(), &h, sizeof h, stop); r != net::io::ok) {
    return from_io(r, why, "sending a hello");
  }
  return from_io(net::send_all(out.get(), extra.data(), extra.size() * sizeof(std::int32_t), stop), why,
                 "sending a hello");
}

void mailbox::close() {
  std::lock_guard lk(mu_);
  stash_.clear();
  listener_.sock.reset();
}

outcome mailbox::accept(const std::function<bool(const hello&)>& match, net::fd& conn, hello& h,
                        std::vector<std::int32_t>& extra, const net::stop_fn& stop) {
  {
    std::lock_guard lk(mu_);
    for (auto it = stash_.begin(); it != stash_.end(); ++it) {
      if (!match(it->h)) continue;
      conn = std::move(it->conn);
      h = it->h;
      extra = std::move(it->extra);
      stash_.erase(it);
      return outcome::ok;
    }
  }
  for (;;) {
    net::fd c;
    const net::io r = net::accept_one(listener_, c, stop);
    if (r == net::io::stopped) return outcome::stopped;
    if (r != net::io::ok) continue;
    hello got;
    const auto quick = patience(5s);
    auto give_up = [&] { return quick() || stop(); };
    if (net::recv_all(c.get(), &got, sizeof got, give_up) != net::io::ok || got.tag != hello_tag ||
        got.extra_ints < 0 || got.extra_ints > max_extra_ints) {
      continue;  // a connection that is not a model peer's, or a peer that died mid-hello
    }
    std::vector<std::int32_t> more(static_cast<std::size_t>(got.extra_ints));
    if (net::recv_all(c.get(), more.data(), more.size() * sizeof(std::int32_t), give_up) != net::io::ok) continue;
    if (match(got)) {
      conn = std::move(c);
      h = got;
      extra = std::move(more);
      return outcome::ok;
    }
    std::lock_guard lk(mu_);
    if (stash_.size() == max_stash) stash_.pop_front();
    stash_.push_back({std::move(c), got, std::move(more)});
  }
}

outcome connect_ring(mailbox& mb, std::uint64_t magic, int rank, const std::vector<peer_info>& table, net::fd& to_succ,
                     net::fd& from_pred, const net::stop_fn& stop, std::string* why) {
  const int n = static_cast<int>(table.size());
  if (n == 1) return outcome::ok;
  const int succ = (rank + 1) % n;
  const int pred = (rank + n - 1) % n;
  if (const auto r = send_hello(table[static_cast<std::size_t>(succ)].listen_port, hello_kind::ring, magic, rank, {},
                                to_succ, stop, why);
      r != outcome::ok) {
    if (r == outcome::failed) *why = strprintf("connecting the ring to rank %d: %s", succ, why->c_str());
    return r;
  }
  hello h;
  std::vector<std::int32_t> extra;
  return mb.accept([&](const hello& x) { return x.kind == hello_kind::ring && x.magic == magic && x.from_rank == pred; },
                   from_pred, h, extra, stop);
}

outcome ring_allgather(std::vector<peer_info>& table, int rank, int to_succ, int from_pred, const net::stop_fn& stop,
                       std::string* why) {
  const int n = static_cast<int>(table.size());
  for (int step = 0; step < n - 1; ++step) {
    const auto send_i = static_cast<std::size_t>((rank - step + 2 * n) % n);
    const auto recv_i = static_cast<std::size_t>((rank - step - 1 + 2 * n) % n);
    int which = 0;
    const net::io r = net::exchange(to_succ, &table[send_i], sizeof(peer_info), from_pred, &table[recv_i],
                                    sizeof(peer_info), stop, &which);
    if (r != net::io::ok) return from_io(r, why, which == 0 ? "ring allgather (send)" : "ring allgather (receive)");
  }
  return outcome::ok;
}

}  // namespace nccl_model::boot
