// JSON text as the library writes it: one string escaper and one number writer, shared by the
// JSON value type (checkpoint manifests) and the event log, so both write the same bytes for
// the same value. Light on purpose: the event log and the timer scope's warnings include it.
#pragma once

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

namespace elastic::inline v1::internal {

/// Appends `s` as a JSON string literal (quotes included), escaping what JSON requires:
/// quote, backslash and every control character (\n \r \t by name, the rest as \u00XX).
inline void append_json_string(std::string& out, std::string_view s) {
  constexpr char hex[] = "0123456789abcdef";
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default: {
        const auto u = static_cast<unsigned char>(c);
        if (u < 0x20) {
          const char esc[] = {'\\', 'u', '0', '0', hex[u >> 4], hex[u & 0xf]};
          out.append(esc, sizeof esc);
        } else {
          out += c;
        }
      }
    }
  }
  out += '"';
}

/// Appends an integer in decimal.
template <class Int>
void append_json_integer(std::string& out, Int v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

/// Appends a finite double in its shortest round-trip form, written as fmt's "{}" writes it (and
/// Python's repr): fixed between 1e-4 and 1e16 ("0.5", "100", "0.0001"), scientific outside
/// ("1e+16", "1.5e-05"), independent of the locale. A NaN or an infinity, which JSON cannot say,
/// is written as null and returns false.
inline bool append_json_double(std::string& out, double d) {
  if (!std::isfinite(d)) {
    out += "null";
    return false;
  }
  char sci[32];
  const auto r = std::to_chars(sci, sci + sizeof sci, d, std::chars_format::scientific);
  const std::string_view text(sci, static_cast<std::size_t>(r.ptr - sci));
  const std::size_t e = text.find('e');
  int exp = 0;
  std::from_chars(text.data() + e + 1 + (text[e + 1] == '+'), text.data() + text.size(), exp);
  if (exp < -4 || exp >= 16) {
    out.append(text);
    return true;
  }
  std::string_view mantissa = text.substr(0, e);
  if (mantissa.front() == '-') {
    out += '-';
    mantissa.remove_prefix(1);
  }
  std::string digits(1, mantissa.front());
  if (mantissa.size() > 2) digits.append(mantissa.substr(2));  // "d.ddd": skip the point
  if (exp < 0) {
    out += "0.";
    out.append(static_cast<std::size_t>(-exp - 1), '0');
    out += digits;
  } else if (digits.size() <= static_cast<std::size_t>(exp) + 1) {
    out += digits;
    out.append(static_cast<std::size_t>(exp) + 1 - digits.size(), '0');
  } else {
    out.append(digits, 0, static_cast<std::size_t>(exp) + 1);
    out += '.';
    out.append(digits, static_cast<std::size_t>(exp) + 1);
  }
  return true;
}

}  // namespace elastic::inline v1::internal
