// What the tools' command lines need beside CLI11: a first look at the options part with the
// app's own list of options, for the two things CLI11 2.x reads in a way a tool must not.
//   - `--flag=` (an empty value) makes CLI11 take the next argument as the value: `--run-id=
//     --log-dir X` would name the run "--log-dir". Here it is a refusal that names the flag.
//   - With prefix_command(), an unknown option would pass as the start of the program.
// Both tools call scan_options() before CLI::App::parse().
#pragma once

#include <chrono>
#include <cmath>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <elastic/internal/env.hpp>

namespace elastic::tools {

/// `v` as a whole number from `lo` to `hi` (digits only), or nothing.
inline std::optional<long long> to_count(std::string_view v, long long lo, long long hi) {
  const auto n = elastic::internal::parse_integer(v);
  if (!n || *n < lo || *n > hi || v.front() == '-') return std::nullopt;
  return n;
}

/// `v` as seconds (30, 2.5; 0 to 10^7), in milliseconds, or nothing.
inline std::optional<std::chrono::milliseconds> to_seconds(std::string_view v) {
  const auto s = elastic::internal::parse_seconds(v);
  if (!s || !(*s >= 0) || *s > 1e7) return std::nullopt;
  return std::chrono::milliseconds(std::llround(*s * 1000));
}

/// A validator from `why(value)`: "" accepts, anything else is the reason (CLI11 puts the
/// option's name before it). Empty values are refused first, by every option.
template <class Why>
CLI::Validator check(std::string what, Why why) {
  return CLI::Validator(
      [why = std::move(why)](std::string& v) -> std::string {
        if (v.empty()) return "needs a value, got an empty one";
        return why(std::string_view(v));
      },
      std::move(what));
}

inline CLI::Validator whole_number(long long lo, long long hi) {
  return check(fmt::format("{}..{}", lo, hi), [lo, hi](std::string_view v) {
    return to_count(v, lo, hi) ? std::string() : fmt::format("wants a whole number from {} to {}, got '{}'", lo, hi, v);
  });
}

inline CLI::Validator seconds() {
  return check("SECONDS", [](std::string_view v) {
    return to_seconds(v) ? std::string() : fmt::format("wants a number of seconds (e.g. 30 or 2.5), got '{}'", v);
  });
}

/// Any value but an empty one; `what` names it in the help.
inline CLI::Validator any_text(std::string what) {
  return check(std::move(what), [](std::string_view) { return std::string(); });
}

/// What scan_options() found.
struct options_scan {
  std::string problem;                 ///< why the command line is refused; empty when it is not
  const CLI::Option* asked = nullptr;  ///< -h/--help or --version, met before any problem
};

/// Walks `args` (argv without the program name) up to `--` or the first argument that is
/// neither an option nor an option's value, as CLI11 will read them. Stops at the first unknown
/// option, flag given a value (`--quiet=yes`), empty `--flag=`, value-taking option with no
/// value, or at -h/--help/--version (asked: what follows is not read, as before CLI11).
inline options_scan scan_options(const CLI::App& app, std::span<const std::string_view> args) {
  options_scan out;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    if (a == "--" || a.size() < 2 || a.front() != '-') break;
    const auto eq = a.rfind("--", 0) == 0 ? a.find('=') : std::string_view::npos;
    const std::string name(a.substr(0, eq));
    const CLI::Option* opt = app.get_option_no_throw(name);
    if (opt == nullptr) {
      out.problem = fmt::format("unknown option '{}'", name);
      break;
    }
    if (opt == app.get_help_ptr() || opt->check_name("--version")) {
      out.asked = opt;
      break;
    }
    const bool takes_value = opt->get_expected_max() > 0;
    if (eq != std::string_view::npos && !takes_value) {
      out.problem = fmt::format("{} takes no value", name);
      break;
    }
    if (eq != std::string_view::npos && eq + 1 == a.size()) {
      out.problem = fmt::format("{} needs a value, got an empty one", name);
      break;
    }
    if (eq == std::string_view::npos && takes_value) {
      if (i + 1 >= args.size()) {
        out.problem = fmt::format("{} needs a value", name);
        break;
      }
      ++i;
    }
  }
  return out;
}

/// Shows each value-taking option in the help as what its value is (its validator's name:
/// "SECONDS", "N|gpu|cpu|auto"), not as CLI11's "TEXT:SECONDS".
inline void name_values_in_help(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_expected_max() == 0) continue;
    const std::string type = opt->get_type_name();
    opt->option_text(type.substr(type.find(':') + 1));
  }
}

}  // namespace elastic::tools
