// The NodeManager tests' fixture: pods on an in-memory registry and a
// simulated clock, test nodes that report what they work on to an
// OwnershipTracker (which flags two owners of a shard, or a token that did
// not grow), and helpers to move time until a condition holds. Shared by
// node_manager_test.cc and static_membership_test.cc.
#ifndef SETPOINT_TESTS_NODE_NODE_MANAGER_FIXTURE_H_
#define SETPOINT_TESTS_NODE_NODE_MANAGER_FIXTURE_H_

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/base/mutex.h"
#include "setpoint/node/node_manager.h"
#include "setpoint/processor/updater_pool.h"
#include "setpoint/registry/in_memory_node_registry.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/faulty_node_registry.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/simulated_clock.h"
#include "setpoint/testing/status_matchers.h"
#include "setpoint/testing/threads.h"

namespace setpoint::node_manager_testing {

using ::setpoint::testing::ThreadsNamed;

using ::setpoint::testing::AwaitCondition;
using ::setpoint::testing::FaultyNodeRegistry;
using ::setpoint::testing::IsOk;
using ::setpoint::testing::NullLogger;
using ::setpoint::testing::SimulatedClock;
using ::setpoint::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr uint32_t kRing = 64;

// Records who works on which shard, and flags any moment at which two nodes
// would. A node owns a shard from the moment UpdateShardRange is called with
// it until an UpdateShardRange without it has returned: the most a node can
// be working on, so a violation here is a real double owner.
class OwnershipTracker {
 public:
  void Begin(const std::string& node, const Assignment& from,
             const Assignment& to) {
    MutexLock l(&mu_);
    ++in_progress_;
    calls_.push_back(node);
    for (uint32_t s = 0; s < kRing; ++s) {
      if (!to.range.Contains(s) || from.range.Contains(s)) continue;
      if (!owner_[s].empty() && owner_[s] != node) {
        violations_.push_back(node + " took shard " + std::to_string(s) +
                              " still owned by " + owner_[s]);
      }
      owner_[s] = node;
      if (to.token <= token_[s]) {
        violations_.push_back("token did not grow for shard " +
                              std::to_string(s));
      }
      token_[s] = to.token;
    }
  }
  void End(const std::string& node, const Assignment& from,
           const Assignment& to) {
    MutexLock l(&mu_);
    --in_progress_;
    for (uint32_t s = 0; s < kRing; ++s) {
      if (!from.range.Contains(s)) continue;
      if (!to.range.Contains(s) && owner_[s] == node) owner_[s].clear();
    }
  }
  std::vector<std::string> violations() {
    MutexLock l(&mu_);
    return violations_;
  }
  int in_progress() {
    MutexLock l(&mu_);
    return in_progress_;
  }
  // UpdateShardRange calls begun by nodes whose id starts with `prefix`.
  int CallsBy(const std::string& prefix) {
    MutexLock l(&mu_);
    int n = 0;
    for (const auto& c : calls_) n += c.rfind(prefix, 0) == 0;
    return n;
  }
  // Shards owned by nodes whose id starts with `prefix`.
  int OwnedBy(const std::string& prefix) {
    MutexLock l(&mu_);
    int n = 0;
    for (const auto& o : owner_) n += !o.empty() && o.rfind(prefix, 0) == 0;
    return n;
  }

 private:
  Mutex mu_;
  std::string owner_[kRing] ABSL_GUARDED_BY(mu_);
  uint64_t token_[kRing] ABSL_GUARDED_BY(mu_) = {};
  std::vector<std::string> violations_ ABSL_GUARDED_BY(mu_);
  int in_progress_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
};

class TestNode : public Node {
 public:
  TestNode(std::string id, OwnershipTracker* tracker, int fail_runs)
      : id_(std::move(id)), tracker_(tracker), fail_runs_(fail_runs) {}

  absl::Status Run(const Context& ctx) override {
    if (fail_runs_ > 0) {
      --fail_runs_;
      return absl::InternalError("injected run failure");
    }
    // Blocks on the stop token only (not on the clock), so the simulated
    // clock's waiters are the managers' loops.
    std::mutex m;
    std::condition_variable_any cv;
    std::unique_lock l(m);
    cv.wait(l, ctx.stop_token(), [] { return false; });
    return absl::OkStatus();
  }
  absl::Status UpdateShardRange(const Context&, const Assignment& a) override {
    tracker_->Begin(id_, current_, a);
    Assignment from = current_;
    current_ = a;
    tracker_->End(id_, from, a);
    return absl::OkStatus();
  }

 private:
  const std::string id_;
  OwnershipTracker* tracker_;
  Assignment current_;  // Relay thread only.
  int fail_runs_;       // Run thread only.
};

// A TestNode whose UpdateShardRange to the empty range can be held at a
// gate, to look at the manager while a fence is being delivered.
class Gate {
 public:
  void Close() {
    MutexLock l(&mu_);
    closed_ = true;
  }
  void Open() {
    MutexLock l(&mu_);
    closed_ = false;
    cv_.SignalAll();
  }
  void Pass() {
    MutexLock l(&mu_);
    ++waiting_;
    cv_.Wait(&mu_, {},
             [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !closed_; });
    --waiting_;
  }
  int waiting() {
    MutexLock l(&mu_);
    return waiting_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

class GatedNode : public TestNode {
 public:
  GatedNode(std::string id, OwnershipTracker* tracker, Gate* gate)
      : TestNode(std::move(id), tracker, 0), gate_(gate) {}
  absl::Status UpdateShardRange(const Context& ctx,
                                const Assignment& a) override {
    if (a.range.Empty()) gate_->Pass();
    return TestNode::UpdateShardRange(ctx, a);
  }

 private:
  Gate* gate_;
};

// A TestNode that refuses its first `refusals` shrinks (as a controller
// does while a call outside the new range ignores its cancellation).
class RefusingNode : public TestNode {
 public:
  RefusingNode(std::string id, OwnershipTracker* tracker,
               std::atomic<int>* refusals)
      : TestNode(std::move(id), tracker, 0), refusals_(refusals) {}
  absl::Status UpdateShardRange(const Context& ctx,
                                const Assignment& a) override {
    if (!a.range.Covers(held_.range) && refusals_->fetch_sub(1) > 0) {
      return absl::DeadlineExceededError("a call ignored its cancellation");
    }
    held_ = a;
    return TestNode::UpdateShardRange(ctx, a);
  }

 private:
  std::atomic<int>* refusals_;
  Assignment held_;  // Relay thread only.
};

// A node that needs no thread while it works: launched, then halted.
// Launch fails the first `fail_launches` times. Counts what it was asked,
// and whether it still held shards when it was halted.
class ThreadlessNode : public TestNode {
 public:
  struct Log {
    std::atomic<int> launches{0};
    std::atomic<int> halts{0};
    std::atomic<int> runs{0};
    std::atomic<int> halted_holding{0};
  };
  ThreadlessNode(std::string id, OwnershipTracker* tracker, int fail_launches,
                 Log* log)
      : TestNode(std::move(id), tracker, 0),
        fail_launches_(fail_launches),
        log_(log) {}

  bool Threadless() const override { return true; }
  absl::Status Launch(const Context&) override {
    ++log_->launches;
    if (fail_launches_ > 0) {
      --fail_launches_;
      return absl::InternalError("injected launch failure");
    }
    return absl::OkStatus();
  }
  void Halt() override {
    ++log_->halts;
    if (!held_.load()) return;
    ++log_->halted_holding;
  }
  absl::Status Run(const Context&) override {
    ++log_->runs;
    return absl::InternalError("a threadless node is never run");
  }
  absl::Status UpdateShardRange(const Context& ctx,
                                const Assignment& a) override {
    held_.store(!a.range.Empty());
    return TestNode::UpdateShardRange(ctx, a);
  }

 private:
  int fail_launches_;  // Manager's threads, one at a time.
  Log* log_;
  std::atomic<bool> held_{false};
};

class NodeManagerTest : public ::testing::Test {
 protected:
  NodeManagerOptions Options(const std::string& pod, NodeRegistry* registry,
                             int count = 2, int fail_runs = 0) {
    return NodeManagerOptions{
        .pod_id = pod,
        .kinds = {{.kind = "vm",
                   .count = count,
                   .ring_size = kRing,
                   .factory =
                       [this, fail_runs](const NodeInfo& info) {
                         return std::make_unique<TestNode>(info.id, &tracker_,
                                                           fail_runs);
                       }}},
        .registry = registry,
        .restart_backoff = {.initial = absl::Seconds(1), .jitter = 0},
        .clock = &clock_,
        .logger = NullLogger(),
    };
  }
  NodeManager& StartPodWith(NodeManagerOptions options) {
    pods_.push_back(std::make_unique<NodeManager>(std::move(options)));
    EXPECT_THAT(pods_.back()->Start(), IsOk());
    return *pods_.back();
  }
  // Moves simulated time by `d` in 50 ms steps, waiting after each step
  // only for `pods` to be idle (others may be blocked on purpose).
  void AdvanceWith(const std::vector<NodeManager*>& pods, absl::Duration d) {
    for (absl::Duration t; t < d; t += absl::Milliseconds(50)) {
      clock_.AdvanceTime(absl::Milliseconds(50));
      ASSERT_TRUE(AwaitCondition([&] {
        for (NodeManager* pod : pods) {
          if (!pod->Idle()) return false;
        }
        return true;
      }));
    }
  }
  static bool AllEmpty(NodeManager& pod) {
    for (const NodeState& n : pod.Nodes()) {
      if (!n.active.range.Empty()) return false;
    }
    return true;
  }
  NodeManager& StartPod(const std::string& pod,
                        NodeRegistry* registry = nullptr, int count = 2,
                        int fail_runs = 0) {
    pods_.push_back(std::make_unique<NodeManager>(Options(
        pod, registry != nullptr ? registry : &registry_, count, fail_runs)));
    EXPECT_THAT(pods_.back()->Start(), IsOk());
    return *pods_.back();
  }
  // Waits until every running manager is idle: only the clock can move
  // things on.
  void Settle() {
    ASSERT_TRUE(AwaitCondition([&] {
      for (auto& pod : pods_) {
        if (!stopped_.contains(pod.get()) && !pod->Idle()) return false;
      }
      return true;
    }));
  }
  void StopPod(NodeManager& pod) {
    pod.Stop();
    stopped_.insert(&pod);
  }
  // Moves simulated time in small steps until `pred` holds.
  template <typename Pred>
  bool AdvanceUntil(Pred pred, absl::Duration limit = absl::Seconds(30)) {
    for (absl::Duration t; t <= limit; t += absl::Milliseconds(50)) {
      Settle();
      if (pred()) return true;
      clock_.AdvanceTime(absl::Milliseconds(50));
    }
    return pred();
  }
  // Every node of `pods` active, the ring split evenly between them.
  static bool Balanced(const std::vector<NodeManager*>& pods, int nodes) {
    uint32_t total = 0;
    int active = 0;
    for (NodeManager* pod : pods) {
      for (const NodeState& n : pod->Nodes()) {
        if (n.active.range.Empty()) continue;
        ++active;
        total += n.active.range.size();
        if (n.active.range.size() + 1 < kRing / nodes ||
            n.active.range.size() > kRing / nodes + 1) {
          return false;
        }
      }
    }
    return active == nodes && total == kRing;
  }
  void TearDown() override {
    gate_.Open();            // A failed test may leave a relay at the gate.
    faulty_.SetHang(false);  // ...or a protocol thread in a hung call.
    for (auto& pod : pods_) pod->Stop();
    EXPECT_THAT(tracker_.violations(), IsEmpty());
  }

  SimulatedClock clock_;
  Gate gate_;
  std::atomic<int> reports_{0};  // on_lease_renewed calls.
  // Shrinks a RefusingNode still refuses; outlives the pods (TearDown
  // stops them, and their graceful stop is a shrink too).
  std::atomic<int> refusals_{0};
  InMemoryNodeRegistry registry_{{.clock = &clock_}};
  FaultyNodeRegistry faulty_{&registry_};
  OwnershipTracker tracker_;
  std::vector<std::unique_ptr<NodeManager>> pods_;
  std::set<NodeManager*> stopped_;
};

}  // namespace setpoint::node_manager_testing

#endif  // SETPOINT_TESTS_NODE_NODE_MANAGER_FIXTURE_H_
