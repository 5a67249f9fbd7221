// Watch: the vocabulary of list-and-watch inputs (Kubernetes informers, etcd
// watches, event feeds), shared by WatchSource, SharedSource and the
// testing kit's FakeWatchWorld. The user writes two functions:
//
//   // Everything, and the position to watch from.
//   absl::StatusOr<WatchList<std::string, Vm>> List(const Context& ctx);
//   // A stream of the changes after `token`.
//   absl::StatusOr<std::unique_ptr<WatchStream<std::string, Vm>>> Watch(
//       const Context& ctx, const std::string& token);
//
// and a WatchStream whose Next(ctx) returns the next events, waiting for
// some until ctx's deadline:
//
//   class VmStream : public WatchStream<std::string, Vm> {
//    public:
//     absl::StatusOr<WatchBatch<std::string, Vm>> Next(
//         const Context& ctx) override {
//       SETPOINT_ASSIGN_OR_RETURN(Page page, api_->Changes(ctx, token_));
//       if (page.gone) return WatchExpiredError("token " + token_);
//       WatchBatch<std::string, Vm> batch{.token = page.token};
//       for (auto& c : page.changes) batch.events.push_back({c.name, c.vm});
//       token_ = page.token;
//       return batch;
//     }
//   };
//
// Tokens are opaque strings (a resource version, a revision): the source
// only keeps the last one and gives it back. A stream answers "expired"
// (the token is older than the server keeps, etcd's compaction, HTTP 410)
// with kOutOfRange: WatchExpiredError / IsWatchExpired.
//
// Thread safety: value types; a WatchStream is used by one thread at a
// time (the source's).
#ifndef SETPOINT_PROCESSOR_WATCH_H_
#define SETPOINT_PROCESSOR_WATCH_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "setpoint/base/context.h"

namespace setpoint {

// What a list returns: every item, and the token to watch from.
template <class K, class V>
struct WatchList {
  absl::flat_hash_map<K, V> items = {};
  std::string token = "";
};

// One change: `value` set, or nullopt for a delete.
template <class K, class V>
struct WatchEvent {
  K key;
  std::optional<V> value = std::nullopt;
};

// What a stream's Next returns.
template <class K, class V>
struct WatchBatch {
  // In stream order; a key may appear more than once (the last wins).
  std::vector<WatchEvent<K, V>> events = {};
  // The position after these events, to resume from. Empty: no news (the
  // deadline came with nothing to say; with events: keep the previous
  // position). A batch with no events and a token is a bookmark: it moves
  // the position on a quiet stream and shows the stream is alive.
  std::string token = "";
  // The stream ended cleanly after these events (a server-side timeout):
  // the source opens a new one from the token at once.
  bool closed = false;
};

// An open stream of changes. Destroyed by the source when it closes it.
template <class K, class V>
class WatchStream {
 public:
  virtual ~WatchStream() = default;
  // The next events, waiting for some until ctx's deadline, then an empty
  // batch (or kDeadlineExceeded). Return soon when ctx is cancelled (the
  // source closes the stream: stop, a re-list). Errors end the stream:
  // kOutOfRange means expired (the source lists again and watches from the
  // new token); any other code means broken (the source opens a new stream
  // from the last token after a backoff).
  virtual absl::StatusOr<WatchBatch<K, V>> Next(const Context& ctx) = 0;
};

// kOutOfRange, the code that tells a watch source its token expired.
inline absl::Status WatchExpiredError(std::string_view message) {
  return absl::OutOfRangeError(
      absl::string_view(message.data(), message.size()));
}
inline bool IsWatchExpired(const absl::Status& status) {
  return status.code() == absl::StatusCode::kOutOfRange;
}

}  // namespace setpoint

#endif  // SETPOINT_PROCESSOR_WATCH_H_
