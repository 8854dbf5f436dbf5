// A small strict JSON value, parser and writer: enough for checkpoint manifests, where every
// byte is ours and anything unexpected is damage, so the parser refuses rather than guesses.
// Integers stay exact (int64 and uint64); objects keep their insertion order so that what we
// write reads back, and dumps again, byte for byte the same.
#pragma once

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include <elastic/internal/json_text.hpp>
#include <elastic/error.hpp>

namespace elastic::inline v1::internal {

/// A JSON value: null, boolean, integer, number, string, array or object. Wrong-type access
/// throws elastic::error(errc::corrupt): a manifest that does not say what we wrote is damaged.
class json {
 public:
  using array_t = std::vector<json>;
  /// Members in insertion order; lookups are linear (manifest objects are small).
  using object_t = std::vector<std::pair<std::string, json>>;

  /// Deepest nesting of arrays and objects that parse() accepts: bounds its recursion.
  static constexpr int max_depth = 64;

  json() noexcept = default;
  json(std::nullptr_t) noexcept {}
  json(bool b) noexcept : v_(b) {}
  template <class T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool> && std::is_signed_v<T>)
  json(T i) noexcept : v_(static_cast<std::int64_t>(i)) {}
  /// Unsigned values that fit int64 are stored as int64, so that each number has one form.
  template <class T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool> && std::is_unsigned_v<T>)
  json(T u) noexcept {
    if (static_cast<std::uint64_t>(u) <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      v_ = static_cast<std::int64_t>(u);
    } else {
      v_ = static_cast<std::uint64_t>(u);
    }
  }
  json(double d) noexcept : v_(d) {}
  json(std::string s) noexcept : v_(std::move(s)) {}
  json(std::string_view s) : v_(std::string(s)) {}
  json(const char* s) : v_(std::string(s)) {}
  json(array_t a) noexcept : v_(std::move(a)) {}
  json(object_t o) noexcept : v_(std::move(o)) {}

  /// An empty array or object (a default json is null).
  static json array() { return json(array_t{}); }
  static json object() { return json(object_t{}); }

  [[nodiscard]] bool is_null() const noexcept { return v_.index() == 0; }
  [[nodiscard]] bool is_bool() const noexcept { return std::holds_alternative<bool>(v_); }
  /// An integer, signed or unsigned.
  [[nodiscard]] bool is_integer() const noexcept { return v_.index() == 2 || v_.index() == 3; }
  [[nodiscard]] bool is_double() const noexcept { return std::holds_alternative<double>(v_); }
  [[nodiscard]] bool is_number() const noexcept { return is_integer() || is_double(); }
  [[nodiscard]] bool is_string() const noexcept { return std::holds_alternative<std::string>(v_); }
  [[nodiscard]] bool is_array() const noexcept { return std::holds_alternative<array_t>(v_); }
  [[nodiscard]] bool is_object() const noexcept { return std::holds_alternative<object_t>(v_); }

  /// The member `key`; a missing one is damage in a manifest.
  [[nodiscard]] const json& at(std::string_view key) const {
    if (const json* j = find(key)) return *j;
    if (!is_object()) wrong("an object");
    throw error(errc::corrupt, fmt::format("missing field '{}'", key));
  }
  /// The member `key`, or null when this is not an object or has no such member.
  [[nodiscard]] const json* find(std::string_view key) const noexcept {
    if (const auto* o = std::get_if<object_t>(&v_)) {
      for (const auto& [k, v] : *o)
        if (k == key) return &v;
    }
    return nullptr;
  }
  /// Element `index` of an array.
  [[nodiscard]] const json& at(std::size_t index) const {
    const auto& a = get<array_t>("an array");
    if (index >= a.size()) {
      throw error(errc::corrupt, fmt::format("missing element {} of an array of {}", index, a.size()));
    }
    return a[index];
  }
  /// The member `key`, appended as null when absent; a null value first becomes an object.
  json& operator[](std::string_view key) {
    if (is_null()) v_ = object_t{};
    auto* o = std::get_if<object_t>(&v_);
    if (!o) throw error(errc::invalid_argument, fmt::format("json: operator[](\"{}\") on {}", key, type_name()));
    for (auto& [k, v] : *o)
      if (k == key) return v;
    return o->emplace_back(std::string(key), json()).second;
  }
  /// Appends to an array; a null value first becomes an array.
  // The element is built in place from `value` rather than taken as a json and moved in:
  // moving a temporary made from an unsigned integer made GCC 12 at -O2/-O3 warn
  // (-Wmaybe-uninitialized) about the variant's string and vector alternatives.
  template <class T>
    requires std::is_constructible_v<json, T&&>
  void push_back(T&& value) {
    if (is_null()) v_ = array_t{};
    auto* a = std::get_if<array_t>(&v_);
    if (!a) throw error(errc::invalid_argument, fmt::format("json: push_back on {}", type_name()));
    a->emplace_back(std::forward<T>(value));
  }
  /// Elements of an array or members of an object; 0 for anything else.
  [[nodiscard]] std::size_t size() const noexcept {
    if (const auto* a = std::get_if<array_t>(&v_)) return a->size();
    if (const auto* o = std::get_if<object_t>(&v_)) return o->size();
    return 0;
  }
  [[nodiscard]] const array_t& elements() const { return get<array_t>("an array"); }
  [[nodiscard]] const object_t& items() const { return get<object_t>("an object"); }
  [[nodiscard]] const std::string& as_string() const { return get<std::string>("a string"); }
  [[nodiscard]] bool as_bool() const { return get<bool>("a boolean"); }
  [[nodiscard]] std::int64_t as_int64() const {
    if (const auto* i = std::get_if<std::int64_t>(&v_)) return *i;
    if (const auto* u = std::get_if<std::uint64_t>(&v_)) {
      throw error(errc::corrupt, fmt::format("expected a signed 64-bit integer, got {}, which is too large", *u));
    }
    wrong("an integer");
  }
  [[nodiscard]] std::uint64_t as_uint64() const {
    if (const auto* i = std::get_if<std::int64_t>(&v_)) {
      if (*i < 0) throw error(errc::corrupt, fmt::format("expected an unsigned integer, got {}", *i));
      return static_cast<std::uint64_t>(*i);
    }
    if (const auto* u = std::get_if<std::uint64_t>(&v_)) return *u;
    wrong("an unsigned integer");
  }
  /// A number; integers convert (beyond 2^53 they round).
  [[nodiscard]] double as_double() const {
    if (const auto* d = std::get_if<double>(&v_)) return *d;
    if (const auto* i = std::get_if<std::int64_t>(&v_)) return static_cast<double>(*i);
    if (const auto* u = std::get_if<std::uint64_t>(&v_)) return static_cast<double>(*u);
    wrong("a number");
  }

  /// Same type and value (1 and 1.0 differ); objects compare in order.
  friend bool operator==(const json& a, const json& b) { return a.v_ == b.v_; }

  /// Compact text (indent < 0), or one member per line indented by `indent` spaces a level.
  /// Doubles print in the shortest form that reads back exactly, always with '.' or 'e' so
  /// they stay doubles; NaN and infinities, which JSON cannot hold, print as null.
  [[nodiscard]] std::string dump(int indent = -1) const {
    std::string out;
    write(out, indent, 0);
    return out;
  }

  /// Parses one whole document. Anything malformed, trailing text included, throws
  /// elastic::error(errc::corrupt) saying the line and column and what was expected there.
  static json parse(std::string_view text) {
    parser p{text};
    p.ws();
    json j = p.value(0);
    p.ws();
    if (p.i != text.size()) p.fail("the end of the document");
    return j;
  }

 private:
  // Alternative order matches type_name().
  using value_t = std::variant<std::nullptr_t, bool, std::int64_t, std::uint64_t, double, std::string, array_t, object_t>;

  [[nodiscard]] const char* type_name() const noexcept {
    static constexpr const char* names[] = {"null",     "a boolean", "an integer", "an integer",
                                            "a number", "a string",  "an array",   "an object"};
    return names[v_.index()];
  }
  template <class T>
  const T& get(const char* expected) const {
    if (const auto* v = std::get_if<T>(&v_)) return *v;
    wrong(expected);
  }
  [[noreturn]] void wrong(const char* expected) const {
    throw error(errc::corrupt, fmt::format("expected {}, got {}", expected, type_name()));
  }

  static void write_string(std::string& out, std::string_view s) { append_json_string(out, s); }

  void write(std::string& out, int indent, int depth) const {
    auto newline = [&](int d) {
      if (indent < 0) return;
      out += '\n';
      out.append(static_cast<std::size_t>(indent) * static_cast<std::size_t>(d), ' ');
    };
    switch (v_.index()) {
      case 0: out += "null"; break;
      case 1: out += std::get<bool>(v_) ? "true" : "false"; break;
      case 2: append_json_integer(out, std::get<std::int64_t>(v_)); break;
      case 3: append_json_integer(out, std::get<std::uint64_t>(v_)); break;
      case 4: {
        const std::size_t start = out.size();
        // A whole number keeps a ".0" so that it reads back as a double, not an integer.
        if (append_json_double(out, std::get<double>(v_)) && out.find_first_of(".e", start) == std::string::npos) {
          out += ".0";
        }
        break;
      }
      case 5: write_string(out, std::get<std::string>(v_)); break;
      case 6: {
        const auto& a = std::get<array_t>(v_);
        out += '[';
        for (std::size_t i = 0; i < a.size(); ++i) {
          if (i) out += ',';
          newline(depth + 1);
          a[i].write(out, indent, depth + 1);
        }
        if (!a.empty()) newline(depth);
        out += ']';
        break;
      }
      default: {
        const auto& o = std::get<object_t>(v_);
        out += '{';
        for (std::size_t i = 0; i < o.size(); ++i) {
          if (i) out += ',';
          newline(depth + 1);
          write_string(out, o[i].first);
          out += indent < 0 ? ":" : ": ";
          o[i].second.write(out, indent, depth + 1);
        }
        if (!o.empty()) newline(depth);
        out += '}';
      }
    }
  }

  // Recursive descent over RFC 8259, minus what a writer of ours never produces: duplicate
  // keys, lone surrogates, integers beyond 64 bits and numbers beyond a double's range.
  struct parser {
    std::string_view s;
    std::size_t i = 0;

    [[noreturn]] void fail(std::string_view expected) const {
      std::size_t line = 1, column = 1;
      for (std::size_t k = 0; k < i && k < s.size(); ++k) {
        if (s[k] == '\n') {
          ++line;
          column = 1;
        } else {
          ++column;
        }
      }
      throw error(errc::corrupt, fmt::format("malformed JSON at line {} column {}: expected {}", line, column, expected));
    }
    [[noreturn]] void fail_at(std::size_t at, std::string_view expected) {
      i = at;
      fail(expected);
    }
    void ws() noexcept {
      while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) ++i;
    }
    bool eat(char c) noexcept {
      if (i < s.size() && s[i] == c) {
        ++i;
        return true;
      }
      return false;
    }
    [[nodiscard]] bool digit() const noexcept { return i < s.size() && s[i] >= '0' && s[i] <= '9'; }
    void digits() noexcept {
      while (digit()) ++i;
    }

    json value(int depth) {
      if (i >= s.size()) fail("a value");
      switch (s[i]) {
        case '{': return object(depth + 1);
        case '[': return array(depth + 1);
        case '"': return json(string());
        case 't': return literal("true"), json(true);
        case 'f': return literal("false"), json(false);
        case 'n': return literal("null"), json();
        default:
          if (s[i] == '-' || digit()) return number();
          fail("a value");
      }
    }
    void literal(std::string_view word) {
      if (s.substr(i, word.size()) != word) fail(fmt::format("'{}'", word));
      i += word.size();
    }
    void enter(int depth) const {
      if (depth > max_depth) fail(fmt::format("no more than {} nested arrays and objects", max_depth));
    }
    json object(int depth) {
      enter(depth);
      ++i;
      object_t o;
      ws();
      if (eat('}')) return json(std::move(o));
      for (;;) {
        ws();
        const std::size_t key_at = i;
        if (i >= s.size() || s[i] != '"') fail("a string key");
        std::string key = string();
        for (const auto& member : o)
          if (member.first == key) fail_at(key_at, fmt::format("a key not already in this object (\"{}\" repeats)", key));
        ws();
        if (!eat(':')) fail("':'");
        ws();
        json v = value(depth);
        o.emplace_back(std::move(key), std::move(v));
        ws();
        if (eat('}')) return json(std::move(o));
        if (!eat(',')) fail("',' or '}'");
      }
    }
    json array(int depth) {
      enter(depth);
      ++i;
      array_t a;
      ws();
      if (eat(']')) return json(std::move(a));
      for (;;) {
        ws();
        a.push_back(value(depth));
        ws();
        if (eat(']')) return json(std::move(a));
        if (!eat(',')) fail("',' or ']'");
      }
    }
    unsigned hex4() {
      unsigned v = 0;
      for (int k = 0; k < 4; ++k, ++i) {
        const char c = i < s.size() ? s[i] : '\0';
        v <<= 4;
        if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
        else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
        else fail("a hex digit");
      }
      return v;
    }
    static void utf8(std::string& out, unsigned cp) {
      if (cp < 0x80) {
        out += static_cast<char>(cp);
        return;
      }
      if (cp < 0x800) {
        out += static_cast<char>(0xc0 | (cp >> 6));
      } else if (cp < 0x10000) {
        out += static_cast<char>(0xe0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      } else {
        out += static_cast<char>(0xf0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      }
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
    std::string string() {
      ++i;  // the opening quote
      std::string out;
      for (;;) {
        if (i >= s.size()) fail("a closing '\"'");
        const char c = s[i];
        if (c == '"') {
          ++i;
          return out;
        }
        if (static_cast<unsigned char>(c) < 0x20) fail("a control character to be escaped (\\u00XX)");
        ++i;
        if (c != '\\') {
          out += c;
          continue;
        }
        const std::size_t escape_at = i - 1;
        switch (i < s.size() ? s[i++] : '\0') {
          case '"': out += '"'; break;
          case '\\': out += '\\'; break;
          case '/': out += '/'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'n': out += '\n'; break;
          case 'r': out += '\r'; break;
          case 't': out += '\t'; break;
          case 'u': {
            unsigned cp = hex4();
            if (cp >= 0xdc00 && cp < 0xe000) fail_at(escape_at, "a high surrogate before a low one");
            if (cp >= 0xd800 && cp < 0xdc00) {
              const std::size_t low_at = i;
              if (!(eat('\\') && eat('u'))) fail_at(low_at, "a low surrogate after a high one");
              const unsigned low = hex4();
              if (low < 0xdc00 || low >= 0xe000) fail_at(low_at, "a low surrogate after a high one");
              cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
            }
            utf8(out, cp);
            break;
          }
          default: fail_at(escape_at, "an escape: \\\" \\\\ \\/ \\b \\f \\n \\r \\t or \\uXXXX");
        }
      }
    }
    json number() {
      const std::size_t start = i;
      const bool negative = eat('-');
      if (!digit()) fail("a digit");
      if (s[i] == '0' && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '9') fail("no leading zero");
      digits();
      bool integral = true;
      if (eat('.')) {
        integral = false;
        if (!digit()) fail("a digit after '.'");
        digits();
      }
      if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        integral = false;
        ++i;
        if (!eat('+')) eat('-');
        if (!digit()) fail("a digit in the exponent");
        digits();
      }
      const char* first = s.data() + start;
      const char* last = s.data() + i;
      // from_chars: exact for integers, correctly rounded for doubles, and deaf to the locale.
      std::from_chars_result r{};
      json j;
      if (integral && negative) {
        std::int64_t v = 0;
        r = std::from_chars(first, last, v);
        j = json(v);
      } else if (integral) {
        std::uint64_t v = 0;
        r = std::from_chars(first, last, v);
        j = json(v);
      } else {
        double v = 0;
        r = std::from_chars(first, last, v);
        j = json(v);
      }
      if (r.ec != std::errc() || r.ptr != last) {
        fail_at(start, integral ? "an integer that fits 64 bits" : "a number within the range of a double");
      }
      return j;
    }
  };

  value_t v_{nullptr};
};

}  // namespace elastic::inline v1::internal
