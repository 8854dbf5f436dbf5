// Small helpers every part of the model uses: symbol export, environment knobs read once,
// hashing for communicator magics.
#pragma once

#include <charconv>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

// The model's libraries are built with hidden visibility: only the C API (through the public
// headers) and the few functions one model library calls in the other are exported.
#define NCCL_MODEL_EXPORT __attribute__((visibility("default")))

namespace nccl_model {

/// The integer in environment variable `name`; nullopt when unset or empty. A malformed value
/// is reported once on stderr and treated as unset (the model never guesses).
inline std::optional<long long> env_integer(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  const std::string_view s(v);
  long long out = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  if (ec != std::errc() || end != s.data() + s.size()) {
    std::fprintf(stderr, "nccl-model: ignoring %s='%s': not an integer\n", name, v);
    return std::nullopt;
  }
  return out;
}

/// The text of environment variable `name`, empty when unset.
inline std::string env_text(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

/// printf into a std::string (NCCL's WARN texts are printf formats; the model keeps them).
__attribute__((format(printf, 1, 2))) inline std::string strprintf(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

/// SplitMix64's finaliser: spreads the bits of `x`.
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// A child communicator's magic from its parent's and a counter, the same on every rank that
/// made the same sequence of children (NCCL: hashCombine(comm->magic, comm->childCount)).
inline std::uint64_t hash_combine(std::uint64_t a, std::uint64_t b) { return mix64(a ^ mix64(b)); }

}  // namespace nccl_model
