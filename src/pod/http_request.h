// ParseHttpHead: the request head of HTTP/1.0 and 1.1 (RFC 9112) as the
// ops listener reads it, a pure function of the bytes received so far, so
// every refusal is decided and tested without sockets:
//
//   HttpHeadResult r = ParseHttpHead(buffer, {.max_head_bytes = 8192,
//                                             .max_body_bytes = 16384});
//   if (r.state == HttpHeadResult::kIncomplete) { /* read more */ }
//   if (r.state == HttpHeadResult::kRefused) { /* answer r.status, close */ }
//   // kComplete: r.head, then r.head.content_length bytes of body.
//
// Refused at once, without waiting for the rest:
//   400 a request line or header that cannot be HTTP (checked byte by byte
//       as they arrive, so garbage is refused on its first bad byte), a
//       bad or repeated Content-Length, a target that is not a path;
//   413 a Content-Length over max_body_bytes (before any body is read);
//   414 a request line longer than max_head_bytes;
//   417 an Expect header (the listener never sends 100 Continue);
//   431 a head longer than max_head_bytes;
//   501 a Transfer-Encoding (bodies must come with Content-Length);
//   505 an HTTP version other than 1.0 and 1.1.
// Empty lines before the request line are skipped (RFC 9112 2.2).
//
// Thread safety: a pure function.
#ifndef SETPOINT_SRC_POD_HTTP_REQUEST_H_
#define SETPOINT_SRC_POD_HTTP_REQUEST_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace setpoint {

struct HttpLimits {
  // The request line and headers together, CRLFs included.
  // Default: 8 KiB.
  size_t max_head_bytes = 8 << 10;
  // A body, for every method.
  // Default: 16 KiB.
  size_t max_body_bytes = 16 << 10;
};

// What the listener needs of a request head.
struct HttpHead {
  std::string method;     // As sent (methods are case-sensitive).
  std::string path;       // The target's path, without the query.
  int minor_version = 1;  // HTTP/1.<minor_version>.
  // The client asked to close ("Connection: close", or HTTP/1.0 without
  // "Connection: keep-alive").
  bool close = false;
  size_t content_length = 0;
  // Bytes of the head, the empty lines before it and the final CRLF
  // included: the body starts here.
  size_t head_bytes = 0;
};

struct HttpHeadResult {
  enum State { kIncomplete, kRefused, kComplete };
  State state = kIncomplete;
  // kRefused: the status to answer, and why in words for the body.
  int status = 0;
  std::string why;
  // kComplete.
  HttpHead head;
};

HttpHeadResult ParseHttpHead(absl::string_view buffer,
                             const HttpLimits& limits);

// The reason phrase of a status the listener sends ("Not Found"), or
// "Unknown".
const char* HttpReason(int status);

}  // namespace setpoint

#endif  // SETPOINT_SRC_POD_HTTP_REQUEST_H_
