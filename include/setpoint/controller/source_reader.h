// SourceReader: read what a source of a controller holds, from any thread,
// and wait for state fresher than now — for plans, whose rounds run back to
// back and whose Create must not act on what the previous round's writes
// have not reached yet.
//
//   auto* zone = b.SharedPoll<std::string, Record>("zone", list);
//   setpoint::SourceReader<std::string, Record> reader = b.Reader(zone);
//   b.Reconcile(setpoint::MakePlan("serial", [reader](const Context& ctx)
//       -> absl::StatusOr<setpoint::Procedures> {
//     SETPOINT_RETURN_IF_ERROR(reader.AwaitFresh(ctx));  // a list after now
//     SETPOINT_ASSIGN_OR_RETURN(auto records, reader.Snapshot());
//     ...
//   }));
//
// AwaitFresh costs a list (a watch: a re-list) each time: call it where a
// round must see the writes of the round before, not on every read.
//
// Thread safety: thread-safe; a copyable value. After its Run ended the
// reader fails with kFailedPrecondition.
#ifndef SETPOINT_CONTROLLER_SOURCE_READER_H_
#define SETPOINT_CONTROLLER_SOURCE_READER_H_

#include <functional>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"

namespace setpoint {

namespace internal {

// A piece's source as readers see it; Close() (the piece stops) waits for
// the calls in progress and refuses later ones.
template <class K, class V>
class SourceAccess {
 public:
  using Map = absl::flat_hash_map<K, V>;
  SourceAccess(std::function<absl::Status(const Context&)> fresh,
               std::function<Map()> snapshot)
      : fresh_(std::move(fresh)), snapshot_(std::move(snapshot)) {}

  absl::Status AwaitFresh(const Context& ctx) {
    if (!Enter()) return Closed();
    absl::Status s = fresh_(ctx);
    Leave();
    return s;
  }
  absl::StatusOr<Map> Snapshot() {
    if (!Enter()) return Closed();
    Map m = snapshot_();
    Leave();
    return m;
  }
  void Close() {
    MutexLock l(&mu_);
    closed_ = true;
    while (calls_ > 0) cv_.Wait(&mu_);
  }

 private:
  static absl::Status Closed() {
    return absl::FailedPreconditionError(
        "source reader: the controller's run ended");
  }
  bool Enter() {
    MutexLock l(&mu_);
    if (closed_) return false;
    ++calls_;
    return true;
  }
  void Leave() {
    MutexLock l(&mu_);
    --calls_;
    cv_.SignalAll();
  }

  const std::function<absl::Status(const Context&)> fresh_;
  const std::function<Map()> snapshot_;
  Mutex mu_;
  CondVar cv_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace internal

template <class K, class V>
class SourceReader {
 public:
  using Map = absl::flat_hash_map<K, V>;

  // Reads nothing: every call fails with kFailedPrecondition.
  SourceReader() = default;

  // Returns once a list that began after this call landed: OK, or that
  // list's error. ctx.Err() if ctx ends first; kFailedPrecondition once
  // the source stopped. In manual mode the list runs on the caller.
  absl::Status AwaitFresh(const Context& ctx) const {
    if (access_ == nullptr) return NoSource();
    return access_->AwaitFresh(ctx);
  }
  // What the source holds: the node's range for Poll and Watch, every key
  // for a shared source.
  absl::StatusOr<Map> Snapshot() const {
    if (access_ == nullptr) return NoSource();
    return access_->Snapshot();
  }
  bool valid() const { return access_ != nullptr; }

 private:
  friend class ControllerBuilder;
  explicit SourceReader(std::shared_ptr<internal::SourceAccess<K, V>> access)
      : access_(std::move(access)) {}
  static absl::Status NoSource() {
    return absl::FailedPreconditionError(
        "source reader: not a store made by Poll, Watch or a shared source");
  }
  std::shared_ptr<internal::SourceAccess<K, V>> access_;
};

}  // namespace setpoint

#endif  // SETPOINT_CONTROLLER_SOURCE_READER_H_
