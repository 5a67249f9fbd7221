// FaultyNodeRegistry: wraps a NodeRegistry and injects faults, for tests of
// code that must survive a registry that is down or flaky (self-fencing,
// recovery). Everything not failed is passed through.
//
//   InMemoryNodeRegistry real({.clock = &clock});
//   testing::FaultyNodeRegistry faulty(&real);
//   faulty.SetDown(true);   // every call fails with kUnavailable
//   ...                     // the pod using `faulty` must self-fence
//   faulty.SetDown(false);
//
// Thread safety: thread-safe.
#ifndef SETPOINT_TESTING_FAULTY_NODE_REGISTRY_H_
#define SETPOINT_TESTING_FAULTY_NODE_REGISTRY_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "setpoint/node/node_registry.h"

namespace setpoint::testing {

class FaultyNodeRegistry : public NodeRegistry {
 public:
  explicit FaultyNodeRegistry(NodeRegistry* base) : base_(base) {}

  // While down, every call fails with kUnavailable and nothing reaches the
  // wrapped registry (as if the network were cut).
  void SetDown(bool down) { down_.store(down); }
  // The next `n` calls fail with kUnavailable.
  void FailNext(int n) { fail_next_.store(n); }
  // While set, every call blocks (ignoring its context, as a socket read
  // on a Redis that hangs does) until SetHang(false); then it fails with
  // kDeadlineExceeded. Clear it before the registry's users stop.
  void SetHang(bool hang) {
    std::lock_guard<std::mutex> l(hang_mu_);
    hang_ = hang;
    hang_cv_.notify_all();
  }
  // Calls blocked by SetHang right now.
  int hanging() const { return hanging_.load(); }
  // Runs every listener added through this wrapper `n` times, from the
  // calling thread, as a flood of change announcements would.
  void Announce(int n) { AnnounceNotice(ChangeNotice{}, n); }
  // The same with announcements that releases freed `freed` of `kind`, as
  // a flood of such messages would.
  void AnnounceFreed(const std::string& kind, std::vector<ShardRange> freed,
                     int n) {
    ChangeNotice notice;
    notice.membership = false;
    notice.freed[kind] = ShardSet::Of(std::move(freed));
    AnnounceNotice(notice, n);
  }
  // The next `n` grants that succeed take effect in the wrapped registry
  // but report kDeadlineExceeded, as when a reply is lost after Redis ran
  // the script.
  void LoseNextGrantReplies(int n) { lose_grant_replies_.store(n); }
  // Calls refused so far.
  int64_t refused() const { return refused_.load(); }

  absl::StatusOr<PollResult> Poll(const Context& ctx,
                                  const PollRequest& request) override {
    if (absl::Status s = Fault("poll"); !s.ok()) return s;
    return base_->Poll(ctx, request);
  }
  absl::Status Release(const Context& ctx, const std::string& kind,
                       const std::string& node_id, Assignment keep) override {
    if (absl::Status s = Fault("release"); !s.ok()) return s;
    return base_->Release(ctx, kind, node_id, keep);
  }
  absl::StatusOr<uint64_t> Grant(const Context& ctx, const std::string& kind,
                                 const std::string& node_id, ShardSet target,
                                 const std::string& epoch) override {
    if (absl::Status s = Fault("grant"); !s.ok()) return s;
    absl::StatusOr<uint64_t> token =
        base_->Grant(ctx, kind, node_id, target, epoch);
    if (token.ok() && ExecuteButFail()) {
      // The grant happened, but the caller hears a timeout (a reply lost
      // on the way back).
      return absl::DeadlineExceededError("grant: injected lost reply");
    }
    return token;
  }
  // One fault check for the whole handoff, as for one round trip; a lost
  // grant reply (LoseNextGrantReplies) loses the whole reply.
  absl::StatusOr<HandoffResult> Handoff(
      const Context& ctx, const HandoffRequest& request) override {
    if (absl::Status s = Fault("handoff"); !s.ok()) return s;
    absl::StatusOr<HandoffResult> result = base_->Handoff(ctx, request);
    if (!result.ok()) return result;
    for (const auto& g : result->grants) {
      if (g.ok() && ExecuteButFail()) {
        return absl::DeadlineExceededError("handoff: injected lost reply");
      }
    }
    return result;
  }
  absl::Status Deregister(const Context& ctx, const std::string& kind,
                          const std::vector<std::string>& node_ids) override {
    if (absl::Status s = Fault("deregister"); !s.ok()) return s;
    return base_->Deregister(ctx, kind, node_ids);
  }
  absl::Status SetDrained(const Context& ctx, const std::string& pod_id,
                          bool drained) override {
    if (absl::Status s = Fault("set drained"); !s.ok()) return s;
    return base_->SetDrained(ctx, pod_id, drained);
  }
  absl::StatusOr<RegistryDescription> Describe(const Context& ctx) override {
    if (absl::Status s = Fault("describe"); !s.ok()) return s;
    return base_->Describe(ctx);
  }
  // The wrapped registry's cache, except while down or hung: a pod cut off
  // from its registry hears nothing it could act on.
  std::optional<KindView> CachedView(const std::string& kind) override {
    {
      std::lock_guard<std::mutex> l(hang_mu_);
      if (hang_) return std::nullopt;
    }
    if (down_.load()) return std::nullopt;
    return base_->CachedView(kind);
  }
  bool ReadCachedView(
      const std::string& kind, const CachedViewMark& since,
      absl::FunctionRef<void(const CachedViewRead&)> read) override {
    {
      std::lock_guard<std::mutex> l(hang_mu_);
      if (hang_) return false;
    }
    if (down_.load()) return false;
    return base_->ReadCachedView(kind, since, read);
  }
  // Notifications still arrive while down: they only make pollers look.
  int64_t AddChangeListener(std::function<void()> listener) override {
    int64_t id = base_->AddChangeListener(listener);
    std::lock_guard<std::mutex> l(hang_mu_);
    listeners_[id] = [listener](const ChangeNotice&) { listener(); };
    return id;
  }
  int64_t AddNoticeListener(
      std::function<void(const ChangeNotice&)> listener) override {
    int64_t id = base_->AddNoticeListener(listener);
    std::lock_guard<std::mutex> l(hang_mu_);
    listeners_[id] = std::move(listener);
    return id;
  }
  void RemoveChangeListener(int64_t id) override {
    base_->RemoveChangeListener(id);
    std::lock_guard<std::mutex> l(hang_mu_);
    listeners_.erase(id);
  }

 private:
  absl::Status Fault(const char* op) {
    {
      std::unique_lock<std::mutex> l(hang_mu_);
      if (hang_) {
        ++hanging_;
        hang_cv_.wait(l, [this] { return !hang_; });
        --hanging_;
        ++refused_;
        return absl::DeadlineExceededError(std::string(op) +
                                           ": injected fault (registry hung)");
      }
    }
    bool fail = down_.load();
    if (!fail) {
      int n = fail_next_.load();
      while (n > 0 && !fail_next_.compare_exchange_weak(n, n - 1)) {
      }
      fail = n > 0;
    }
    if (!fail) return absl::OkStatus();
    ++refused_;
    return absl::UnavailableError(std::string(op) +
                                  ": injected fault (registry unreachable)");
  }

  void AnnounceNotice(const ChangeNotice& notice, int n) {
    std::vector<std::function<void(const ChangeNotice&)>> copy;
    {
      std::lock_guard<std::mutex> l(hang_mu_);
      for (auto& [id, f] : listeners_) copy.push_back(f);
    }
    for (int i = 0; i < n; ++i) {
      for (auto& f : copy) f(notice);
    }
  }

  bool ExecuteButFail() {
    int n = lose_grant_replies_.load();
    while (n > 0 && !lose_grant_replies_.compare_exchange_weak(n, n - 1)) {
    }
    return n > 0;
  }

  NodeRegistry* const base_;
  std::atomic<int> lose_grant_replies_{0};
  std::atomic<bool> down_{false};
  std::atomic<int> fail_next_{0};
  std::atomic<int64_t> refused_{0};
  std::mutex hang_mu_;
  std::condition_variable hang_cv_;
  bool hang_ = false;  // Guarded by hang_mu_.
  std::atomic<int> hanging_{0};
  std::map<int64_t, std::function<void(const ChangeNotice&)>>
      listeners_;  // By hang_mu_.
};

}  // namespace setpoint::testing

#endif  // SETPOINT_TESTING_FAULTY_NODE_REGISTRY_H_
