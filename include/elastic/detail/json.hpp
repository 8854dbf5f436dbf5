// A small strict JSON value, parser and writer: enough for checkpoint manifests, where every
// byte is ours and anything unexpected is damage. Integers stay exact (int64 and uint64);
// objects keep their insertion order so what we write reads back the same.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <type_traits>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include <elastic/error.hpp>

namespace elastic::detail {

class json {
 public:
  using array_t = std::vector<json>;
  using object_t = std::vector<std::pair<std::string, json>>;

  json() noexcept = default;
  json(std::nullptr_t) noexcept {}
  json(bool b) : v_(b) {}
  template <class T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool> && std::is_signed_v<T>)
  json(T i) : v_(static_cast<std::int64_t>(i)) {}
  template <class T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool> && std::is_unsigned_v<T>)
  json(T u) {
    if (static_cast<std::uint64_t>(u) <= static_cast<std::uint64_t>(INT64_MAX)) v_ = static_cast<std::int64_t>(u);
    else v_ = static_cast<std::uint64_t>(u);
  }
  json(double d) : v_(d) {}
  json(std::string s) : v_(std::move(s)) {}
  json(std::string_view s) : v_(std::string(s)) {}
  json(const char* s) : v_(std::string(s)) {}

  static json array() { json j; j.v_ = array_t{}; return j; }
  static json object() { json j; j.v_ = object_t{}; return j; }

  [[nodiscard]] bool is_null() const noexcept { return v_.index() == 0; }
  [[nodiscard]] bool is_object() const noexcept { return std::holds_alternative<object_t>(v_); }
  [[nodiscard]] bool is_array() const noexcept { return std::holds_alternative<array_t>(v_); }
  [[nodiscard]] bool is_string() const noexcept { return std::holds_alternative<std::string>(v_); }

  /// The member `key`; a missing one is damage in a manifest.
  [[nodiscard]] const json& at(std::string_view key) const {
    if (const json* j = find(key)) return *j;
    throw error(errc::corrupt, "missing field '" + std::string(key) + "'");
  }
  [[nodiscard]] const json* find(std::string_view key) const {
    if (const auto* o = std::get_if<object_t>(&v_)) {
      for (const auto& [k, v] : *o)
        if (k == key) return &v;
    }
    return nullptr;
  }
  /// Inserts `key` (a null value becomes an object).
  json& operator[](std::string_view key) {
    if (is_null()) v_ = object_t{};
    auto* o = std::get_if<object_t>(&v_);
    if (!o) throw error(errc::invalid_argument, "json: operator[] on a value that is not an object");
    for (auto& [k, v] : *o)
      if (k == key) return v;
    o->emplace_back(std::string(key), json());
    return o->back().second;
  }
  void push_back(json j) {
    if (is_null()) v_ = array_t{};
    auto* a = std::get_if<array_t>(&v_);
    if (!a) throw error(errc::invalid_argument, "json: push_back on a value that is not an array");
    a->push_back(std::move(j));
  }
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
    wrong("a signed 64-bit integer");
  }
  [[nodiscard]] std::uint64_t as_uint64() const {
    if (const auto* i = std::get_if<std::int64_t>(&v_); i && *i >= 0) return static_cast<std::uint64_t>(*i);
    if (const auto* u = std::get_if<std::uint64_t>(&v_)) return *u;
    wrong("an unsigned integer");
  }
  [[nodiscard]] double as_double() const {
    if (const auto* d = std::get_if<double>(&v_)) return *d;
    if (const auto* i = std::get_if<std::int64_t>(&v_)) return static_cast<double>(*i);
    if (const auto* u = std::get_if<std::uint64_t>(&v_)) return static_cast<double>(*u);
    wrong("a number");
  }

  /// Compact (indent < 0) or pretty text.
  [[nodiscard]] std::string dump(int indent = -1) const {
    std::string out;
    write(out, indent, 0);
    return out;
  }

  /// Parses a whole document; anything malformed is errc::corrupt with line and column.
  static json parse(std::string_view text) {
    parser p{text};
    p.ws();
    json j = p.value(0);
    p.ws();
    if (p.i != text.size()) p.fail("end of document");
    return j;
  }

 private:
  template <class T>
  const T& get(const char* what) const {
    if (const auto* v = std::get_if<T>(&v_)) return *v;
    wrong(what);
  }
  [[noreturn]] void wrong(const char* expected) const {
    static constexpr const char* names[] = {"null", "a boolean", "an integer", "an integer", "a number",
                                            "a string", "an array", "an object"};
    throw error(errc::corrupt, fmt::format("expected {}, got {}", expected, names[v_.index()]));
  }

  static void write_string(std::string& out, std::string_view s) {
    out += '"';
    for (unsigned char c : s) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        default:
          if (c < 0x20) out += fmt::format("\\u{:04x}", c);
          else out += static_cast<char>(c);
      }
    }
    out += '"';
  }

  void write(std::string& out, int indent, int depth) const {
    auto newline = [&](int d) {
      if (indent < 0) return;
      out += '\n';
      out.append(static_cast<std::size_t>(indent * d), ' ');
    };
    switch (v_.index()) {
      case 0: out += "null"; break;
      case 1: out += std::get<bool>(v_) ? "true" : "false"; break;
      case 2: out += fmt::format("{}", std::get<std::int64_t>(v_)); break;
      case 3: out += fmt::format("{}", std::get<std::uint64_t>(v_)); break;
      case 4: {
        const double d = std::get<double>(v_);
        std::string s = fmt::format("{}", d);
        if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // stays a double when read back
        if (s == "inf" || s == "-inf" || s == "nan" || s == "-nan") s = "null";  // not JSON
        out += s;
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

  struct parser {
    std::string_view s;
    std::size_t i = 0;

    [[noreturn]] void fail(const char* expected) const {
      std::size_t line = 1, col = 1;
      for (std::size_t k = 0; k < i && k < s.size(); ++k) {
        if (s[k] == '\n') {
          ++line;
          col = 1;
        } else {
          ++col;
        }
      }
      throw error(errc::corrupt, fmt::format("malformed JSON at line {} column {}: expected {}", line, col, expected));
    }
    void ws() {
      while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) ++i;
    }
    bool eat(char c) {
      if (i < s.size() && s[i] == c) {
        ++i;
        return true;
      }
      return false;
    }
    void literal(std::string_view word) {
      if (s.substr(i, word.size()) != word) fail("a value");
      i += word.size();
    }

    json value(int depth) {
      if (depth > 64) fail("nesting no deeper than 64");
      if (i >= s.size()) fail("a value");
      const char c = s[i];
      if (c == '{') return object(depth);
      if (c == '[') return array(depth);
      if (c == '"') return json(string());
      if (c == 't') return literal("true"), json(true);
      if (c == 'f') return literal("false"), json(false);
      if (c == 'n') return literal("null"), json();
      if (c == '-' || (c >= '0' && c <= '9')) return number();
      fail("a value");
    }
    json object(int depth) {
      ++i;
      json j = json::object();
      ws();
      if (eat('}')) return j;
      for (;;) {
        ws();
        if (i >= s.size() || s[i] != '"') fail("a string key");
        std::string key = string();
        ws();
        if (!eat(':')) fail("':'");
        ws();
        std::get<object_t>(j.v_).emplace_back(std::move(key), value(depth + 1));
        ws();
        if (eat('}')) return j;
        if (!eat(',')) fail("',' or '}'");
      }
    }
    json array(int depth) {
      ++i;
      json j = json::array();
      ws();
      if (eat(']')) return j;
      for (;;) {
        ws();
        std::get<array_t>(j.v_).push_back(value(depth + 1));
        ws();
        if (eat(']')) return j;
        if (!eat(',')) fail("',' or ']'");
      }
    }
    unsigned hex4() {
      if (i + 4 > s.size()) fail("four hex digits");
      unsigned v = 0;
      for (int k = 0; k < 4; ++k) {
        const char c = s[i++];
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
      } else if (cp < 0x800) {
        out += static_cast<char>(0xc0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3f));
      } else if (cp < 0x10000) {
        out += static_cast<char>(0xe0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (cp & 0x3f));
      } else {
        out += static_cast<char>(0xf0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (cp & 0x3f));
      }
    }
    std::string string() {
      ++i;  // opening quote
      std::string out;
      for (;;) {
        if (i >= s.size()) fail("a closing '\"'");
        const auto c = static_cast<unsigned char>(s[i++]);
        if (c == '"') return out;
        if (c < 0x20) {
          --i;
          fail("no control character inside a string");
        }
        if (c != '\\') {
          out += static_cast<char>(c);
          continue;
        }
        if (i >= s.size()) fail("an escape");
        switch (s[i++]) {
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
            if (cp >= 0xd800 && cp < 0xdc00) {
              if (!(eat('\\') && eat('u'))) fail("a low surrogate");
              const unsigned lo = hex4();
              if (lo < 0xdc00 || lo >= 0xe000) fail("a low surrogate");
              cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            }
            utf8(out, cp);
            break;
          }
          default: --i; fail("a valid escape");
        }
      }
    }
    json number() {
      const std::size_t start = i;
      const bool neg = eat('-');
      if (i >= s.size() || s[i] < '0' || s[i] > '9') fail("a digit");
      if (s[i] == '0' && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '9') fail("no leading zero");
      while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
      bool integral = true;
      if (eat('.')) {
        integral = false;
        if (i >= s.size() || s[i] < '0' || s[i] > '9') fail("a digit after '.'");
        while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
      }
      if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
        integral = false;
        ++i;
        if (!eat('+')) eat('-');
        if (i >= s.size() || s[i] < '0' || s[i] > '9') fail("a digit in the exponent");
        while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
      }
      const std::string text(s.substr(start, i - start));
      if (integral) {
        errno = 0;
        if (neg) {
          const long long v = std::strtoll(text.c_str(), nullptr, 10);
          if (errno != ERANGE) return json(static_cast<std::int64_t>(v));
        } else {
          const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
          if (errno != ERANGE) return json(static_cast<std::uint64_t>(v));
        }
        --i;
        fail("an integer that fits 64 bits");
      }
      return json(std::strtod(text.c_str(), nullptr));
    }
  };

  std::variant<std::nullptr_t, bool, std::int64_t, std::uint64_t, double, std::string, array_t, object_t> v_{nullptr};
};

}  // namespace elastic::detail
