// The text machinery behind tailbatch/metrics.hpp: Prometheus name rules, UTF-8 checks,
// escaping for the text exposition format 0.0.4 and for JSON, and number formatting.
// Nothing here is public API.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <system_error>

#include <tailbatch/detail/math.hpp>

namespace tailbatch::detail {

// Metric names as tailbatch accepts them: Prometheus' [a-zA-Z_:][a-zA-Z0-9_:]* without the
// colon, which Prometheus reserves for recording rules ("exporters should not use them").
[[nodiscard]] inline bool is_metric_name(std::string_view s) noexcept {
  if (s.empty()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    const bool digit = c >= '0' && c <= '9';
    if (!(alpha || (digit && i > 0))) return false;
  }
  return true;
}

// Label names: [a-zA-Z_][a-zA-Z0-9_]* (the "__" prefix is checked separately: reserved).
[[nodiscard]] inline bool is_label_name(std::string_view s) noexcept { return is_metric_name(s); }

[[nodiscard]] inline bool ends_with(std::string_view s, std::string_view suffix) noexcept {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Whether s is well-formed UTF-8 (no overlong forms, no surrogates, nothing above
// U+10FFFF), as Prometheus requires of label values and help text.
[[nodiscard]] inline bool is_valid_utf8(std::string_view s) noexcept {
  std::size_t i = 0;
  const std::size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    std::uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1Fu;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0Fu;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07u;
    } else {
      return false;
    }
    if (n - i < len) return false;
    for (std::size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3Fu);
    }
    const std::uint32_t min_for_len = len == 2 ? 0x80u : len == 3 ? 0x800u : 0x10000u;
    if (cp < min_for_len || cp > 0x10FFFFu || (cp >= 0xD800u && cp <= 0xDFFFu)) return false;
    i += len;
  }
  return true;
}

// Text in the 0.0.4 format: backslash and newline are escaped, and a double quote too when
// escape_quote is set.
inline void append_escaped(std::string& out, std::string_view s, bool escape_quote) {
  for (const char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"' && escape_quote) {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

// HELP text in the 0.0.4 format: backslash and newline are escaped, quotes are not.
inline void append_help_escaped(std::string& out, std::string_view s) {
  append_escaped(out, s, false);
}

// A label value in the 0.0.4 format: backslash, double quote and newline are escaped.
inline void append_label_value_escaped(std::string& out, std::string_view s) {
  append_escaped(out, s, true);
}

// A JSON string literal, quotes included. Control characters become \n, \t, ... or
// \u00XX; everything else (valid UTF-8, checked at registration) passes through.
inline void append_json_string(std::string& out, std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 0xF];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

// The shortest text that reads back as exactly v ("0.5", "42", "1e-06"). Finite values only.
inline void append_finite_double(std::string& out, double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  if (r.ec == std::errc{}) out.append(buf, r.ptr);
}

// A sample value as Prometheus writes it: NaN, +Inf and -Inf by name.
inline void append_prometheus_double(std::string& out, double v) {
  if (detail::is_nan(v)) {
    out += "NaN";
  } else if (detail::is_inf(v)) {
    out += v > 0 ? "+Inf" : "-Inf";
  } else {
    append_finite_double(out, v);
  }
}

// A JSON number; JSON has no NaN or infinities, so those become null.
inline void append_json_double(std::string& out, double v) {
  if (detail::is_finite(v)) {
    append_finite_double(out, v);
  } else {
    out += "null";
  }
}

inline void append_uint(std::string& out, std::uint64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

}  // namespace tailbatch::detail
