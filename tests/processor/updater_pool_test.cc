#include "setpoint/processor/updater_pool.h"

#include <dirent.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/syncer.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/fake_client.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint {
namespace {

using ::setpoint::testing::AwaitCondition;
using ::setpoint::testing::FakeClient;
using ::setpoint::testing::IsOk;
using ::setpoint::testing::StatusIs;
using ::testing::HasSubstr;

using IntSyncer = Syncer<std::string, int, int>;
using IntFake = FakeClient<std::string, int, int>;

// Threads of this process named "sp-updater" now.
int UpdaterThreads() {
  int n = 0;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream comm(absl::StrCat("/proc/self/task/", e->d_name, "/comm"));
      std::string name;
      if (std::getline(comm, name) && name == "sp-updater") ++n;
    }
    closedir(dir);
  }
  return n;
}

// A node's pieces: a started runner and a syncer on it with a fake client
// that reports each write back as observed state.
struct Node {
  Node(const std::string& name, SyncerOptions<int, int> options)
      : runner({.name = name, .logger = testing::NullLogger()}),
        fake({.watcher = [this](const std::string& key,
                                const std::optional<int>& value) {
          (void)runner.Post([this, key, value] {
            if (value.has_value()) {
              syncer->SetObserved(key, *value);
            } else {
              syncer->DeleteObserved(key);
            }
          });
        }}) {
    options.name = name;
    options.logger = testing::NullLogger();
    syncer = std::make_unique<IntSyncer>(&runner, &fake, std::move(options));
    syncer->MarkDesiredComplete();
  }
  ~Node() {
    fake.ReleaseCalls();
    syncer->Stop();
    runner.Stop();
  }
  absl::Status Start() {
    SETPOINT_RETURN_IF_ERROR(syncer->Start());
    return runner.Start();
  }
  void SetDesired(const std::string& key, int value) {
    ASSERT_THAT(
        runner.PostAndWait(Context(), [&] { syncer->SetDesired(key, value); }),
        IsOk());
  }
  bool Converged(int64_t keys) {
    auto s = runner.PostAndWait(Context(),
                                [&] { return syncer->StatusSnapshot(0); });
    return s.ok() && s->keys == keys && s->converged == keys;
  }

  Runner runner;
  IntFake fake;
  std::unique_ptr<IntSyncer> syncer;
};

TEST(UpdaterPoolTest, InvalidOptionsAreRefusedNamingTheField) {
  UpdaterPool bad({.name = "p", .threads = 0});
  EXPECT_THAT(bad.Start(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(bad.Start().message(),
              HasSubstr("start updater pool p: threads must be >= 1, got 0"));

  UpdaterPool pool({.name = "p", .threads = 1});
  ASSERT_THAT(pool.Start(), IsOk());
  EXPECT_THAT(pool.Start(), StatusIs(absl::StatusCode::kFailedPrecondition));
  pool.Stop();
  pool.Stop();  // Idempotent.
}

TEST(UpdaterPoolTest, APrivatePoolHasUpdaterThreadsOrOnePerSlotUpToEight) {
  const int base = UpdaterThreads();
  {
    Node node("default", {});
    ASSERT_THAT(node.syncer->Start(), IsOk());  // Runner not started.
    // Threads name themselves once running: poll. max_in_flight 64: 8.
    EXPECT_TRUE(AwaitCondition([&] { return UpdaterThreads() - base == 8; }))
        << UpdaterThreads() - base;
  }
  {
    Node node("three", {.max_in_flight = 16, .updater_threads = 3});
    ASSERT_THAT(node.syncer->Start(), IsOk());
    EXPECT_TRUE(AwaitCondition([&] { return UpdaterThreads() - base == 3; }))
        << UpdaterThreads() - base;
  }
  {
    Node node("two", {.max_in_flight = 2});
    ASSERT_THAT(node.syncer->Start(), IsOk());
    EXPECT_TRUE(AwaitCondition([&] { return UpdaterThreads() - base == 2; }))
        << UpdaterThreads() - base;
  }
  EXPECT_EQ(UpdaterThreads(), base);
}

TEST(UpdaterPoolTest, SyncersSharingAPoolStartNoThreadsOfTheirOwn) {
  UpdaterPool pool({.name = "pod", .threads = 2});
  ASSERT_THAT(pool.Start(), IsOk());
  std::vector<std::unique_ptr<Node>> nodes;
  for (int i = 0; i < 10; ++i) {
    nodes.push_back(
        std::make_unique<Node>(absl::StrCat("n", i), SyncerOptions<int, int>{
                                                         .pool = &pool,
                                                     }));
  }
  ASSERT_TRUE(AwaitCondition([&] { return UpdaterThreads() == 2; }));
  for (auto& node : nodes) ASSERT_THAT(node->Start(), IsOk());
  EXPECT_EQ(UpdaterThreads(), 2);  // The pool's, none per syncer.
  for (auto& node : nodes) {
    for (int k = 0; k < 50; ++k) node->SetDesired(absl::StrCat("k", k), k);
  }
  for (auto& node : nodes) {
    ASSERT_TRUE(AwaitCondition([&] { return node->Converged(50); }));
    EXPECT_EQ(node->fake.stats().creates, 50);
    EXPECT_EQ(node->fake.stats().max_concurrent_per_key, 1);
    EXPECT_EQ(node->syncer->stats().creates, 50);
  }
  nodes.clear();
  pool.Stop();
}

TEST(UpdaterPoolTest, EachSyncerKeepsItsOwnInFlightLimit) {
  UpdaterPool pool({.name = "pod", .threads = 8});
  ASSERT_THAT(pool.Start(), IsOk());
  Node a("a", {.max_in_flight = 2, .pool = &pool});
  Node b("b", {.max_in_flight = 3, .pool = &pool});
  ASSERT_THAT(a.Start(), IsOk());
  ASSERT_THAT(b.Start(), IsOk());
  a.fake.HoldCalls();
  b.fake.HoldCalls();
  for (int k = 0; k < 10; ++k) {
    a.SetDesired(absl::StrCat("k", k), 1);
    b.SetDesired(absl::StrCat("k", k), 1);
  }
  // Eight threads are free, but each syncer runs only its own limit.
  ASSERT_TRUE(a.fake.AwaitHeldCalls(2));
  ASSERT_TRUE(b.fake.AwaitHeldCalls(3));
  EXPECT_EQ(a.fake.held_calls(), 2);
  EXPECT_EQ(b.fake.held_calls(), 3);
  a.fake.ReleaseCalls();
  b.fake.ReleaseCalls();
  ASSERT_TRUE(AwaitCondition([&] { return a.Converged(10); }));
  ASSERT_TRUE(AwaitCondition([&] { return b.Converged(10); }));
  EXPECT_LE(a.fake.stats().max_concurrent, 2);
  EXPECT_LE(b.fake.stats().max_concurrent, 3);
  EXPECT_EQ(a.fake.stats().creates, 10);
  EXPECT_EQ(b.fake.stats().creates, 10);
}

// A client that records, in one log shared by several syncers, which
// syncer each call belonged to; calls of a held client wait for Release().
class LoggingClient final : public SyncerClient<std::string, int, int> {
 public:
  struct Log {
    Mutex mu;
    std::vector<std::string> calls ABSL_GUARDED_BY(mu);
  };
  LoggingClient(std::string name, Log* log) : name_(name), log_(log) {}
  void Hold() {
    MutexLock l(&mu_);
    held_ = true;
  }
  void Release() {
    MutexLock l(&mu_);
    held_ = false;
    cv_.SignalAll();
  }
  bool AwaitWaiting() {
    return AwaitCondition([&] {
      MutexLock l(&mu_);
      return waiting_ > 0;
    });
  }
  absl::Status Create(const Context&, const std::string&, const int&) override {
    {
      MutexLock l(&mu_);
      ++waiting_;
      while (held_) cv_.Wait(&mu_);
      --waiting_;
    }
    MutexLock l(&log_->mu);
    log_->calls.push_back(name_);
    return absl::OkStatus();
  }
  absl::Status Update(const Context&, const std::string&, const int&,
                      const int&) override {
    return absl::OkStatus();
  }
  absl::Status Delete(const Context&, const std::string&, const int&) override {
    return absl::OkStatus();
  }

 private:
  const std::string name_;
  Log* const log_;
  Mutex mu_;
  CondVar cv_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(UpdaterPoolTest, ABusySyncerDoesNotStarveTheOthers) {
  // One thread for two syncers: "busy" hands over 2,000 calls at once,
  // "quiet" one call while they are queued. Turns alternate, so the quiet
  // call runs after at most one turn (256 calls) of the busy syncer.
  UpdaterPool pool({.name = "pod", .threads = 1});
  ASSERT_THAT(pool.Start(), IsOk());
  LoggingClient::Log log;
  LoggingClient busy_client("busy", &log);
  LoggingClient quiet_client("quiet", &log);
  Runner runner({.name = "r", .logger = testing::NullLogger()});
  IntSyncer busy(&runner, &busy_client,
                 {.name = "busy",
                  .max_in_flight = 2000,
                  .pool = &pool,
                  .logger = testing::NullLogger()});
  IntSyncer quiet(
      &runner, &quiet_client,
      {.name = "quiet", .pool = &pool, .logger = testing::NullLogger()});
  busy.MarkDesiredComplete();
  quiet.MarkDesiredComplete();
  ASSERT_THAT(busy.Start(), IsOk());
  ASSERT_THAT(quiet.Start(), IsOk());
  ASSERT_THAT(runner.Start(), IsOk());
  busy_client.Hold();  // The pool's one thread waits in busy's first call.
  ASSERT_THAT(runner.PostAndWait(Context(),
                                 [&] {
                                   for (int k = 0; k < 2000; ++k) {
                                     busy.SetDesired(absl::StrCat("k", k), 1);
                                   }
                                 }),
              IsOk());
  ASSERT_TRUE(busy_client.AwaitWaiting());
  ASSERT_THAT(runner.PostAndWait(Context(), [&] { quiet.SetDesired("q", 1); }),
              IsOk());
  // Handed over (the pump ran), not started: the one thread is busy.
  ASSERT_TRUE(AwaitCondition([&] {
    auto s = runner.PostAndWait(
        Context(), [&] { return quiet.StatusSnapshot(0).in_flight; });
    return s.ok() && *s == 1;
  }));
  busy_client.Release();
  ASSERT_TRUE(AwaitCondition([&] {
    MutexLock l(&log.mu);
    return log.calls.size() == 2001;
  }));
  {
    MutexLock l(&log.mu);
    auto it = std::find(log.calls.begin(), log.calls.end(), "quiet");
    ASSERT_NE(it, log.calls.end());
    EXPECT_LE(it - log.calls.begin(), 257)
        << log.calls[0] << log.calls[1] << log.calls[2] << log.calls[256]
        << log.calls[257];
  }
  busy.Stop();
  quiet.Stop();
  runner.Stop();
  pool.Stop();
}

TEST(UpdaterPoolTest, StoppingOneSyncerWaitsForItsOwnCallsOnly) {
  // Two threads: one waits in a's call, the other in b's first; b's
  // second call is handed over and waits for a thread.
  UpdaterPool pool({.name = "pod", .threads = 2});
  ASSERT_THAT(pool.Start(), IsOk());
  Node a("a", {.max_in_flight = 1, .pool = &pool});
  auto b = std::make_unique<Node>(
      "b", SyncerOptions<int, int>{.max_in_flight = 2, .pool = &pool});
  ASSERT_THAT(a.Start(), IsOk());
  ASSERT_THAT(b->Start(), IsOk());
  a.fake.HoldCalls();
  b->fake.HoldCalls();  // Its held call ends when its context is cancelled.
  a.SetDesired("x", 1);
  ASSERT_TRUE(a.fake.AwaitHeldCalls(1));
  b->SetDesired("x", 1);
  ASSERT_TRUE(b->fake.AwaitHeldCalls(1));
  b->SetDesired("y", 1);
  ASSERT_TRUE(AwaitCondition([&] {
    auto s = b->runner.PostAndWait(
        Context(), [&] { return b->syncer->StatusSnapshot(0).in_flight; });
    return s.ok() && *s == 2;
  }));

  b->syncer->Stop();  // Returns while a's call is still held.
  EXPECT_EQ(b->fake.held_calls(), 0);
  EXPECT_EQ(a.fake.held_calls(), 1);
  EXPECT_EQ(b->syncer->stats().not_started_at_stop, 1);
  b.reset();

  // a goes on, on the same pool.
  a.fake.ReleaseCalls();
  a.SetDesired("z", 1);
  ASSERT_TRUE(AwaitCondition([&] { return a.Converged(2); }));
  EXPECT_EQ(a.fake.stats().creates, 2);
}

TEST(UpdaterPoolTest, AThrowingClientDoesNotTakeThePoolDown) {
  UpdaterPool pool({.name = "pod", .threads = 1});
  ASSERT_THAT(pool.Start(), IsOk());
  Node a("a", {.pool = &pool, .backoff = {.initial = absl::Milliseconds(1)}});
  Node b("b", {.pool = &pool});
  ASSERT_THAT(a.Start(), IsOk());
  ASSERT_THAT(b.Start(), IsOk());
  a.fake.ThrowNext(3);
  a.SetDesired("x", 1);
  b.SetDesired("y", 1);
  ASSERT_TRUE(AwaitCondition([&] { return a.Converged(1); }));
  ASSERT_TRUE(AwaitCondition([&] { return b.Converged(1); }));
  EXPECT_EQ(a.syncer->stats().client_threw, 3);
  EXPECT_EQ(a.syncer->stats().creates, 1);
  EXPECT_EQ(b.syncer->stats().creates, 1);
  EXPECT_EQ(b.syncer->stats().failures, 0);
}

TEST(UpdaterPoolTest, ManyCallsFromManySyncersOnFewThreadsAllArrive) {
  UpdaterPool pool({.name = "pod", .threads = 2});
  ASSERT_THAT(pool.Start(), IsOk());
  std::vector<std::unique_ptr<Node>> nodes;
  for (int i = 0; i < 4; ++i) {
    nodes.push_back(std::make_unique<Node>(
        absl::StrCat("n", i),
        SyncerOptions<int, int>{.max_in_flight = 1 + 7 * i, .pool = &pool}));
    ASSERT_THAT(nodes.back()->Start(), IsOk());
  }
  for (int round = 1; round <= 3; ++round) {
    for (auto& node : nodes) {
      ASSERT_THAT(node->runner.PostAndWait(Context(),
                                           [&] {
                                             for (int k = 0; k < 500; ++k) {
                                               node->syncer->SetDesired(
                                                   absl::StrCat("k", k), round);
                                             }
                                           }),
                  IsOk());
    }
  }
  for (auto& node : nodes) {
    // Generous: 6,000 calls on two threads, slow under sanitizers on a
    // loaded machine.
    ASSERT_TRUE(AwaitCondition([&] { return node->Converged(500); },
                               absl::Seconds(120)));
    EXPECT_EQ(node->fake.stats().max_concurrent_per_key, 1);
    for (int k = 0; k < 500; k += 97) {
      EXPECT_EQ(node->fake.Get(absl::StrCat("k", k)), 3);
    }
  }
}

}  // namespace
}  // namespace setpoint
