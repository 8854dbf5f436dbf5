// How a user type joins a checkpoint: one function, found by argument-dependent lookup, that
// names its fields for both directions.
//
//   struct loader { std::uint64_t epoch, cursor; std::vector<std::uint32_t> order; };
//   template <class Archive>
//   void elastic_checkpoint(Archive& ar, loader& l) { ar(l.epoch, l.cursor, l.order); }
//
// Trivially copyable types, std::string, std::vector, std::array, std::pair and std::optional of
// those are understood without a hook. The encoding is little-endian bytes with 64-bit lengths:
// it is for restoring the same program's state, not an interchange format.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <elastic/error.hpp>

namespace elastic::inline v1::checkpoint {

class output_archive;
class input_archive;

namespace detail {

template <class A, class T>
concept has_hook = requires(A& a, T& v) { elastic_checkpoint(a, v); };

template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
template <class T>
struct is_pair : std::false_type {};
template <class A, class B>
struct is_pair<std::pair<A, B>> : std::true_type {};
template <class T>
struct is_array : std::false_type {};
template <class T, std::size_t N>
struct is_array<std::array<T, N>> : std::true_type {};

/// The field walk shared by both archives: `Archive::io(bytes, n)` moves raw bytes.
template <class Archive, class T>
void field(Archive& ar, T& v) {
  if constexpr (has_hook<Archive, T>) {
    elastic_checkpoint(ar, v);
  } else if constexpr (std::is_same_v<T, std::string> || is_vector<T>::value) {
    std::uint64_t n = v.size();
    ar.io(&n, sizeof n);
    if constexpr (!Archive::saving) {
      ar.check_length(n);
      v.resize(static_cast<std::size_t>(n));
    }
    using E = typename T::value_type;
    if constexpr (std::is_trivially_copyable_v<E> && !has_hook<Archive, E>) {
      ar.io(v.data(), v.size() * sizeof(E));
    } else {
      for (auto& e : v) field(ar, e);
    }
  } else if constexpr (is_optional<T>::value) {
    bool engaged = v.has_value();
    ar.io(&engaged, sizeof engaged);
    if constexpr (!Archive::saving) {
      if (engaged) v.emplace(); else v.reset();
    }
    if (engaged) field(ar, *v);
  } else if constexpr (is_pair<T>::value) {
    field(ar, v.first);
    field(ar, v.second);
  } else if constexpr (is_array<T>::value && !std::is_trivially_copyable_v<T>) {
    for (auto& e : v) field(ar, e);
  } else if constexpr (std::is_trivially_copyable_v<T>) {
    ar.io(&v, sizeof v);
  } else {
    static_assert(std::is_trivially_copyable_v<T>,
                  "elastic::checkpoint: this type needs a hook: "
                  "template <class Archive> void elastic_checkpoint(Archive& ar, T& v) { ar(v.a, v.b); } "
                  "in T's namespace");
  }
}

}  // namespace detail

/// Writes fields into a byte vector.
class output_archive {
 public:
  static constexpr bool saving = true;
  explicit output_archive(std::vector<std::byte>& out) noexcept : out_(&out) {}

  template <class... T>
  output_archive& operator()(T&... v) {
    (detail::field(*this, v), ...);
    return *this;
  }

  void io(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out_->insert(out_->end(), b, b + n);
  }
  void check_length(std::uint64_t) const noexcept {}

 private:
  std::vector<std::byte>* out_;
};

/// Reads fields back; reading past the end, or leaving bytes unread, is an error.
class input_archive {
 public:
  static constexpr bool saving = false;
  input_archive(std::span<const std::byte> in, std::string what) : in_(in), what_(std::move(what)) {}

  template <class... T>
  input_archive& operator()(T&... v) {
    (detail::field(*this, v), ...);
    return *this;
  }

  void io(void* p, std::size_t n) {
    if (n > in_.size() - pos_) too_short();
    if (n != 0) std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
  }
  /// A length prefix larger than what is left cannot be right; refuse it before allocating.
  void check_length(std::uint64_t n) const {
    if (n > in_.size() - pos_) too_short();
  }
  /// Throws if the hook read fewer bytes than were saved.
  void finish() const {
    if (pos_ != in_.size()) {
      throw error(errc::mismatch, what_ + ": the checkpoint holds " + std::to_string(in_.size()) +
                                      " bytes but the elastic_checkpoint() hook read only " +
                                      std::to_string(pos_) + "; did the type's fields change since it was saved?");
    }
  }

 private:
  [[noreturn]] void too_short() const {
    throw error(errc::mismatch, what_ + ": the checkpoint holds " + std::to_string(in_.size()) +
                                    " bytes, fewer than its elastic_checkpoint() hook reads; "
                                    "did the type's fields change since it was saved?");
  }

  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
  std::string what_;
};

}  // namespace elastic::inline v1::checkpoint
