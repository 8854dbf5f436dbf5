// The records a rendezvous keeps in the store (the key schema is at the top of
// rendezvous/rendezvous.hpp): the run's bounds ("min_nodes=M max_nodes=N", a wire name kept for
// groups already running: both count ranks), a round's outcome ("members[ gloo]\n<id>
// <incarnation> [<address>]..." or "abandoned\n<why>") and a join ("<incarnation>
// new|<round>:<rank>[+gloo] [<address>]"; the address is where the participant's peer heartbeats
// listen; "+gloo": it makes the default bootstrap when it leads, and " gloo" in an outcome says
// its leader does, so the members need not wait for it) and the run's end
// ("step=S steps=N by=<id> round=R"). Each is written and
// read here only; a record that does not parse is errc::corrupt naming the key and what to do.
// Fuzzed by tests/fuzz/fuzz_rendezvous_record.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <iterator>
#include <optional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <elastic/internal/env.hpp>
#include <elastic/internal/names.hpp>
#include <elastic/error.hpp>
#include <elastic/rendezvous/detail/participant_id.hpp>

namespace elastic::inline v1::rendezvous::detail {

/// A member of a closed round: participant id and the incarnation that joined.
struct member {
  std::string id;
  std::string incarnation;
  friend bool operator==(const member&, const member&) = default;
};

/// P/round/<r>/closed, parsed.
struct round_outcome {
  enum class state { open, members, abandoned };
  state kind = state::open;
  std::vector<member> members;
  std::vector<std::string> addresses;  ///< each member's peer-heartbeat address ("": none), in rank order
  std::string why;  ///< abandoned: the reason
  /// The leader makes the default bootstrap (the Gloo store prefix `P/round/<r>/gloo/`): every
  /// member knows the blob without waiting for its publication.
  bool default_bootstrap = false;
};

/// A P/round/<r>/join/<id> entry, parsed.
struct join_entry {
  member who;
  std::int64_t prev_round = 0;  ///< 0: a newcomer
  std::int64_t prev_rank = 0;  ///< its rank in prev_round
  std::string address;          ///< where its peer heartbeats listen ("": none)
  bool default_bootstrap = false;  ///< it makes the default bootstrap if it leads ("+gloo")
};

/// A peer-heartbeat address as records carry it: "ip:port" or "[ipv6]:port", no spaces.
inline bool valid_address(std::string_view a) noexcept {
  return !a.empty() && a.size() <= 64 && std::all_of(a.begin(), a.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == '.' || c == ':' ||
           c == '[' || c == ']';
  });
}

/// Splits a record's last field, "<field>[ <address>]", in place: `field` keeps what precedes
/// the first space, `address` gets what follows it ("": none). False when an address is there
/// but is not valid_address() (a trailing space included).
inline bool split_address(std::string_view& field, std::string_view& address) noexcept {
  address = {};
  const auto sp = field.find(' ');
  if (sp == std::string_view::npos) return true;
  address = field.substr(sp + 1);
  field = field.substr(0, sp);
  return valid_address(address);
}

/// The run's bounds, in ranks, as P/config holds them.
struct group_bounds {
  long long min_ranks = 0;
  long long max_ranks = 0;
};

inline error corrupt_key(std::string_view key, std::string_view value, std::string_view expected,
                         std::string_view run_prefix) {
  return error(errc::corrupt,
               fmt::format("store key '{}' holds '{}', not {}: the run's keys are damaged; erase the keys under "
                           "'{}/' or use another run id",
                           internal::printable(key), internal::printable(value.substr(0, 80)), expected,
                           internal::printable(run_prefix)));
}

/// P/config: the wire names stay min_nodes/max_nodes, so that groups formed by older builds
/// still compare equal.
inline std::string format_config(int min_ranks, int max_ranks) {
  return fmt::format("min_nodes={} max_nodes={}", min_ranks, max_ranks);
}

/// P/config parsed: "min_nodes=M max_nodes=N" with M and N non-negative decimal integers;
/// nothing for anything else.
inline std::optional<group_bounds> parse_config(std::string_view v) noexcept {
  constexpr std::string_view min_tag = "min_nodes=", max_tag = " max_nodes=";
  if (!v.starts_with(min_tag)) return std::nullopt;
  v.remove_prefix(min_tag.size());
  const auto sep = v.find(max_tag);
  if (sep == std::string_view::npos) return std::nullopt;
  const auto mn = internal::parse_integer(v.substr(0, sep));
  const auto mx = internal::parse_integer(v.substr(sep + max_tag.size()));
  if (!mn || !mx || *mn < 0 || *mx < 0) return std::nullopt;
  return group_bounds{*mn, *mx};
}

/// P/finished: how the run ended, as its last round's rank 0 recorded it.
struct finished_record {
  std::uint64_t step = 0;   ///< the last step, durable
  std::uint64_t steps = 0;  ///< the steps the training loop was asked for
  std::string by;           ///< the participant that recorded it
  std::int64_t round = 0;   ///< its round then
};

/// "step=S steps=N by=<id> round=R".
inline std::string format_finished(const finished_record& f) {
  return fmt::format("step={} steps={} by={} round={}", f.step, f.steps, f.by, f.round);
}

/// P/finished parsed (the fields in that order; S, N and R non-negative decimal integers, the id
/// not empty); nothing for anything else.
inline std::optional<finished_record> parse_finished(std::string_view v) {
  constexpr std::string_view tags[] = {"step=", " steps=", " by=", " round="};
  std::string_view fields[std::size(tags)];
  for (std::size_t i = 0; i < std::size(tags); ++i) {
    if (!v.starts_with(tags[i])) return std::nullopt;
    v.remove_prefix(tags[i].size());
    const auto end = i + 1 < std::size(tags) ? v.find(tags[i + 1]) : v.size();
    if (end == std::string_view::npos) return std::nullopt;
    fields[i] = v.substr(0, end);
    v.remove_prefix(end);
  }
  const auto step = internal::parse_integer(fields[0]), steps = internal::parse_integer(fields[1]),
             round = internal::parse_integer(fields[3]);
  if (!step || !steps || !round || *step < 0 || *steps < 0 || *round < 0 || fields[2].empty()) return std::nullopt;
  return finished_record{static_cast<std::uint64_t>(*step), static_cast<std::uint64_t>(*steps), std::string(fields[2]),
                         static_cast<std::int64_t>(*round)};
}

/// Participant ids joined with ',' (the members field of events).
inline std::string join_names(const std::vector<std::string>& ids) { return fmt::format("{}", fmt::join(ids, ",")); }

/// "members[ gloo]\n<id> <incarnation>[ <address>]\n..." with each member's address from
/// `addresses` (by id) when it has one; " gloo" when the leader makes the default bootstrap.
inline std::string format_members(const std::vector<member>& members,
                                  const std::map<std::string, std::string, std::less<>>& addresses = {},
                                  bool default_bootstrap = false) {
  std::string out = default_bootstrap ? "members gloo" : "members";
  for (const auto& m : members) {
    out += "\n" + m.id + " " + m.incarnation;
    if (const auto it = addresses.find(m.id); it != addresses.end() && !it->second.empty()) out += " " + it->second;
  }
  return out;
}

inline round_outcome parse_outcome(std::string_view key, const std::optional<std::string>& value,
                                   std::string_view run_prefix) {
  round_outcome out;
  if (!value) return out;
  const std::string_view v = *value;
  if (v.starts_with("abandoned\n")) {
    out.kind = round_outcome::state::abandoned;
    out.why = std::string(v.substr(10));
    return out;
  }
  constexpr std::string_view members_head = "members\n", gloo_head = "members gloo\n";
  const bool gloo = v.starts_with(gloo_head);
  if (!gloo && !v.starts_with(members_head)) {
    throw corrupt_key(key, v, "a round outcome ('members' or 'abandoned')", run_prefix);
  }
  out.kind = round_outcome::state::members;
  out.default_bootstrap = gloo;
  std::string_view rest = v.substr(gloo ? gloo_head.size() : members_head.size());
  const auto lines = static_cast<std::size_t>(std::count(rest.begin(), rest.end(), '\n')) + 1;
  out.members.reserve(lines);
  out.addresses.reserve(lines);
  const auto bad_list = [&] {
    return corrupt_key(key, v, "a member list ('<participant id> <incarnation> [<address>]' per line)", run_prefix);
  };
  while (!rest.empty()) {
    const auto nl = rest.find('\n');
    const std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    const auto sp = line.find(' ');
    std::string_view incarnation = sp == std::string_view::npos ? std::string_view() : line.substr(sp + 1);
    std::string_view address;
    if (sp == std::string_view::npos || !valid_participant(line.substr(0, sp)) ||
        !split_address(incarnation, address) || !valid_incarnation(incarnation)) {
      throw bad_list();
    }
    out.members.push_back({std::string(line.substr(0, sp)), std::string(incarnation)});
    out.addresses.emplace_back(address);
  }
  if (out.members.empty()) throw corrupt_key(key, v, "a member list (it is empty)", run_prefix);
  // A participant twice: sorted views of the ids, not a set of copies (every member parses a
  // round's outcome: 1,024 of them each 1,024 ids).
  std::vector<std::string_view> ids;
  ids.reserve(out.members.size());
  for (const auto& m : out.members) ids.emplace_back(m.id);
  std::sort(ids.begin(), ids.end());
  if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) throw bad_list();
  return out;
}

inline join_entry parse_join(std::string_view key, std::string_view id, std::string_view value,
                             std::string_view run_prefix) {
  auto bad = [&] {
    return corrupt_key(key, value, "a join record ('<incarnation> new|<round>:<rank>[+gloo] [<address>]')", run_prefix);
  };
  const auto sp = value.find(' ');
  if (sp == std::string_view::npos || !valid_participant(id) || !valid_incarnation(value.substr(0, sp))) throw bad();
  join_entry e{{std::string(id), std::string(value.substr(0, sp))}, 0, 0, {}};
  std::string_view prev = value.substr(sp + 1), address;
  if (!split_address(prev, address)) throw bad();
  e.address = std::string(address);
  constexpr std::string_view gloo_tag = "+gloo";
  if (prev.ends_with(gloo_tag)) {
    e.default_bootstrap = true;
    prev.remove_suffix(gloo_tag.size());
  }
  if (prev == "new") return e;
  const auto colon = prev.find(':');
  if (colon == std::string_view::npos) throw bad();
  const auto r = internal::parse_integer(prev.substr(0, colon));
  const auto k = internal::parse_integer(prev.substr(colon + 1));
  if (!r || !k || *r < 1 || *k < 0) throw bad();
  e.prev_round = *r;
  e.prev_rank = *k;
  return e;
}

}  // namespace elastic::inline v1::rendezvous::detail
