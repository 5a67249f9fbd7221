// The Syncer's hand-off, alone: order, fences, batches, awaits and Stop.
#include "setpoint/processor/internal/call_dispatcher.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/base/mutex.h"
#include "setpoint/processor/updater_pool.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint::internal {
namespace {

using ::setpoint::testing::AwaitCondition;
using ::setpoint::testing::IsOk;
using ::setpoint::testing::NullLogger;
using ::setpoint::testing::StatusIs;

struct Call : DispatchedCall {
  std::string key;
};

// Runs calls, optionally holding them at a gate that watches their context.
class Host final : public CallDispatcher::Host {
 public:
  void Execute(const Context& ctx,
               std::span<DispatchedCall* const> calls) override {
    std::vector<std::string> keys;
    for (DispatchedCall* c : calls) keys.push_back(static_cast<Call*>(c)->key);
    MutexLock l(&mu_);
    runs_.push_back(keys);
    ++running_;
    max_running_ = std::max(max_running_, running_);
    cv_.SignalAll();
    cv_.Wait(&mu_, ctx.stop_token(),
             [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !held_; });
    --running_;
    for (DispatchedCall* c : calls) {
      c->status = ctx.Cancelled() ? absl::CancelledError("cancelled")
                                  : absl::OkStatus();
    }
  }
  void ResultsReady() override { ready_.fetch_add(1); }

  void Hold() {
    MutexLock l(&mu_);
    held_ = true;
  }
  void Release() {
    MutexLock l(&mu_);
    held_ = false;
    cv_.SignalAll();
  }
  int running() const {
    MutexLock l(&mu_);
    return running_;
  }
  int max_running() const {
    MutexLock l(&mu_);
    return max_running_;
  }
  std::vector<std::vector<std::string>> runs() const {
    MutexLock l(&mu_);
    return runs_;
  }
  int ready() const { return ready_.load(); }

 private:
  mutable Mutex mu_;
  CondVar cv_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int max_running_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::vector<std::string>> runs_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> ready_{0};
};

CallDispatcherOptions Options(int max_batch = 0, int max_batches = 1) {
  return {.name = "t",
          .max_batch = max_batch,
          .max_batches = max_batches,
          .clock = Clock::Real(),
          .logger = NullLogger()};
}

std::vector<std::unique_ptr<Call>> Calls(std::vector<std::string> keys) {
  std::vector<std::unique_ptr<Call>> out;
  for (auto& k : keys) {
    auto c = std::make_unique<Call>();
    c->key = std::move(k);
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<DispatchedCall*> Ptrs(std::vector<std::unique_ptr<Call>>& calls) {
  std::vector<DispatchedCall*> out;
  for (auto& c : calls) out.push_back(c.get());
  return out;
}

CallDispatcher::Filter Only(char prefix) {
  return [prefix](const DispatchedCall& c) {
    return static_cast<const Call&>(c).key[0] == prefix;
  };
}

TEST(CallDispatcherTest, ManualModeRunsInOrderAndHandsResultsBack) {
  Host host;
  CallDispatcher d(&host, Options());
  ASSERT_THAT(d.Start(nullptr), IsOk());
  auto calls = Calls({"a1", "a2", "a3"});
  auto ptrs = Ptrs(calls);
  ASSERT_TRUE(d.Submit(ptrs));
  EXPECT_EQ(d.queued(), 3);
  EXPECT_EQ(d.RunUntilIdle(), 3);
  EXPECT_EQ(host.runs(),
            (std::vector<std::vector<std::string>>{{"a1"}, {"a2"}, {"a3"}}));
  EXPECT_EQ(host.ready(), 1);
  std::vector<DispatchedCall*> done;
  d.TakeResults(&done);
  EXPECT_EQ(done.size(), 3u);
  for (DispatchedCall* c : done) {
    EXPECT_TRUE(c->started);
    EXPECT_TRUE(c->status.ok());
  }
  EXPECT_TRUE(d.Stop().empty());
}

TEST(CallDispatcherTest, BatchModeTakesUpToMaxBatchPerCall) {
  Host host;
  CallDispatcher d(&host, Options(/*max_batch=*/2));
  ASSERT_THAT(d.Start(nullptr), IsOk());
  auto calls = Calls({"a1", "a2", "a3", "a4", "a5"});
  auto ptrs = Ptrs(calls);
  ASSERT_TRUE(d.Submit(ptrs));
  EXPECT_EQ(d.RunUntilIdle(), 5);
  EXPECT_EQ(host.runs(), (std::vector<std::vector<std::string>>{
                             {"a1", "a2"}, {"a3", "a4"}, {"a5"}}));
  d.Stop();
}

TEST(CallDispatcherTest, AFenceRefusesQueuedCallsAtOnce) {
  Host host;
  CallDispatcher d(&host, Options());
  ASSERT_THAT(d.Start(nullptr), IsOk());
  auto calls = Calls({"a1", "b1", "a2", "b2"});
  auto ptrs = Ptrs(calls);
  ASSERT_TRUE(d.Submit(ptrs));
  EXPECT_EQ(d.Fence(Only('a')), 2);
  EXPECT_EQ(d.queued(), 2);
  std::vector<DispatchedCall*> refused;
  d.TakeResults(&refused);
  ASSERT_EQ(refused.size(), 2u);
  for (DispatchedCall* c : refused) {
    EXPECT_FALSE(c->started);
    EXPECT_TRUE(c->fenced);
    EXPECT_EQ(static_cast<Call*>(c)->key[0], 'b');
  }
  EXPECT_EQ(d.RunUntilIdle(), 2);
  EXPECT_EQ(host.runs(),
            (std::vector<std::vector<std::string>>{{"a1"}, {"a2"}}));
  d.Stop();
}

TEST(CallDispatcherTest, AFenceCancelsARunningBatchAndRequeuesTheOthers) {
  Host host;
  UpdaterPool pool({.threads = 2, .logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  CallDispatcher d(&host, Options(/*max_batch=*/4));
  ASSERT_THAT(d.Start(&pool), IsOk());
  host.Hold();
  auto calls = Calls({"a1", "b1", "a2"});
  auto ptrs = Ptrs(calls);
  ASSERT_TRUE(d.Submit(ptrs));
  ASSERT_TRUE(AwaitCondition([&] { return host.running() == 1; }));
  EXPECT_EQ(d.Fence(Only('a')), 1);
  // It was cancelled: the gate watches the context.
  ASSERT_THAT(
      d.AwaitNoneOutside(Only('a'), Context().WithTimeout(absl::Seconds(10))),
      IsOk());
  std::vector<DispatchedCall*> done;
  ASSERT_TRUE(AwaitCondition([&] {
    d.TakeResults(&done);
    return done.size() == 3;
  }));
  for (DispatchedCall* c : done) {
    const bool left = static_cast<Call*>(c)->key[0] == 'b';
    EXPECT_TRUE(c->started);
    EXPECT_EQ(c->fenced, left);
    EXPECT_EQ(c->requeue, !left) << "the staying keys' failure is not theirs";
  }
  host.Release();
  d.Stop();
  pool.Stop();
}

TEST(CallDispatcherTest, AwaitNoneOutsideTimesOutNamingTheCount) {
  Host host;
  UpdaterPool pool({.threads = 1, .logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  CallDispatcher d(&host, Options());
  ASSERT_THAT(d.Start(&pool), IsOk());
  host.Hold();
  auto calls = Calls({"b1"});
  auto ptrs = Ptrs(calls);
  ASSERT_TRUE(d.Submit(ptrs));
  ASSERT_TRUE(AwaitCondition([&] { return host.running() == 1; }));
  // Not fenced: nothing cancels it, so the wait times out.
  EXPECT_THAT(d.AwaitNoneOutside(Only('a'),
                                 Context().WithTimeout(absl::Milliseconds(20))),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       ::testing::HasSubstr("1 call(s)")));
  EXPECT_THAT(d.AwaitNoneOutside(nullptr, Context()), IsOk());
  host.Release();
  d.Stop();
  pool.Stop();
}

TEST(CallDispatcherTest, AtMostMaxBatchesRunAtOnce) {
  Host host;
  UpdaterPool pool({.threads = 4, .logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  CallDispatcher d(&host, Options(/*max_batch=*/1, /*max_batches=*/2));
  ASSERT_THAT(d.Start(&pool), IsOk());
  host.Hold();
  auto calls = Calls({"a1", "a2", "a3", "a4", "a5"});
  auto ptrs = Ptrs(calls);
  ASSERT_TRUE(d.Submit(ptrs));
  ASSERT_TRUE(AwaitCondition([&] { return host.running() == 2; }));
  host.Release();
  std::vector<DispatchedCall*> done;
  ASSERT_TRUE(AwaitCondition([&] {
    d.TakeResults(&done);
    return done.size() == 5;
  }));
  EXPECT_EQ(host.max_running(), 2);
  d.Stop();
  pool.Stop();
}

// Start (on the owner's thread) and the runner's first Submit race: calls
// handed over while Start attaches the dispatcher to its pool must still
// run (the pool ignores a notification for a queue not attached yet).
TEST(CallDispatcherTest, CallsSubmittedWhileStartRunsAreServed) {
  UpdaterPool pool({.threads = 2, .logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  for (int round = 0; round < 2000; ++round) {
    Host host;
    CallDispatcher d(&host, Options());
    auto calls = Calls({"a1"});
    auto ptrs = Ptrs(calls);
    std::atomic<bool> ready{false};
    std::atomic<bool> go{false};
    std::thread runner([&] {
      ready.store(true, std::memory_order_release);
      while (!go.load(std::memory_order_acquire)) {
      }
      // Later each round: some rounds' submits land inside Start.
      for (int i = 0; i < round % 400; ++i) {
        go.load(std::memory_order_relaxed);
      }
      ASSERT_TRUE(d.Submit(ptrs));
    });
    while (!ready.load(std::memory_order_acquire)) {
    }
    go.store(true, std::memory_order_release);
    ASSERT_THAT(d.Start(&pool), IsOk());
    runner.join();
    ASSERT_TRUE(
        AwaitCondition([&] { return host.ready() >= 1; }, absl::Seconds(10)))
        << "round " << round << ": the call was never served";
    std::vector<DispatchedCall*> done;
    d.TakeResults(&done);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_TRUE(done[0]->started);
    d.Stop();
  }
  pool.Stop();
}

TEST(CallDispatcherTest, StopReturnsTheCallsThatNeverStarted) {
  Host host;
  CallDispatcher d(&host, Options());
  ASSERT_THAT(d.Start(nullptr), IsOk());
  auto calls = Calls({"a1", "a2"});
  auto ptrs = Ptrs(calls);
  ASSERT_TRUE(d.Submit(ptrs));
  std::vector<DispatchedCall*> never = d.Stop();
  ASSERT_EQ(never.size(), 2u);
  EXPECT_FALSE(never[0]->started);
  EXPECT_EQ(never[0]->status.code(), absl::StatusCode::kCancelled);
  EXPECT_FALSE(d.Submit(ptrs)) << "stopped";
  EXPECT_THAT(d.Start(nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(CallDispatcherTest, CallsStartUnderTheValuesSetLast) {
  struct Tag {
    int v;
  };
  class Values final : public CallDispatcher::Host {
   public:
    void Execute(const Context& ctx,
                 std::span<DispatchedCall* const> calls) override {
      for (DispatchedCall* c : calls) {
        const Tag* t = ctx.Value<Tag>();
        seen.push_back(t == nullptr ? -1 : t->v);
        c->status = absl::OkStatus();
      }
    }
    void ResultsReady() override {}
    std::vector<int> seen;
  } host;
  CallDispatcher d(&host, Options());
  ASSERT_THAT(d.Start(nullptr), IsOk());
  auto calls = Calls({"a1", "a2"});
  auto ptrs = Ptrs(calls);
  d.SetValues(Context().WithValue(std::make_shared<const Tag>(Tag{1})), 1);
  ASSERT_TRUE(d.Submit(ptrs));
  d.SetValues(Context().WithValue(std::make_shared<const Tag>(Tag{2})), 2);
  d.RunUntilIdle();
  EXPECT_EQ(host.seen, (std::vector<int>{2, 2}));
  EXPECT_EQ(calls[0]->values_version, 2u);
  d.Stop();
}

}  // namespace
}  // namespace setpoint::internal
