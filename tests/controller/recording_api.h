// The fakes the controller tests share: an API that records who wrote what
// and checks each write the way a fenced system does (and against the range
// the test says the writer truly owns), its client, a catalog of desired
// state. The one-owner check of every handoff test is RecordingApi::Counts.
//
// Thread safety: RecordingApi and Catalog are thread-safe.
#ifndef SETPOINT_TESTS_CONTROLLER_RECORDING_API_H_
#define SETPOINT_TESTS_CONTROLLER_RECORDING_API_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
#include "setpoint/base/status.h"
#include "setpoint/controller/controller.h"
#include "setpoint/node/shard.h"
#include "setpoint/processor/syncer.h"
#include "setpoint/testing/fake_watch_world.h"

namespace setpoint::controller_test {

using Map = absl::flat_hash_map<std::string, int>;

constexpr uint32_t kRing = 64;

// A fake API that records every write: who (node, token, the range it
// claimed) wrote which key, and checks it the way a fenced system does,
// plus against the range the test says the node truly owns right now.
class RecordingApi {
 public:
  struct Counts {
    int64_t writes = 0;         // Accepted.
    int64_t stale = 0;          // Token below one seen for the shard.
    int64_t unowned = 0;        // No assignment, or key not in its range.
    int64_t outside_truth = 0;  // Started for a key the node does not own.
    int64_t cancelled = 0;      // Returned because ctx was cancelled.
    int64_t max_running_per_key = 0;
  };

  // The range `node` may write now (kept by the test: shrunk after the
  // node's UpdateShardRange returned, grown before it is called).
  void SetTruth(const std::string& node, ShardRange range) {
    MutexLock l(&mu_);
    truth_[node] = range;
  }
  // Calls wait at a gate until Open(); with `ignore_cancel` they also
  // ignore their context until then.
  void Hold(bool ignore_cancel) {
    MutexLock l(&mu_);
    held_ = true;
    ignore_cancel_ = ignore_cancel;
  }
  void Open() {
    MutexLock l(&mu_);
    held_ = false;
    cv_.SignalAll();
  }

  absl::StatusOr<Map> List(const Context&) {
    MutexLock l(&mu_);
    ++lists_;
    if (!list_error_.ok()) return list_error_;
    return world_;
  }
  // Lists fail with `error` until it is OK again.
  void FailLists(absl::Status error) {
    MutexLock l(&mu_);
    list_error_ = std::move(error);
  }
  // Accepted writes are also made in `world` (for watches of the API).
  void MirrorTo(testing::FakeWatchWorld<std::string, int>* world) {
    MutexLock l(&mu_);
    mirror_ = world;
  }
  int64_t lists() const {
    MutexLock l(&mu_);
    return lists_;
  }
  absl::Status Write(const Context& ctx, const std::string& key,
                     std::optional<int> value) {
    const Assignment* a = AssignmentOf(ctx);
    MutexLock l(&mu_);
    if (a == nullptr || !a->Owns(key)) {
      ++counts_.unowned;
      return absl::PermissionDeniedError("not the owner");
    }
    const uint32_t shard = ShardOf(key, a->ring_size);
    if (!truth_[a->node_id].Contains(shard)) ++counts_.outside_truth;
    running_.insert({a->node_id, key});
    counts_.max_running_per_key =
        std::max<int64_t>(counts_.max_running_per_key, ++per_key_[key]);
    ++entered_;
    cv_.SignalAll();
    auto open = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !held_; };
    if (held_) {
      cv_.Wait(&mu_, ctx.stop_token(), open);
      // Noted while the call still runs, so a test sees the cancellation
      // arrive before the call returns.
      if (ctx.Cancelled()) {
        saw_cancel_.insert(key);
        cv_.SignalAll();
      }
      if (ignore_cancel_) cv_.Wait(&mu_, std::stop_token(), open);
    }
    running_.erase({a->node_id, key});
    --per_key_[key];
    if (ctx.Cancelled()) {
      ++counts_.cancelled;
      return absl::CancelledError("cancelled");
    }
    uint64_t& seen = tokens_[shard];
    if (a->token < seen) {
      ++counts_.stale;
      return StaleOwnerError("old token");
    }
    seen = a->token;
    if (value.has_value()) {
      world_[key] = *value;
      if (mirror_ != nullptr) mirror_->Set(key, *value);
    } else {
      world_.erase(key);
      if (mirror_ != nullptr) mirror_->Delete(key);
    }
    ++counts_.writes;
    return absl::OkStatus();
  }

  // Calls of `node` running now for keys outside `range`.
  int RunningOutside(const std::string& node, ShardRange range) const {
    MutexLock l(&mu_);
    int n = 0;
    for (const auto& [who, key] : running_) {
      if (who == node && !range.Contains(ShardOf(key, kRing))) ++n;
    }
    return n;
  }
  int64_t entered() const {
    MutexLock l(&mu_);
    return entered_;
  }
  // Calls that saw their context cancelled while holding.
  int CancelsSeen() const {
    MutexLock l(&mu_);
    return static_cast<int>(saw_cancel_.size());
  }
  Counts counts() const {
    MutexLock l(&mu_);
    return counts_;
  }
  Map world() const {
    MutexLock l(&mu_);
    return world_;
  }
  void Seed(Map world) {
    MutexLock l(&mu_);
    world_ = std::move(world);
  }

 private:
  mutable Mutex mu_;
  CondVar cv_;
  Map world_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ShardRange> truth_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint32_t, uint64_t> tokens_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<std::string, std::string>> running_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> per_key_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> saw_cancel_ ABSL_GUARDED_BY(mu_);
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool ignore_cancel_ ABSL_GUARDED_BY(mu_) = false;
  int64_t entered_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t lists_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status list_error_ ABSL_GUARDED_BY(mu_);
  testing::FakeWatchWorld<std::string, int>* mirror_ ABSL_GUARDED_BY(mu_) =
      nullptr;
  Counts counts_ ABSL_GUARDED_BY(mu_);
};

class ApiClient : public SyncerClient<std::string, int, int> {
 public:
  explicit ApiClient(RecordingApi* api) : api_(api) {}
  absl::Status Create(const Context& ctx, const std::string& k,
                      const int& d) override {
    return api_->Write(ctx, k, d);
  }
  absl::Status Update(const Context& ctx, const std::string& k, const int& d,
                      const int&) override {
    return api_->Write(ctx, k, d);
  }
  absl::Status Delete(const Context& ctx, const std::string& k,
                      const int&) override {
    return api_->Write(ctx, k, std::nullopt);
  }

 private:
  RecordingApi* api_;
};

// The desired state, owned by the test (thread-safe).
class Catalog {
 public:
  Map Get() const {
    MutexLock l(&mu_);
    return want_;
  }
  void Set(const std::string& k, int v) {
    MutexLock l(&mu_);
    want_[k] = v;
  }
  void Erase(const std::string& k) {
    MutexLock l(&mu_);
    want_.erase(k);
  }

 private:
  mutable Mutex mu_;
  Map want_ ABSL_GUARDED_BY(mu_);
};

inline Map Keys(int n, int value) {
  Map m;
  for (int i = 0; i < n; ++i) m[absl::StrCat("key-", i)] = value;
  return m;
}

inline NodeInfo Node(const std::string& id, uint32_t ring = kRing) {
  return NodeInfo{.id = id, .kind = "k", .index = 0, .ring_size = ring};
}

}  // namespace setpoint::controller_test

#endif  // SETPOINT_TESTS_CONTROLLER_RECORDING_API_H_
