#include "setpoint/base/json.h"

#include <cstddef>

#include "absl/strings/str_format.h"

namespace setpoint {
namespace {

// The length of the well-formed UTF-8 sequence (RFC 3629: no overlong
// forms, no surrogates, at most U+10FFFF) of 2 to 4 bytes at s[i], or 0.
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  auto byte = [&](size_t k) -> unsigned {
    return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0u;
  };
  auto in = [](unsigned b, unsigned lo, unsigned hi) {
    return b >= lo && b <= hi;
  };
  const unsigned c = byte(0);
  if (in(c, 0xc2, 0xdf)) return in(byte(1), 0x80, 0xbf) ? 2 : 0;
  if (in(c, 0xe0, 0xef)) {
    const unsigned lo = c == 0xe0 ? 0xa0 : 0x80;
    const unsigned hi = c == 0xed ? 0x9f : 0xbf;
    return in(byte(1), lo, hi) && in(byte(2), 0x80, 0xbf) ? 3 : 0;
  }
  if (in(c, 0xf0, 0xf4)) {
    const unsigned lo = c == 0xf0 ? 0x90 : 0x80;
    const unsigned hi = c == 0xf4 ? 0x8f : 0xbf;
    return in(byte(1), lo, hi) && in(byte(2), 0x80, 0xbf) &&
                   in(byte(3), 0x80, 0xbf)
               ? 4
               : 0;
  }
  return 0;
}

}  // namespace

void AppendJsonString(std::string* out, std::string_view s) {
  out->push_back('"');
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      size_t n = Utf8SequenceLength(s, i);
      if (n == 0) {
        out->append("\\ufffd");
        ++i;
      } else {
        out->append(s.data() + i, n);
        i += n;
      }
      continue;
    }
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\b':
        out->append("\\b");
        break;
      case '\f':
        out->append("\\f");
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          absl::StrAppendFormat(out, "\\u%04x", c);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
    ++i;
  }
  out->push_back('"');
}

}  // namespace setpoint
