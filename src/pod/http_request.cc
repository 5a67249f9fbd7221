#include "http_request.h"

#include <cstdint>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace setpoint {
namespace {

HttpHeadResult Refuse(int status, std::string why) {
  HttpHeadResult r;
  r.state = HttpHeadResult::kRefused;
  r.status = status;
  r.why = std::move(why);
  return r;
}

// RFC 9110 5.6.2 tchar.
bool IsTokenChar(unsigned char c) {
  if (absl::ascii_isalnum(c)) return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

// Checks the bytes of a request line received so far (without its CRLF;
// `complete` when the CRLF arrived): "METHOD SP target SP HTTP/1.x".
// Returns a refusal, or kIncomplete while nothing is wrong yet.
HttpHeadResult CheckRequestLine(absl::string_view line, bool complete) {
  size_t i = 0;
  while (i < line.size() && IsTokenChar(line[i])) ++i;
  if (i == line.size()) {
    return complete ? Refuse(400, "the request line has no target")
                    : HttpHeadResult{};
  }
  if (i == 0 || line[i] != ' ') {
    return Refuse(400, "the request line does not start with a method");
  }
  size_t target = ++i;
  while (i < line.size() && line[i] > 0x20 && line[i] < 0x7f) ++i;
  if (i == line.size()) {
    return complete ? Refuse(400, "the request line has no HTTP version")
                    : HttpHeadResult{};
  }
  if (i == target || line[i] != ' ') {
    return Refuse(400, "the request target is empty or holds a control byte");
  }
  absl::string_view version = line.substr(i + 1);
  constexpr absl::string_view kPrefix = "HTTP/";
  const size_t n = std::min(version.size(), kPrefix.size());
  if (version.substr(0, n) != kPrefix.substr(0, n)) {
    return Refuse(400, "the request line does not end in HTTP/1.x");
  }
  if (version.size() > kPrefix.size()) {
    absl::string_view digits = version.substr(kPrefix.size());
    for (char c : digits) {
      if (c != '.' && !absl::ascii_isdigit(static_cast<unsigned char>(c))) {
        return Refuse(400, "the HTTP version is not a number");
      }
    }
    if (complete && digits != "1.0" && digits != "1.1") {
      return Refuse(
          505, absl::StrCat("HTTP/", digits, " is not served; use HTTP/1.1"));
    }
    if (digits.size() > 3) return Refuse(505, "use HTTP/1.1");
  }
  if (complete && version.size() != kPrefix.size() + 3) {
    return Refuse(400, "the HTTP version is not 1.0 or 1.1");
  }
  return HttpHeadResult{};
}

}  // namespace

HttpHeadResult ParseHttpHead(absl::string_view buffer,
                             const HttpLimits& limits) {
  // Empty lines before a request are allowed (and skipped).
  size_t start = 0;
  while (buffer.size() - start >= 2 && buffer[start] == '\r' &&
         buffer[start + 1] == '\n') {
    start += 2;
  }
  if (start > limits.max_head_bytes) {
    return Refuse(400, "too many empty lines before the request");
  }
  absl::string_view rest = buffer.substr(start);
  const size_t line_end = rest.find("\r\n");
  // A bare LF, or a CR not followed by LF, never ends a line here.
  const size_t bad_eol = rest.substr(0, line_end).find_first_of("\r\n");
  if (bad_eol != absl::string_view::npos &&
      !(rest[bad_eol] == '\r' && bad_eol + 1 == rest.size())) {
    return Refuse(400, "the request line holds a bare CR or LF");
  }
  absl::string_view line = rest.substr(0, line_end);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  HttpHeadResult check =
      CheckRequestLine(line, line_end != absl::string_view::npos);
  if (check.state == HttpHeadResult::kRefused) return check;
  if (line_end == absl::string_view::npos) {
    if (rest.size() > limits.max_head_bytes) {
      return Refuse(414, absl::StrCat("the request line is longer than ",
                                      limits.max_head_bytes, " bytes"));
    }
    return HttpHeadResult{};
  }
  if (line_end > limits.max_head_bytes) {
    return Refuse(414, absl::StrCat("the request line is longer than ",
                                    limits.max_head_bytes, " bytes"));
  }
  const size_t head_end = rest.find("\r\n\r\n");
  const size_t head_size =
      head_end == absl::string_view::npos ? rest.size() : head_end + 4;
  if (head_size > limits.max_head_bytes) {
    return Refuse(431, absl::StrCat("the request head is longer than ",
                                    limits.max_head_bytes, " bytes"));
  }
  // Header lines received so far, each checked as soon as it is complete.
  absl::string_view fields =
      head_end == absl::string_view::npos
          ? rest.substr(line_end + 2)
          : rest.substr(line_end + 2, head_end + 2 - (line_end + 2));
  HttpHead head;
  bool have_length = false;
  bool keep_alive = false;
  size_t pos = 0;
  while (pos < fields.size()) {
    const size_t eol = fields.find("\r\n", pos);
    if (eol == absl::string_view::npos) break;  // Not complete yet.
    absl::string_view field = fields.substr(pos, eol - pos);
    pos = eol + 2;
    if (field.empty()) break;
    if (field[0] == ' ' || field[0] == '\t') {
      return Refuse(400, "a header is folded over lines (obsolete)");
    }
    const size_t colon = field.find(':');
    if (colon == absl::string_view::npos || colon == 0) {
      return Refuse(400, "a header line has no name");
    }
    absl::string_view name = field.substr(0, colon);
    for (char c : name) {
      if (!IsTokenChar(static_cast<unsigned char>(c))) {
        return Refuse(400, "a header name holds a space or a separator");
      }
    }
    absl::string_view value =
        absl::StripAsciiWhitespace(field.substr(colon + 1));
    for (char c : value) {
      unsigned char u = static_cast<unsigned char>(c);
      if ((u < 0x20 && u != '\t') || u == 0x7f) {
        return Refuse(400, "a header value holds a control byte");
      }
    }
    if (absl::EqualsIgnoreCase(name, "content-length")) {
      uint64_t n = 0;
      bool digits = !value.empty() && value.size() <= 19 &&
                    std::all_of(value.begin(), value.end(), [](char c) {
                      return absl::ascii_isdigit(static_cast<unsigned char>(c));
                    });
      if (!digits || !absl::SimpleAtoi(value, &n)) {
        return Refuse(400, "Content-Length is not a number");
      }
      if (have_length && n != head.content_length) {
        return Refuse(400, "Content-Length is given twice");
      }
      if (n > limits.max_body_bytes) {
        return Refuse(413,
                      absl::StrCat("the body is ", n, " bytes; the limit is ",
                                   limits.max_body_bytes));
      }
      have_length = true;
      head.content_length = static_cast<size_t>(n);
    } else if (absl::EqualsIgnoreCase(name, "transfer-encoding")) {
      return Refuse(501,
                    "Transfer-Encoding is not served; send Content-Length");
    } else if (absl::EqualsIgnoreCase(name, "expect")) {
      return Refuse(417,
                    "Expect is not served (no 100 Continue); send the "
                    "request without it");
    } else if (absl::EqualsIgnoreCase(name, "connection")) {
      for (absl::string_view option : absl::StrSplit(value, ',')) {
        option = absl::StripAsciiWhitespace(option);
        if (absl::EqualsIgnoreCase(option, "close")) head.close = true;
        if (absl::EqualsIgnoreCase(option, "keep-alive")) keep_alive = true;
      }
    }
  }
  if (head_end == absl::string_view::npos) return HttpHeadResult{};

  const size_t sp = line.find(' ');
  head.method = std::string(line.substr(0, sp));
  absl::string_view target = line.substr(sp + 1, line.rfind(' ') - sp - 1);
  head.minor_version = line.back() - '0';
  for (absl::string_view scheme : {"http://", "https://"}) {
    if (absl::StartsWithIgnoreCase(target, scheme)) {
      // Absolute form: the path after the authority.
      target.remove_prefix(scheme.size());
      const size_t slash = target.find('/');
      target = slash == absl::string_view::npos ? "/" : target.substr(slash);
    }
  }
  if (target.empty() || target[0] != '/') {
    return Refuse(400, "the request target is not a path");
  }
  head.path = std::string(target.substr(0, target.find('?')));
  if (head.minor_version == 0 && !keep_alive) head.close = true;
  head.head_bytes = start + head_end + 4;
  HttpHeadResult done;
  done.state = HttpHeadResult::kComplete;
  done.head = std::move(head);
  return done;
}

const char* HttpReason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 417:
      return "Expectation Failed";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

}  // namespace setpoint
