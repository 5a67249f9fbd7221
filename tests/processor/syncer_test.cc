#include "setpoint/processor/syncer.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
#include "setpoint/base/status.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/source.h"
#include "setpoint/processor/store.h"
#include "setpoint/processor/transformer.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/fake_client.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/simulated_clock.h"
#include "setpoint/testing/status_matchers.h"
#include "setpoint/testing/threads.h"
#include "spdlog/logger.h"
#include "spdlog/sinks/ringbuffer_sink.h"

namespace setpoint {
namespace {

using ::setpoint::testing::ThreadsNamed;

using ::setpoint::testing::AwaitCondition;
using ::setpoint::testing::FakeClient;
using ::setpoint::testing::FakeObservation;
using ::setpoint::testing::IsOk;
using ::setpoint::testing::NullLogger;
using ::setpoint::testing::SimulatedClock;
using ::setpoint::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

using IntSyncer = Syncer<std::string, int, int>;
using IntFake = FakeClient<std::string, int, int>;

// A backoff with no jitter, so a test can predict every retry time.
constexpr BackoffOptions kExactBackoff = {.initial = absl::Seconds(1),
                                          .max = absl::Minutes(1),
                                          .multiplier = 2,
                                          .jitter = 0};

// What a controller puts in the calls' context: the assignment (a fencing
// token) the calls run under.
struct Assignment {
  int64_t token = 0;
};

Context WithToken(int64_t token, const Context& base = Context()) {
  return base.WithValue(std::make_shared<const Assignment>(Assignment{token}));
}

std::optional<int64_t> TokenOf(const Context& ctx) {
  const Assignment* a = ctx.Value<Assignment>();
  if (a == nullptr) return std::nullopt;
  return a->token;
}

// A client in front of the fake that records what each call saw in its
// context, and can hold calls at a gate of its own that ignores their
// context (a client that does not watch for cancellation).
class ProbeClient final : public SyncerClient<std::string, int, int> {
 public:
  // One finished call.
  struct Seen {
    std::string key;
    std::optional<int64_t> token_at_start;
    std::optional<int64_t> token_at_end;  // Once the fake returned.
    bool cancelled_at_end = false;
    std::thread::id thread;
  };

  explicit ProbeClient(IntFake* fake) : fake_(fake) {}

  absl::Status Create(const Context& ctx, const std::string& key,
                      const int& desired) override {
    return Probe(ctx, key, [&] { return fake_->Create(ctx, key, desired); });
  }
  absl::Status Update(const Context& ctx, const std::string& key,
                      const int& desired, const int& observed) override {
    return Probe(ctx, key,
                 [&] { return fake_->Update(ctx, key, desired, observed); });
  }
  absl::Status Delete(const Context& ctx, const std::string& key,
                      const int& observed) override {
    return Probe(ctx, key, [&] { return fake_->Delete(ctx, key, observed); });
  }

  // Calls from now on wait at the gate, whatever their context says, until
  // OpenGate().
  void CloseGate() {
    MutexLock l(&mu_);
    closed_ = true;
  }
  void OpenGate() {
    MutexLock l(&mu_);
    closed_ = false;
    cv_.SignalAll();
  }
  int at_gate() const {
    MutexLock l(&mu_);
    return at_gate_;
  }
  std::vector<Seen> seen() const {
    MutexLock l(&mu_);
    return seen_;
  }
  // The calls for `key` that finished, in order.
  std::vector<Seen> SeenFor(const std::string& key) const {
    std::vector<Seen> out;
    for (Seen& s : seen()) {
      if (s.key == key) out.push_back(std::move(s));
    }
    return out;
  }
  // The tokens the finished calls for `key` started with (-1: none).
  std::vector<int64_t> TokensFor(const std::string& key) const {
    std::vector<int64_t> out;
    for (const Seen& s : SeenFor(key)) {
      out.push_back(s.token_at_start.value_or(-1));
    }
    return out;
  }

 private:
  template <class Fn>
  absl::Status Probe(const Context& ctx, const std::string& key, Fn call) {
    Seen s;
    s.key = key;
    s.token_at_start = TokenOf(ctx);
    s.thread = std::this_thread::get_id();
    {
      MutexLock l(&mu_);
      if (closed_) {
        ++at_gate_;
        cv_.Wait(&mu_, std::stop_token(),
                 [this]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !closed_; });
        --at_gate_;
      }
    }
    absl::Status status = call();
    s.token_at_end = TokenOf(ctx);
    s.cancelled_at_end = ctx.Cancelled();
    MutexLock l(&mu_);
    seen_.push_back(std::move(s));
    return status;
  }

  IntFake* const fake_;
  mutable Mutex mu_;
  CondVar cv_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int at_gate_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Seen> seen_ ABSL_GUARDED_BY(mu_);
};

// The wiring a user would have: the fake world reports its changes through
// a PushSource (as a watch would) into the observed Store, which the syncer
// observes. The desired side is user code calling SetDesired on the runner.
class SyncerTest : public ::testing::Test {
 protected:
  struct Setup {
    IntSyncer::Options options = {};
    bool simulated_clock = false;
    FakeObservation observation = FakeObservation::kImmediate;
    // The world before the syncer starts; the source lists it first.
    absl::flat_hash_map<std::string, int> world = {};
    // The desired state before the syncer starts (it is complete: keys in
    // the world and not here are deleted).
    absl::flat_hash_map<std::string, int> desired = {};
    // The syncer calls a ProbeClient (probe_) in front of the fake.
    bool probe = false;
    // Default: NullLogger().
    std::shared_ptr<spdlog::logger> logger = nullptr;
  };

  void Build(Setup setup) {
    if (setup.simulated_clock) clock_ = std::make_unique<SimulatedClock>();
    Clock* clock = clock_ != nullptr ? clock_.get() : Clock::Real();
    runner_ = std::make_unique<Runner>(
        RunnerOptions{.name = "t", .clock = clock, .logger = NullLogger()});
    store_ = std::make_unique<Store<std::string, int>>(
        StoreOptions<int>{.name = "observed", .logger = NullLogger()});
    source_ = std::make_unique<PushSource<std::string, int>>(
        runner_.get(), store_.get(),
        PushSourceOptions<std::string, int>{
            // A new shard range: list the world again, as a watch re-lists.
            .on_filter_change =
                [this](const KeyFilter<std::string>&) {
                  source_->Replace(fake_->world());
                },
            .logger = NullLogger()});
    fake_ = std::make_unique<IntFake>(
        testing::FakeClientOptions<std::string, int, int>{
            .watcher =
                [this](const std::string& key,
                       const std::optional<int>& value) {
                  if (value.has_value()) {
                    source_->Set(key, *value);
                  } else {
                    source_->Delete(key);
                  }
                },
            .observation = setup.observation,
            .clock = clock,
        });
    for (auto& [key, value] : setup.world) fake_->Set(key, value);
    setup.options.clock = clock;
    setup.options.logger =
        setup.logger != nullptr ? setup.logger : NullLogger();
    if (setup.options.seed == 0) setup.options.seed = 1;
    IntSyncer::Client* client = fake_.get();
    if (setup.probe) {
      probe_ = std::make_unique<ProbeClient>(fake_.get());
      client = probe_.get();
    }
    syncer_ = std::make_unique<IntSyncer>(runner_.get(), client,
                                          std::move(setup.options));
    syncer_->ObserveFrom(store_.get());
    syncer_->ReplaceDesired(std::move(setup.desired));
    source_->Replace(fake_->world(), /*synced=*/true);
  }

  // Builds, then starts the syncer and the runner, and waits until the
  // syncer is in sync (the first list arrived).
  void Start(Setup setup) {
    Build(std::move(setup));
    ASSERT_THAT(syncer_->Start(), IsOk());
    ASSERT_THAT(runner_->Start(), IsOk());
    ASSERT_TRUE(AwaitCondition([&] { return Status().in_sync; }));
  }

  void TearDown() override {
    if (syncer_ != nullptr) syncer_->Stop();
    if (runner_ != nullptr) runner_->Stop();
  }

  SyncerStatus<std::string> Status() {
    auto s = runner_->PostAndWait(Context(), [&] {
      SyncerStatus<std::string> snapshot = syncer_->StatusSnapshot();
      // The errors share their bodies with the syncer's copies; give the
      // test thread its own (see FakeClient::Clone on why TSan cares).
      for (SyncerKeyFailure<std::string>& f : snapshot.failures) {
        f.last_error = absl::Status(f.last_error.code(),
                                    std::string(f.last_error.message()));
      }
      return snapshot;
    });
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : SyncerStatus<std::string>{};
  }
  template <class Fn>
  void OnRunner(Fn fn) {
    ASSERT_THAT(runner_->PostAndWait(Context(), std::move(fn)), IsOk());
  }
  // Sets a desired value and returns once the syncer worked the key out
  // (its pump runs in the next runner event).
  void SetDesired(const std::string& key, int value) {
    OnRunner([&] { syncer_->SetDesired(key, value); });
    OnRunner([] {});
  }
  // True once every key is converged and nothing runs.
  bool Converged(int64_t keys) {
    SyncerStatus<std::string> s = Status();
    return s.keys == keys && s.converged == keys && s.in_flight == 0;
  }
  // Waits until the runner sleeps on the simulated clock with its next
  // timer at `when` (InfiniteFuture: no timer).
  bool AwaitNextTimer(absl::Time when) {
    return AwaitCondition([&] {
      return clock_->num_waiters() > 0 && clock_->NextDeadline() == when;
    });
  }

  std::unique_ptr<SimulatedClock> clock_;
  std::unique_ptr<Runner> runner_;
  std::unique_ptr<Store<std::string, int>> store_;
  std::unique_ptr<PushSource<std::string, int>> source_;
  std::unique_ptr<IntFake> fake_;
  std::unique_ptr<ProbeClient> probe_;
  std::unique_ptr<IntSyncer> syncer_;
};

TEST_F(SyncerTest, CreatesUpdatesAndDeletesToMatchDesired) {
  Start({});
  OnRunner([&] {
    syncer_->SetDesired("a", 1);
    syncer_->SetDesired("b", 2);
  });
  ASSERT_TRUE(AwaitCondition([&] { return Converged(2); }));
  OnRunner([&] {
    syncer_->SetDesired("a", 5);
    syncer_->DeleteDesired("b");
  });
  ASSERT_TRUE(AwaitCondition([&] { return Converged(1); }));
  EXPECT_EQ(fake_->world(), (absl::flat_hash_map<std::string, int>{{"a", 5}}));
  testing::FakeClientStats calls = fake_->stats();
  EXPECT_EQ(calls.calls, 4);
  SyncerStats c = syncer_->stats();
  EXPECT_EQ(c.creates, 2);
  EXPECT_EQ(c.updates, 1);
  EXPECT_EQ(c.deletes, 1);
  EXPECT_EQ(c.failures, 0);
}

TEST_F(SyncerTest, StopCancelsItsOwnWakeUpSoTheRunnerDropsNothing) {
  Start({});
  fake_->FailNext(1);  // A backoff: the syncer arms a wake-up timer.
  SetDesired("a", 1);
  ASSERT_TRUE(AwaitCondition([&] { return syncer_->stats().failures == 1; }));
  ASSERT_TRUE(AwaitCondition([&] { return Status().backing_off == 1; }));
  syncer_->Stop();
  runner_->Stop();
  EXPECT_EQ(runner_->stats().timers_dropped, 0);
}

// --- Coalescing
// ---------------------------------------------------------------

TEST_F(SyncerTest, ThousandUpdatesDuringAnOperationCoalesceIntoOneMore) {
  Start({});
  fake_->HoldCalls();
  SetDesired("k", 0);
  ASSERT_TRUE(fake_->AwaitHeldCalls(1));
  // One runner event per update, as a busy producer would send them.
  for (int i = 1; i <= 1000; ++i) {
    ASSERT_THAT(runner_->Post([this, i] { syncer_->SetDesired("k", i); }),
                IsOk());
  }
  OnRunner([] {});  // Every update was applied.
  fake_->ReleaseCalls();
  ASSERT_TRUE(AwaitCondition([&] { return Converged(1); }));
  EXPECT_EQ(fake_->Get("k"), 1000);
  EXPECT_LE(fake_->CallsFor("k"), 2);
  EXPECT_EQ(fake_->CallsFor("k", SyncOp::kCreate), 1);
  EXPECT_EQ(syncer_->stats().updates, 1);
}

// --- Failures and backoff
// -----------------------------------------------------

TEST_F(SyncerTest, PerKeyBackoffConvergesManyKeysUnderRandomFailures) {
  constexpr int kKeys = 10000;
  Start({.options = {.max_in_flight = 16,
                     .backoff = {.initial = absl::Milliseconds(1),
                                 .max = absl::Milliseconds(8)}}});
  fake_->SetFailureRate(0.3);
  OnRunner([&] {
    for (int i = 0; i < kKeys; ++i)
      syncer_->SetDesired(absl::StrCat("k", i), i);
  });
  ASSERT_TRUE(AwaitCondition([&] { return syncer_->stats().creates == kKeys; },
                             absl::Seconds(60)));
  ASSERT_TRUE(AwaitCondition([&] { return Converged(kKeys); }));
  absl::flat_hash_map<std::string, int> world = fake_->world();
  ASSERT_EQ(world.size(), static_cast<size_t>(kKeys));
  for (int i = 0; i < kKeys; ++i) {
    ASSERT_EQ(world[absl::StrCat("k", i)], i) << i;
  }
  // Every call is accounted for: a success or a failure that was retried.
  SyncerStats c = syncer_->stats();
  testing::FakeClientStats calls = fake_->stats();
  EXPECT_GT(c.failures, kKeys / 10);
  EXPECT_EQ(c.failures, calls.failed);
  EXPECT_EQ(calls.creates, c.creates + c.failures);
  EXPECT_EQ(calls.updates + calls.deletes, 0);
  EXPECT_EQ(c.terminal_failures + c.results_discarded + c.client_threw, 0);
  EXPECT_LE(calls.max_concurrent, 16);
  EXPECT_EQ(calls.max_concurrent_per_key, 1);
  EXPECT_TRUE(Status().failures.empty());
}

TEST_F(SyncerTest, BackoffDoublesPerFailureResetsOnSuccessAndHonoursHints) {
  Start({.options = {.backoff = kExactBackoff}, .simulated_clock = true});
  SimulatedClock& clock = *clock_;
  fake_->FailNext(3);

  // Failure 1: retried after `initial`.
  SetDesired("k", 1);
  ASSERT_TRUE(AwaitCondition([&] { return fake_->stats().failed == 1; }));
  absl::Time t1 = clock.Now();
  ASSERT_TRUE(AwaitNextTimer(t1 + absl::Seconds(1)));
  clock.AdvanceTime(absl::Seconds(1));

  // Failure 2: retried after 2 x initial.
  ASSERT_TRUE(AwaitCondition([&] { return fake_->stats().failed == 2; }));
  absl::Time t2 = clock.Now();
  ASSERT_TRUE(AwaitNextTimer(t2 + absl::Seconds(2)));
  SyncerStatus<std::string> s = Status();
  ASSERT_EQ(s.failures.size(), 1u);
  EXPECT_EQ(s.failures[0].key, "k");
  EXPECT_EQ(s.failures[0].failures, 2);
  EXPECT_FALSE(s.failures[0].terminal);
  EXPECT_EQ(s.failures[0].next_attempt, t2 + absl::Seconds(2));
  EXPECT_EQ(s.backing_off, 1);

  // A new desired value during the backoff neither retries earlier nor
  // counts as a failure.
  SetDesired("k", 2);
  clock.AdvanceTime(absl::Seconds(1));
  OnRunner([] {});
  EXPECT_EQ(fake_->stats().calls, 2);
  ASSERT_TRUE(AwaitNextTimer(t2 + absl::Seconds(2)));
  clock.AdvanceTime(absl::Seconds(1));

  // Failure 3: 4 x initial, the third failure, not the fourth.
  ASSERT_TRUE(AwaitCondition([&] { return fake_->stats().failed == 3; }));
  absl::Time t3 = clock.Now();
  ASSERT_TRUE(AwaitNextTimer(t3 + absl::Seconds(4)));
  clock.AdvanceTime(absl::Seconds(4));
  ASSERT_TRUE(AwaitCondition([&] { return Converged(1); }));
  EXPECT_EQ(fake_->Get("k"), 2);
  EXPECT_EQ(fake_->stats().calls, 4);

  // After the success the backoff starts over from `initial`.
  fake_->FailNext(1);
  SetDesired("k", 3);
  ASSERT_TRUE(AwaitCondition([&] { return fake_->stats().failed == 4; }));
  ASSERT_TRUE(AwaitNextTimer(clock.Now() + absl::Seconds(1)));
  clock.AdvanceTime(absl::Seconds(1));
  ASSERT_TRUE(AwaitCondition([&] { return fake_->Get("k") == 3; }));

  // A retry-after hint replaces the backoff delay.
  fake_->RetryAfterNext(1, absl::Seconds(42));
  SetDesired("k", 4);
  ASSERT_TRUE(AwaitCondition([&] { return fake_->stats().failed == 5; }));
  absl::Time t5 = clock.Now();
  ASSERT_TRUE(AwaitNextTimer(t5 + absl::Seconds(42)));
  clock.AdvanceTime(absl::Seconds(41));
  OnRunner([] {});
  EXPECT_EQ(fake_->stats().calls, 7);
  clock.AdvanceTime(absl::Seconds(1));
  ASSERT_TRUE(AwaitCondition([&] { return fake_->Get("k") == 4; }));
  EXPECT_EQ(syncer_->stats().failures, 5);
}

TEST_F(SyncerTest, TerminalErrorsAreNotRetriedUntilTheDesiredValueChanges) {
  Start({.options = {.backoff = kExactBackoff}, .simulated_clock = true});
  const std::vector<absl::StatusCode> codes = {
      absl::StatusCode::kInvalidArgument, absl::StatusCode::kPermissionDenied,
      absl::StatusCode::kFailedPrecondition};
  for (absl::StatusCode code : codes) {
    std::string key = absl::StrCat("k", static_cast<int>(code));
    fake_->FailNextFor(key, 1, absl::Status(code, "fake client: rejected"));
    SetDesired(key, 1);
  }
  ASSERT_TRUE(
      AwaitCondition([&] { return syncer_->stats().terminal_failures == 3; }));
  SyncerStatus<std::string> s = Status();
  EXPECT_EQ(s.terminal, 3);
  ASSERT_EQ(s.failures.size(), 3u);
  for (const SyncerKeyFailure<std::string>& f : s.failures) {
    EXPECT_TRUE(f.terminal) << f.key;
    EXPECT_EQ(f.failures, 1) << f.key;
    EXPECT_EQ(f.next_attempt, absl::InfiniteFuture()) << f.key;
    EXPECT_EQ(f.key, absl::StrCat("k", static_cast<int>(f.last_error.code())));
  }
  // Nothing is scheduled, and an hour later nothing was retried.
  ASSERT_TRUE(AwaitNextTimer(absl::InfiniteFuture()));
  clock_->AdvanceTime(absl::Hours(1));
  OnRunner([] {});
  EXPECT_EQ(fake_->stats().calls, 3);
  EXPECT_EQ(syncer_->stats().failures, 0);

  // A new desired value is worth another try.
  for (absl::StatusCode code : codes) {
    SetDesired(absl::StrCat("k", static_cast<int>(code)), 2);
  }
  ASSERT_TRUE(AwaitCondition([&] { return Converged(3); }));
  EXPECT_EQ(fake_->stats().calls, 6);
  EXPECT_EQ(syncer_->stats().creates, 3);
  EXPECT_TRUE(Status().failures.empty());
}

TEST_F(SyncerTest, AThrowingClientIsCountedAndRetried) {
  Start({.options = {.backoff = {.initial = absl::Milliseconds(1)}}});
  fake_->ThrowNext(2);
  SetDesired("a", 1);
  SetDesired("b", 2);
  ASSERT_TRUE(AwaitCondition([&] { return Converged(2); }));
  SyncerStats c = syncer_->stats();
  EXPECT_EQ(c.client_threw, 2);
  EXPECT_EQ(c.failures, 2);
  EXPECT_EQ(c.creates, 2);
  EXPECT_EQ(fake_->stats().threw, 2);
  EXPECT_EQ(fake_->stats().calls, 4);
  // The syncer goes on with later work.
  SetDesired("a", 3);
  ASSERT_TRUE(AwaitCondition([&] { return fake_->Get("a") == 3; }));
}

// --- Sync gating
// --------------------------------------------------------------

TEST_F(SyncerTest, NothingStartsWhileObservedIsOutOfSyncThenOneFreshDiff) {
  Start({.world = {{"stale", 1}, {"old", 1}},
         .desired = {{"stale", 1}, {"old", 1}}});
  ASSERT_TRUE(AwaitCondition([&] { return Converged(2); }));

  source_->MarkLostSync();
  ASSERT_TRUE(AwaitCondition([&] { return !Status().in_sync; }));
  // Would be a create, an update and a delete.
  OnRunner([&] {
    for (int i = 1; i <= 3; ++i) syncer_->SetDesired("new", i);
    syncer_->SetDesired("old", 2);
    syncer_->SetDesired("old", 3);
    syncer_->DeleteDesired("stale");
  });
  SyncerStatus<std::string> paused = Status();
  EXPECT_EQ(paused.in_flight, 0);
  EXPECT_EQ(paused.pending, 3);
  EXPECT_EQ(fake_->stats().calls, 0);

  source_->MarkSynced();
  ASSERT_TRUE(AwaitCondition([&] { return Converged(2); }));
  EXPECT_EQ(fake_->world(),
            (absl::flat_hash_map<std::string, int>{{"new", 3}, {"old", 3}}));
  // One operation per key, with the latest value.
  EXPECT_EQ(fake_->stats().calls, 3);
  EXPECT_EQ(fake_->CallsFor("new", SyncOp::kCreate), 1);
  EXPECT_EQ(fake_->CallsFor("old", SyncOp::kUpdate), 1);
  EXPECT_EQ(fake_->CallsFor("stale", SyncOp::kDelete), 1);
}

TEST_F(SyncerTest, NothingStartsWhileTheDesiredProducerIsOutOfSync) {
  // Desired state from a transformer over a store of specs: the spec store
  // losing sync makes the desired view incomplete.
  Build({});
  Store<std::string, int> specs({.name = "specs", .logger = NullLogger()});
  Transformer<std::string, int> transformer(
      runner_.get(), syncer_.get(), nullptr,
      {.name = "specs-to-desired", .logger = NullLogger()});
  transformer.Watch(&specs, [](const Change<std::string, int>& c) {
    DesiredDiff<std::string, int> diff;
    if (c.kind == ChangeKind::kSet) {
      diff.set.emplace_back(c.key, *c.new_value);
    } else {
      diff.remove.push_back(c.key);
    }
    return diff;
  });
  ASSERT_THAT(syncer_->Start(), IsOk());
  ASSERT_THAT(runner_->Start(), IsOk());
  OnRunner([&] { specs.Set("a", 1); });
  EXPECT_FALSE(Status().in_sync);
  EXPECT_EQ(Status().pending, 1);
  OnRunner([&] {
    specs.Set("a", 2);
    specs.MarkSynced();
  });
  ASSERT_TRUE(AwaitCondition([&] { return Converged(1); }));
  EXPECT_EQ(fake_->CallsFor("a"), 1);

  OnRunner([&] {
    specs.MarkLostSync();
    specs.Set("a", 3);
    specs.Set("a", 4);
  });
  EXPECT_EQ(Status().in_flight, 0);
  EXPECT_EQ(fake_->stats().calls, 1);
  OnRunner([&] { specs.MarkSynced(); });
  ASSERT_TRUE(AwaitCondition([&] { return fake_->Get("a") == 4; }));
  ASSERT_TRUE(AwaitCondition([&] { return Converged(1); }));
  EXPECT_EQ(fake_->CallsFor("a", SyncOp::kUpdate), 1);
  // Stop before the local store and transformer go away: runner events may
  // refer to them.
  syncer_->Stop();
  runner_->Stop();
}

// --- Read-your-own-writes
// -----------------------------------------------------

TEST_F(SyncerTest, ASuccessIsNotRepeatedBeforeItsObservationArrives) {
  Start({.options = {.backoff = kExactBackoff,
                     .expectation_timeout = absl::Seconds(10)},
         .simulated_clock = true,
         .observation = FakeObservation::kHeld});
  SetDesired("k", 1);
  ASSERT_TRUE(AwaitCondition([&] { return syncer_->stats().creates == 1; }));
  EXPECT_EQ(Status().awaiting_observation, 1);
  ASSERT_TRUE(
      AwaitNextTimer(clock_->Now() + absl::Seconds(10)));  // The expectation.

  // Evaluations of the key before the observation: a lost and regained sync
  // (every key is diffed again) and a switch that was turned back on.
  source_->MarkLostSync();
  ASSERT_TRUE(AwaitCondition([&] { return !Status().in_sync; }));
  source_->MarkSynced();
  ASSERT_TRUE(AwaitCondition([&] { return Status().in_sync; }));
  OnRunner([&] {
    syncer_->EnableCreate(false);
    syncer_->EnableCreate(true);
  });
  clock_->AdvanceTime(absl::Seconds(9));
  OnRunner([] {});
  SyncerStatus<std::string> s = Status();
  EXPECT_EQ(s.in_flight, 0);
  EXPECT_EQ(s.awaiting_observation, 1);
  EXPECT_EQ(fake_->stats().calls, 1);

  // After expectation_timeout the key is worked out again: still no
  // observation, so another create, which the world refuses.
  clock_->AdvanceTime(absl::Seconds(1));
  ASSERT_TRUE(AwaitCondition([&] { return fake_->stats().failed == 1; }));
  EXPECT_EQ(fake_->CallsFor("k", SyncOp::kCreate), 2);
  EXPECT_THAT(fake_->calls().back().result,
              StatusIs(absl::StatusCode::kAlreadyExists));

  // The observation finally arrives: the key is done, the failure moot.
  EXPECT_EQ(fake_->DeliverHeld(), 1);
  ASSERT_TRUE(AwaitCondition([&] { return Converged(1); }));
  EXPECT_TRUE(Status().failures.empty());
  EXPECT_EQ(fake_->stats().calls, 2);
}

// --- Reset
// --------------------------------------------------------------------

bool InRange(const std::string& key) { return key.starts_with("in/"); }

TEST_F(SyncerTest, ResetForgetsOutOfRangeKeysWithoutDeletingThem) {
  absl::flat_hash_map<std::string, int> world = {
      {"in/1", 1}, {"in/2", 1}, {"out/1", 1}, {"out/2", 1}};
  Start({.world = world, .desired = world});
  ASSERT_TRUE(AwaitCondition([&] { return Converged(4); }));

  fake_->HoldCalls();
  SetDesired("in/1", 2);
  SetDesired("out/1", 2);
  ASSERT_TRUE(fake_->AwaitHeldCalls(2));
  // The documented order: the syncer first, then the sources.
  OnRunner([&] {
    syncer_->Rescope(InRange);
    source_->Rescope(InRange);
  });
  SyncerStatus<std::string> s = Status();
  EXPECT_EQ(s.keys, 2);
  // in/1, and the forgotten out/1 until its cancelled call's result is back.
  EXPECT_GE(s.in_flight, 1);
  OnRunner([&] {
    syncer_->SetDesired("out/2", 5);  // Not ours any more.
    syncer_->DeleteDesired("out/2");
  });
  EXPECT_EQ(syncer_->stats().ignored_out_of_range, 1);

  // out/1's held call saw its context cancelled and returned; in/1's
  // still waits at the gate.
  EXPECT_THAT(syncer_->AwaitCallsWithin(InRange, Context()), IsOk());
  EXPECT_EQ(syncer_->stats().calls_cancelled, 1);
  ASSERT_TRUE(AwaitCondition([&] { return Status().in_flight == 1; }));
  fake_->ReleaseCalls();
  ASSERT_TRUE(AwaitCondition([&] { return Converged(2); }));
  ASSERT_TRUE(
      AwaitCondition([&] { return syncer_->stats().results_discarded == 1; }));
  EXPECT_EQ(Status().in_flight, 0);
  EXPECT_EQ(fake_->stats().deletes, 0);
  EXPECT_EQ(fake_->world(),
            (absl::flat_hash_map<std::string, int>{
                {"in/1", 2}, {"in/2", 1}, {"out/1", 1}, {"out/2", 1}}));
  SyncerStats c = syncer_->stats();
  EXPECT_EQ(c.updates, 1);  // in/1 only: out/1's call was cancelled.
}

TEST_F(SyncerTest, AKeyBackInRangeDoesNotGetASecondOperationInFlight) {
  Start({.world = {{"out/1", 1}}, .desired = {{"out/1", 1}}});
  ASSERT_TRUE(AwaitCondition([&] { return Converged(1); }));

  fake_->HoldCalls();
  SetDesired("out/1", 2);
  ASSERT_TRUE(fake_->AwaitHeldCalls(1));
  OnRunner([&] {
    syncer_->Rescope(InRange);
    source_->Rescope(InRange);
  });
  // The range comes back while the old operation still runs; the producer
  // re-sends its desired state.
  OnRunner([&] {
    syncer_->Rescope(nullptr);
    source_->Rescope(nullptr);
    syncer_->SetDesired("out/1", 3);
  });
  ASSERT_TRUE(AwaitCondition([&] { return Status().in_sync; }));
  // The old call was cancelled when the key left; the new one starts only
  // once its result is back (never two for the key at once).
  ASSERT_TRUE(AwaitCondition([&] { return fake_->stats().calls == 2; }));
  EXPECT_EQ(syncer_->stats().calls_cancelled, 1);
  EXPECT_EQ(fake_->stats().max_concurrent_per_key, 1);

  fake_->ReleaseCalls();
  ASSERT_TRUE(AwaitCondition([&] { return fake_->Get("out/1") == 3; }));
  ASSERT_TRUE(AwaitCondition([&] { return Converged(1); }));
  EXPECT_EQ(syncer_->stats().results_discarded, 1);
  EXPECT_EQ(fake_->stats().max_concurrent_per_key, 1);
  EXPECT_EQ(fake_->CallsFor("out/1", SyncOp::kUpdate), 2);
  EXPECT_EQ(fake_->CallsFor("out/1"), 2);
}

TEST_F(SyncerTest, ResetCancelsTheRunningCallsOfKeysThatLeftAndNoOthers) {
  absl::flat_hash_map<std::string, int> world = {
      {"in/1", 1}, {"in/2", 1}, {"out/1", 1}};
  Start({.world = world, .desired = world, .probe = true});
  ASSERT_TRUE(AwaitCondition([&] { return Converged(3); }));

  fake_->HoldCalls();  // The fake's gate ends a call whose context ends.
  SetDesired("in/1", 2);
  SetDesired("in/2", 2);
  SetDesired("out/1", 2);
  ASSERT_TRUE(fake_->AwaitHeldCalls(3));
  OnRunner([&] {
    syncer_->Rescope(InRange);
    source_->Rescope(InRange);
  });
  EXPECT_EQ(syncer_->stats().calls_cancelled, 1);
  // out/1's call saw its context cancelled and returned; the bound only
  // keeps a broken syncer from hanging the test.
  EXPECT_THAT(syncer_->AwaitCallsWithin(
                  InRange, Context().WithTimeout(absl::Seconds(10))),
              IsOk());
  std::vector<ProbeClient::Seen> out = probe_->SeenFor("out/1");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].cancelled_at_end);
  EXPECT_THAT(fake_->calls().back().result,
              StatusIs(absl::StatusCode::kCancelled));
  // The calls of keys still in range go on.
  EXPECT_EQ(fake_->held_calls(), 2);
  // Once out/1's result is back, only theirs are in flight.
  ASSERT_TRUE(AwaitCondition([&] { return Status().in_flight == 2; }));
  EXPECT_EQ(fake_->held_calls(), 2);

  fake_->ReleaseCalls();
  ASSERT_TRUE(AwaitCondition([&] { return Converged(2); }));
  for (const char* key : {"in/1", "in/2"}) {
    std::vector<ProbeClient::Seen> in = probe_->SeenFor(key);
    ASSERT_FALSE(in.empty()) << key;
    EXPECT_FALSE(in.back().cancelled_at_end) << key;
  }
  EXPECT_EQ(fake_->world(), (absl::flat_hash_map<std::string, int>{
                                {"in/1", 2}, {"in/2", 2}, {"out/1", 1}}));
  SyncerStats c = syncer_->stats();
  EXPECT_EQ(c.updates, 2);
  EXPECT_EQ(c.results_discarded, 1);
  EXPECT_EQ(c.calls_cancelled, 1);
  EXPECT_EQ(c.failures, 0);
}

TEST_F(SyncerTest, AwaitCallsWithinWaitsForACallThatIgnoresCancellation) {
  absl::flat_hash_map<std::string, int> world = {{"in/1", 1}, {"out/1", 1}};
  Start({.world = world, .desired = world, .probe = true});
  ASSERT_TRUE(AwaitCondition([&] { return Converged(2); }));

  probe_->CloseGate();  // Its gate does not look at the context.
  SetDesired("in/1", 2);
  SetDesired("out/1", 2);
  ASSERT_TRUE(AwaitCondition([&] { return probe_->at_gate() == 2; }));
  OnRunner([&] {
    syncer_->Rescope(InRange);
    source_->Rescope(InRange);
  });
  EXPECT_EQ(syncer_->stats().calls_cancelled, 1);

  // The deadline bounds the wait; out/1's call still runs when it passes.
  EXPECT_THAT(syncer_->AwaitCallsWithin(
                  InRange, Context().WithTimeout(absl::Milliseconds(50))),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr(": 1 call(s) for keys outside the range")));
  std::stop_source cancel;
  cancel.request_stop();
  EXPECT_THAT(syncer_->AwaitCallsWithin(InRange, Context(cancel.get_token())),
              StatusIs(absl::StatusCode::kCancelled, HasSubstr(": 1 call(s)")));
  // An empty filter selects every key: no call is outside it.
  EXPECT_THAT(syncer_->AwaitCallsWithin(nullptr, Context()), IsOk());
  EXPECT_EQ(probe_->at_gate(), 2);

  probe_->OpenGate();
  EXPECT_THAT(syncer_->AwaitCallsWithin(
                  InRange, Context().WithTimeout(absl::Seconds(10))),
              IsOk());
  std::vector<ProbeClient::Seen> out = probe_->SeenFor("out/1");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].cancelled_at_end);
  ASSERT_TRUE(AwaitCondition([&] { return Converged(1); }));
  std::vector<ProbeClient::Seen> in = probe_->SeenFor("in/1");
  ASSERT_EQ(in.size(), 1u);
  EXPECT_FALSE(in[0].cancelled_at_end);
  EXPECT_EQ(fake_->world(),
            (absl::flat_hash_map<std::string, int>{{"in/1", 2}, {"out/1", 1}}));
  ASSERT_TRUE(
      AwaitCondition([&] { return syncer_->stats().results_discarded == 1; }));
  EXPECT_EQ(syncer_->stats().updates, 1);
}

TEST_F(SyncerTest, AHandedOverCallForAKeyThatLeftNeverStarts) {
  absl::flat_hash_map<std::string, int> world = {{"in/1", 1}, {"out/1", 1}};
  Start({.options = {.max_in_flight = 2, .updater_threads = 1},
         .world = world,
         .desired = world});
  ASSERT_TRUE(AwaitCondition([&] { return Converged(2); }));

  fake_->HoldCalls();
  SetDesired("in/1", 2);
  ASSERT_TRUE(fake_->AwaitHeldCalls(1));  // The one updater is busy...
  SetDesired("out/1", 2);                 // ...so this one waits for it.
  EXPECT_EQ(Status().in_flight, 2);
  OnRunner([&] {
    syncer_->Rescope(InRange);
    source_->Rescope(InRange);
  });
  EXPECT_EQ(syncer_->stats().calls_cancelled, 1);
  // Nothing outside the range runs, nor ever will.
  EXPECT_THAT(syncer_->AwaitCallsWithin(
                  InRange, Context().WithTimeout(absl::Seconds(10))),
              IsOk());
  EXPECT_EQ(fake_->held_calls(), 1);

  fake_->ReleaseCalls();
  ASSERT_TRUE(
      AwaitCondition([&] { return syncer_->stats().results_discarded == 1; }));
  ASSERT_TRUE(AwaitCondition([&] { return Converged(1); }));
  EXPECT_EQ(fake_->CallsFor("out/1"), 0);
  EXPECT_EQ(fake_->stats().calls, 1);
  EXPECT_EQ(fake_->world(),
            (absl::flat_hash_map<std::string, int>{{"in/1", 2}, {"out/1", 1}}));
  SyncerStats c = syncer_->stats();
  EXPECT_EQ(c.calls_cancelled, 1);
  EXPECT_EQ(c.updates, 1);
  EXPECT_EQ(c.not_started_at_stop, 0);
}

// --- Shutdown
// -----------------------------------------------------------------

TEST_F(SyncerTest, StopWithOperationsInFlightCancelsThemAndCountsTheRest) {
  Start({.options = {.max_in_flight = 4, .updater_threads = 1}});
  fake_->HoldCalls();
  OnRunner([&] {
    for (int i = 0; i < 6; ++i) syncer_->SetDesired(absl::StrCat("k", i), i);
  });
  ASSERT_TRUE(fake_->AwaitHeldCalls(1));
  EXPECT_EQ(Status().in_flight, 4);  // One running, three queued.

  syncer_->Stop();  // Returns once the held call saw its context cancelled.
  std::vector<testing::FakeCall<std::string>> calls = fake_->calls();
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_THAT(calls[0].result, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(syncer_->stats().not_started_at_stop, 3);
  SyncerStatus<std::string> s = Status();
  EXPECT_EQ(s.keys, 6);
  EXPECT_EQ(s.in_flight, 0);
  EXPECT_EQ(s.pending + s.backing_off, 6);
  EXPECT_EQ(s.converged, 0);
  // Work that appears after Stop starts nothing.
  SetDesired("late", 1);
  OnRunner([] {});
  EXPECT_EQ(fake_->stats().calls, 1);
  runner_->Stop();
  EXPECT_TRUE(fake_->world().empty());
}

TEST_F(SyncerTest, OperationTimeoutEndsASlowCallWhichIsRetried) {
  Start({.options = {.backoff = kExactBackoff,
                     .operation_timeout = absl::Seconds(5)},
         .simulated_clock = true});
  fake_->HoldCalls();
  SetDesired("k", 1);
  ASSERT_TRUE(fake_->AwaitHeldCalls(1));
  absl::Time t0 = clock_->Now();
  // The held call waits for its context's deadline on the clock.
  ASSERT_TRUE(AwaitNextTimer(t0 + absl::Seconds(5)));
  clock_->AdvanceTime(absl::Seconds(5));
  ASSERT_TRUE(AwaitCondition([&] { return fake_->stats().failed == 1; }));
  EXPECT_THAT(fake_->calls().back().result,
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  fake_->ReleaseCalls();
  ASSERT_TRUE(AwaitNextTimer(t0 + absl::Seconds(6)));
  clock_->AdvanceTime(absl::Seconds(1));
  ASSERT_TRUE(AwaitCondition([&] { return Converged(1); }));
  EXPECT_EQ(fake_->stats().calls, 2);
  EXPECT_EQ(syncer_->stats().failures, 1);
}

TEST_F(SyncerTest, DestroyedOnTheRunnerBeforeItsStoreAndItsEvents) {
  Start({});
  fake_->HoldCalls();
  SetDesired("k", 1);
  ASSERT_TRUE(fake_->AwaitHeldCalls(1));
  // Destroying the syncer on the runner thread stops it (the held call is
  // cancelled and its result posted); that result, the stop report and
  // later changes of the store it observed must not reach it.
  OnRunner([&] {
    syncer_.reset();
    store_->Set("k", 2);
  });
  OnRunner([&] { store_->Set("k", 3); });
  EXPECT_EQ(fake_->stats().calls, 1);
  EXPECT_THAT(fake_->calls().back().result,
              StatusIs(absl::StatusCode::kCancelled));
}

// --- Limits
// -------------------------------------------------------------------

TEST_F(SyncerTest, AtMostMaxInFlightAndOneOperationPerKey) {
  constexpr int kKeys = 40;
  Start({.options = {.max_in_flight = 3, .updater_threads = 8}});
  // Fill every slot and show no fourth operation starts.
  fake_->HoldCalls();
  OnRunner([&] {
    for (int i = 0; i < kKeys; ++i)
      syncer_->SetDesired(absl::StrCat("k", i), 0);
  });
  ASSERT_TRUE(fake_->AwaitHeldCalls(3));
  OnRunner([] {});
  EXPECT_EQ(Status().in_flight, 3);
  EXPECT_EQ(fake_->held_calls(), 3);
  // Then let them run slowly while every key keeps changing.
  fake_->SetLatency(absl::Microseconds(200));
  fake_->ReleaseCalls();
  for (int round = 1; round <= 5; ++round) {
    OnRunner([&] {
      for (int i = 0; i < kKeys; ++i) {
        syncer_->SetDesired(absl::StrCat("k", i), round);
      }
    });
  }
  ASSERT_TRUE(AwaitCondition([&] { return Converged(kKeys); }));
  for (int i = 0; i < kKeys; ++i) {
    EXPECT_EQ(fake_->Get(absl::StrCat("k", i)), 5);
  }
  testing::FakeClientStats calls = fake_->stats();
  EXPECT_EQ(calls.max_concurrent, 3);
  EXPECT_EQ(calls.max_concurrent_per_key, 1);
  EXPECT_EQ(calls.failed, 0);
}

TEST_F(SyncerTest, RateLimitIsATokenBucket) {
  Start({.options = {.rate_limit = 10, .rate_burst = 2},
         .simulated_clock = true});
  absl::Time t0 = clock_->Now();
  OnRunner([&] {
    for (int i = 0; i < 5; ++i) syncer_->SetDesired(absl::StrCat("k", i), i);
  });
  // The burst goes at once; then one token every 100 ms.
  ASSERT_TRUE(AwaitCondition([&] { return fake_->stats().calls == 2; }));
  for (int n = 3; n <= 5; ++n) {
    ASSERT_TRUE(AwaitNextTimer(t0 + absl::Milliseconds(100) * (n - 2)));
    EXPECT_EQ(fake_->stats().calls, n - 1);
    EXPECT_EQ(Status().pending, 5 - (n - 1));
    clock_->AdvanceTime(absl::Milliseconds(100));
    ASSERT_TRUE(AwaitCondition([&] { return fake_->stats().calls == n; }));
  }
  ASSERT_TRUE(AwaitCondition([&] { return Converged(5); }));
  EXPECT_EQ(fake_->stats().calls, 5);
}

TEST_F(SyncerTest, ExecutionDelayTurnsABurstIntoOneOperation) {
  Start({.options = {.execution_delay = absl::Seconds(1)},
         .simulated_clock = true});
  absl::Time t0 = clock_->Now();
  SetDesired("k", 1);
  clock_->AdvanceTime(absl::Milliseconds(400));
  SetDesired("k", 2);
  clock_->AdvanceTime(absl::Milliseconds(400));
  SetDesired("k", 3);
  ASSERT_TRUE(AwaitNextTimer(t0 + absl::Seconds(1)));
  EXPECT_EQ(fake_->stats().calls, 0);
  EXPECT_EQ(Status().pending, 1);
  clock_->AdvanceTime(absl::Milliseconds(200));
  ASSERT_TRUE(AwaitCondition([&] { return Converged(1); }));
  EXPECT_EQ(fake_->Get("k"), 3);
  EXPECT_EQ(fake_->stats().calls, 1);
}

TEST_F(SyncerTest, DisabledOperationsStayPendingUntilEnabled) {
  Start({.options = {.enable_create = false, .enable_delete = false},
         .world = {{"gone", 1}}});
  // "gone" is observed but not desired: a delete. "new" is a create.
  SetDesired("new", 1);
  OnRunner([] {});
  SyncerStatus<std::string> s = Status();
  EXPECT_EQ(s.keys, 2);
  EXPECT_EQ(s.pending, 2);
  EXPECT_EQ(s.in_flight, 0);
  EXPECT_EQ(fake_->stats().calls, 0);

  OnRunner([&] { syncer_->EnableDelete(true); });
  ASSERT_TRUE(AwaitCondition([&] { return !fake_->Get("gone").has_value(); }));
  OnRunner([] {});
  EXPECT_EQ(fake_->stats().creates, 0);
  EXPECT_EQ(Status().pending, 1);

  OnRunner([&] { syncer_->EnableCreate(true); });
  ASSERT_TRUE(AwaitCondition([&] { return Converged(1); }));
  EXPECT_EQ(fake_->Get("new"), 1);
  EXPECT_EQ(fake_->stats().calls, 2);
}

// --- Call values and stale owners
// ---------------------------------------------

TEST_F(SyncerTest, CallsCarryTheValuesTheyStartedUnder) {
  Start({.probe = true});
  SetDesired("a", 1);
  ASSERT_TRUE(AwaitCondition([&] { return Converged(1); }));
  EXPECT_THAT(probe_->TokensFor("a"), ElementsAre(-1));  // No values yet.

  // Only the values are taken, not the cancellation or the deadline of the
  // context they came in.
  std::stop_source cancel;
  cancel.request_stop();
  Context ended = Context(cancel.get_token()).WithTimeout(absl::ZeroDuration());
  OnRunner([&] { syncer_->SetCallValues(WithToken(1, ended)); });
  SetDesired("a", 2);
  ASSERT_TRUE(AwaitCondition([&] { return fake_->Get("a") == 2; }));
  ASSERT_TRUE(AwaitCondition([&] { return Converged(1); }));
  EXPECT_THAT(probe_->TokensFor("a"), ElementsAre(-1, 1));
  EXPECT_FALSE(probe_->SeenFor("a").back().cancelled_at_end);
  EXPECT_THAT(fake_->calls().back().result, IsOk());

  // A call running when the values change keeps the ones it started with;
  // a call started after sees the new ones.
  fake_->HoldCalls();
  SetDesired("a", 3);
  ASSERT_TRUE(fake_->AwaitHeldCalls(1));
  OnRunner([&] { syncer_->SetCallValues(WithToken(2)); });
  SetDesired("b", 1);
  ASSERT_TRUE(fake_->AwaitHeldCalls(2));
  fake_->ReleaseCalls();
  ASSERT_TRUE(AwaitCondition([&] { return Converged(2); }));
  std::vector<ProbeClient::Seen> a = probe_->SeenFor("a");
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[2].token_at_start, 1);
  EXPECT_EQ(a[2].token_at_end, 1);  // After SetCallValues(2) was applied.
  std::vector<ProbeClient::Seen> b = probe_->SeenFor("b");
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].token_at_start, 2);
  EXPECT_EQ(b[0].token_at_end, 2);

  SetDesired("a", 4);
  ASSERT_TRUE(AwaitCondition([&] { return fake_->Get("a") == 4; }));
  // The fake applies the write before the probe around it records the
  // call's end: wait for the record, not for the world.
  ASSERT_TRUE(
      AwaitCondition([&] { return probe_->TokensFor("a").size() >= 4; }));
  EXPECT_THAT(probe_->TokensFor("a"), ElementsAre(-1, 1, 1, 2));
}

TEST_F(SyncerTest, AStaleOwnerRefusalIsNotRetriedUntilNewCallValues) {
  Start({.options = {.backoff = kExactBackoff},
         .simulated_clock = true,
         .probe = true});
  OnRunner([&] { syncer_->SetCallValues(WithToken(1)); });
  // Refused once: any retry would succeed.
  fake_->FailNextFor("k", 1,
                     StaleOwnerError("create k: fencing token 1 is older "
                                     "than 2"));
  SetDesired("k", 1);
  ASSERT_TRUE(
      AwaitCondition([&] { return syncer_->stats().stale_refusals == 1; }));
  SyncerStatus<std::string> s = Status();
  EXPECT_EQ(s.stale, 1);
  EXPECT_EQ(s.backing_off, 0);
  EXPECT_EQ(s.terminal, 0);  // Its code is kFailedPrecondition, a terminal one.
  EXPECT_EQ(s.pending, 0);
  ASSERT_EQ(s.failures.size(), 1u);
  EXPECT_EQ(s.failures[0].key, "k");
  EXPECT_FALSE(s.failures[0].terminal);
  EXPECT_EQ(s.failures[0].next_attempt, absl::InfiniteFuture());
  EXPECT_THAT(s.failures[0].last_error,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("fencing token")));
  SyncerStats c = syncer_->stats();
  EXPECT_EQ(c.failures, 0);
  EXPECT_EQ(c.terminal_failures, 0);

  // No retry is scheduled, and an hour later, far past any backoff, none
  // happened.
  ASSERT_TRUE(AwaitNextTimer(absl::InfiniteFuture()));
  clock_->AdvanceTime(absl::Hours(1));
  OnRunner([] {});
  // Nor when the key is worked out again: a lost and regained sync, a new
  // desired value.
  source_->MarkLostSync();
  ASSERT_TRUE(AwaitCondition([&] { return !Status().in_sync; }));
  source_->MarkSynced();
  ASSERT_TRUE(AwaitCondition([&] { return Status().in_sync; }));
  SetDesired("k", 2);
  // Other keys go on meanwhile.
  SetDesired("other", 1);
  ASSERT_TRUE(AwaitCondition([&] { return fake_->Get("other") == 1; }));
  ASSERT_TRUE(AwaitCondition([&] { return Status().converged == 1; }));
  EXPECT_EQ(fake_->CallsFor("k"), 1);
  EXPECT_EQ(Status().stale, 1);
  EXPECT_EQ(syncer_->stats().stale_refusals, 1);

  // A new assignment: the key is tried again, under it, and succeeds.
  OnRunner([&] { syncer_->SetCallValues(WithToken(2)); });
  ASSERT_TRUE(AwaitCondition([&] { return Converged(2); }));
  EXPECT_EQ(fake_->Get("k"), 2);
  EXPECT_EQ(fake_->CallsFor("k"), 2);
  EXPECT_THAT(probe_->TokensFor("k"), ElementsAre(1, 2));
  s = Status();
  EXPECT_EQ(s.stale, 0);
  EXPECT_TRUE(s.failures.empty());
  c = syncer_->stats();
  EXPECT_EQ(c.stale_refusals, 1);
  EXPECT_EQ(c.creates, 2);
  EXPECT_EQ(c.failures, 0);
}

TEST_F(SyncerTest, AStaleRefusalUnderValuesSinceReplacedIsRetriedAtOnce) {
  // The assignment changes (a newer token) while a call made under the old
  // one runs; the system refuses that call as stale. The key must not wait
  // for yet another SetCallValues: it already has new values.
  Start({.probe = true});
  OnRunner([&] { syncer_->SetCallValues(WithToken(1)); });
  fake_->HoldCalls();
  fake_->FailNextFor("k", 1, StaleOwnerError("create k: stale token 1"));
  SetDesired("k", 1);
  ASSERT_TRUE(fake_->AwaitHeldCalls(1));
  OnRunner([&] { syncer_->SetCallValues(WithToken(2)); });
  fake_->ReleaseCalls();
  ASSERT_TRUE(
      AwaitCondition([&] { return syncer_->stats().stale_refusals == 1; }));
  ASSERT_TRUE(AwaitCondition([&] { return Converged(1); }));
  EXPECT_EQ(fake_->Get("k"), 1);
  EXPECT_THAT(probe_->TokensFor("k"), ElementsAre(1, 2));
  EXPECT_EQ(Status().stale, 0);
}

// Lines of `sink` that contain `text`.
int LinesWith(spdlog::sinks::ringbuffer_sink_mt& sink, std::string_view text) {
  int n = 0;
  for (const std::string& line : sink.last_formatted()) {
    if (line.find(text) != std::string::npos) ++n;
  }
  return n;
}

TEST_F(SyncerTest, StaleRefusalsAreLoggedOncePerSetCallValues) {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000);
  Start({.logger = std::make_shared<spdlog::logger>("syncer", sink)});
  constexpr std::string_view kLine = "refused as a stale owner";
  for (const char* key : {"a", "b"}) {
    fake_->FailNextFor(key, 1, StaleOwnerError("write: stale token"));
  }
  SetDesired("a", 1);
  SetDesired("b", 1);
  ASSERT_TRUE(
      AwaitCondition([&] { return syncer_->stats().stale_refusals == 2; }));
  OnRunner([] {});
  EXPECT_EQ(LinesWith(*sink, kLine), 1);
  EXPECT_EQ(Status().stale, 2);

  // New values: both are tried again; "a" is refused again and logged
  // again, once.
  fake_->FailNextFor("a", 1, StaleOwnerError("write: stale token"));
  OnRunner([&] { syncer_->SetCallValues(WithToken(2)); });
  ASSERT_TRUE(
      AwaitCondition([&] { return syncer_->stats().stale_refusals == 3; }));
  ASSERT_TRUE(AwaitCondition([&] { return fake_->Get("b") == 1; }));
  OnRunner([] {});
  EXPECT_EQ(LinesWith(*sink, kLine), 2);
  EXPECT_EQ(Status().stale, 1);
  EXPECT_FALSE(fake_->Get("a").has_value());
}

// --- Desired state from a store
// -----------------------------------------------

TEST_F(SyncerTest, DesireFromActsOnlyWhileTheDesiredStoreIsInSync) {
  Build({});
  Store<std::string, int> specs({.name = "specs", .logger = NullLogger()});
  syncer_->DesireFrom(&specs);
  ASSERT_THAT(syncer_->Start(), IsOk());
  ASSERT_THAT(runner_->Start(), IsOk());
  OnRunner([&] { specs.Set("a", 1); });
  SyncerStatus<std::string> s = Status();
  EXPECT_FALSE(s.in_sync);
  EXPECT_EQ(s.pending, 1);
  OnRunner([&] { specs.MarkSynced(); });
  ASSERT_TRUE(AwaitCondition([&] { return Converged(1); }));
  EXPECT_EQ(fake_->Get("a"), 1);

  // Out of sync, then changes: no call.
  OnRunner([&] {
    specs.MarkLostSync();
    specs.Set("a", 2);
    specs.Set("b", 1);
  });
  OnRunner([] {});
  s = Status();
  EXPECT_FALSE(s.in_sync);
  EXPECT_EQ(s.in_flight, 0);
  EXPECT_EQ(fake_->stats().calls, 1);
  OnRunner([&] { specs.MarkSynced(); });
  ASSERT_TRUE(AwaitCondition([&] { return Converged(2); }));
  EXPECT_EQ(fake_->world(),
            (absl::flat_hash_map<std::string, int>{{"a", 2}, {"b", 1}}));

  // A key deleted from the desired store while it is out of sync stays in
  // the world until the store is back.
  OnRunner([&] {
    specs.MarkLostSync();
    specs.Delete("b");
  });
  OnRunner([] {});
  EXPECT_EQ(fake_->Get("b"), 1);
  EXPECT_EQ(fake_->stats().deletes, 0);
  OnRunner([&] { specs.MarkSynced(); });
  ASSERT_TRUE(AwaitCondition([&] { return Converged(1); }));
  EXPECT_EQ(fake_->world(), (absl::flat_hash_map<std::string, int>{{"a", 2}}));
  EXPECT_EQ(fake_->stats().calls, 4);
  EXPECT_EQ(fake_->CallsFor("b", SyncOp::kDelete), 1);
  // Stop before the local store goes away.
  syncer_->Stop();
  runner_->Stop();
}

TEST_F(SyncerTest, DesireFromDeletesOnlyWhatIsObservedWhileObservedIsInSync) {
  Build({.world = {{"x", 1}}});
  Store<std::string, int> specs({.name = "specs", .logger = NullLogger()});
  syncer_->DesireFrom(&specs);
  ASSERT_THAT(syncer_->Start(), IsOk());
  ASSERT_THAT(runner_->Start(), IsOk());
  OnRunner([&] {
    specs.Set("x", 1);
    specs.MarkSynced();
  });
  ASSERT_TRUE(AwaitCondition([&] { return Converged(1); }));

  // The observed side is out of sync: the delete waits for it.
  source_->MarkLostSync();
  ASSERT_TRUE(AwaitCondition([&] { return !Status().in_sync; }));
  OnRunner([&] { specs.Delete("x"); });
  OnRunner([] {});
  EXPECT_EQ(fake_->stats().calls, 0);
  EXPECT_EQ(fake_->Get("x"), 1);
  source_->MarkSynced();
  ASSERT_TRUE(AwaitCondition([&] { return Converged(0); }));
  EXPECT_FALSE(fake_->Get("x").has_value());

  // Created but not observed yet: deleting it from the desired store
  // deletes nothing until the syncer sees it in the world.
  fake_->SetObservation(FakeObservation::kHeld);
  OnRunner([&] { specs.Set("y", 1); });
  ASSERT_TRUE(AwaitCondition([&] { return fake_->Get("y") == 1; }));
  ASSERT_TRUE(
      AwaitCondition([&] { return Status().awaiting_observation == 1; }));
  OnRunner([&] { specs.Delete("y"); });
  OnRunner([] {});
  EXPECT_EQ(fake_->CallsFor("y", SyncOp::kDelete), 0);
  EXPECT_EQ(fake_->Get("y"), 1);
  EXPECT_EQ(fake_->DeliverHeld(), 1);  // Now it is observed.
  ASSERT_TRUE(AwaitCondition([&] { return !fake_->Get("y").has_value(); }));
  EXPECT_EQ(fake_->DeliverHeld(), 1);
  ASSERT_TRUE(AwaitCondition([&] { return Converged(0); }));
  EXPECT_EQ(fake_->CallsFor("y", SyncOp::kDelete), 1);
  EXPECT_EQ(fake_->stats().calls, 3);
  syncer_->Stop();
  runner_->Stop();
}

TEST_F(SyncerTest, DesireFromTakesWhatTheStoreAlreadyHolds) {
  // The desired store was filled (and is in sync) before the syncer reads
  // from it: its content is the desired state, not "nothing desired".
  Build({.world = {{"a", 1}}});
  Store<std::string, int> specs({.name = "specs", .logger = NullLogger()});
  specs.Set("a", 1);
  specs.Set("b", 2);
  specs.MarkSynced();
  syncer_->DesireFrom(&specs);
  ASSERT_THAT(syncer_->Start(), IsOk());
  ASSERT_THAT(runner_->Start(), IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return Converged(2); }));
  EXPECT_EQ(fake_->world(),
            (absl::flat_hash_map<std::string, int>{{"a", 1}, {"b", 2}}));
  EXPECT_EQ(fake_->stats().deletes, 0);
  EXPECT_EQ(fake_->stats().calls, 1);
  syncer_->Stop();
  runner_->Stop();
}

// --- Manual updates
// -----------------------------------------------------------

TEST_F(SyncerTest, ManualUpdatesRunCallsOnTheCallingThreadOnly) {
  // The runner is never started: RunUntilIdle runs it on this thread.
  Build({.options = {.manual_updates = true},
         .simulated_clock = true,
         .world = {{"old", 1}},
         .probe = true});
  // Updaters of earlier tests may still be listed for a moment after their
  // join.
  ASSERT_TRUE(AwaitCondition([] { return ThreadsNamed("sp-updater") == 0; }));
  ASSERT_THAT(syncer_->Start(), IsOk());
  EXPECT_EQ(ThreadsNamed("sp-updater"), 0);
  runner_->RunUntilIdle();
  ASSERT_TRUE(syncer_->StatusSnapshot().in_sync);

  syncer_->SetDesired("a", 1);
  syncer_->SetDesired("b", 2);
  runner_->RunUntilIdle();
  EXPECT_EQ(syncer_->StatusSnapshot().in_flight, 3);  // With old's delete.
  EXPECT_EQ(fake_->stats().calls, 0);  // Handed over; nobody runs them.
  EXPECT_EQ(syncer_->RunUntilIdle(), 3);
  EXPECT_EQ(syncer_->RunUntilIdle(), 0);
  runner_->RunUntilIdle();  // The results and the observations.
  SyncerStatus<std::string> s = syncer_->StatusSnapshot();
  EXPECT_EQ(s.keys, 2);
  EXPECT_EQ(s.converged, 2);
  EXPECT_EQ(s.in_flight, 0);
  EXPECT_EQ(fake_->world(),
            (absl::flat_hash_map<std::string, int>{{"a", 1}, {"b", 2}}));

  syncer_->SetDesired("a", 5);
  syncer_->DeleteDesired("b");
  runner_->RunUntilIdle();
  EXPECT_EQ(syncer_->RunUntilIdle(), 2);
  runner_->RunUntilIdle();
  s = syncer_->StatusSnapshot();
  EXPECT_EQ(s.keys, 1);
  EXPECT_EQ(s.converged, 1);
  EXPECT_EQ(fake_->world(), (absl::flat_hash_map<std::string, int>{{"a", 5}}));

  std::vector<ProbeClient::Seen> seen = probe_->seen();
  ASSERT_EQ(seen.size(), 5u);
  for (const ProbeClient::Seen& call : seen) {
    EXPECT_EQ(call.thread, std::this_thread::get_id()) << call.key;
  }
  SyncerStats c = syncer_->stats();
  EXPECT_EQ(c.creates, 2);
  EXPECT_EQ(c.updates, 1);
  EXPECT_EQ(c.deletes, 2);
  EXPECT_EQ(ThreadsNamed("sp-updater"), 0);
}

TEST_F(SyncerTest, ManualUpdatesDoNotRunAHandedOverCallForAKeyThatLeft) {
  absl::flat_hash_map<std::string, int> world = {{"in/1", 1}, {"out/1", 1}};
  Build({.options = {.manual_updates = true},
         .simulated_clock = true,
         .world = world,
         .desired = world});
  ASSERT_THAT(syncer_->Start(), IsOk());
  runner_->RunUntilIdle();
  syncer_->SetDesired("in/1", 2);
  syncer_->SetDesired("out/1", 2);
  runner_->RunUntilIdle();
  EXPECT_EQ(syncer_->StatusSnapshot().in_flight, 2);
  syncer_->Rescope(InRange);
  source_->Rescope(InRange);
  EXPECT_EQ(syncer_->stats().calls_cancelled, 1);
  EXPECT_EQ(syncer_->RunUntilIdle(), 1);  // in/1's only.
  runner_->RunUntilIdle();
  EXPECT_EQ(fake_->CallsFor("out/1"), 0);
  SyncerStatus<std::string> s = syncer_->StatusSnapshot();
  EXPECT_EQ(s.keys, 1);
  EXPECT_EQ(s.converged, 1);
  EXPECT_EQ(s.in_flight, 0);
  EXPECT_EQ(syncer_->stats().results_discarded, 1);
  EXPECT_EQ(fake_->world(),
            (absl::flat_hash_map<std::string, int>{{"in/1", 2}, {"out/1", 1}}));
}

// --- Start
// --------------------------------------------------------------------

TEST(SyncerStartTest, InvalidOptionsAreRefusedNamingTheField) {
  struct Case {
    const char* field;
    void (*set)(IntSyncer::Options&);
  };
  const Case cases[] = {
      {"max_in_flight", [](IntSyncer::Options& o) { o.max_in_flight = -1; }},
      {"updater_threads",
       [](IntSyncer::Options& o) { o.updater_threads = -1; }},
      {"rate_limit", [](IntSyncer::Options& o) { o.rate_limit = -1; }},
      {"rate_burst", [](IntSyncer::Options& o) { o.rate_burst = 0; }},
      {"execution_delay",
       [](IntSyncer::Options& o) { o.execution_delay = absl::Seconds(-1); }},
      {"expectation_timeout",
       [](IntSyncer::Options& o) {
         o.expectation_timeout = absl::Seconds(-1);
       }},
      {"operation_timeout",
       [](IntSyncer::Options& o) { o.operation_timeout = absl::Seconds(-1); }},
      {"backoff options: initial",
       [](IntSyncer::Options& o) { o.backoff.initial = absl::ZeroDuration(); }},
      {"backoff options: jitter",
       [](IntSyncer::Options& o) { o.backoff.jitter = 2; }},
  };
  Runner runner({.logger = NullLogger()});
  IntFake fake;
  for (const Case& c : cases) {
    IntSyncer::Options options{.name = "vms", .logger = NullLogger()};
    c.set(options);
    IntSyncer syncer(&runner, &fake, std::move(options));
    absl::Status s = syncer.Start();
    EXPECT_THAT(
        s, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)))
        << c.field;
    EXPECT_THAT(std::string(s.message()), HasSubstr("syncer vms"));
    // Only the bad field is named.
    for (const Case& other : cases) {
      if (&other == &c) continue;
      EXPECT_THAT(std::string(s.message()), Not(HasSubstr(other.field)))
          << c.field;
    }
  }
  IntSyncer no_client(&runner, static_cast<IntSyncer::Client*>(nullptr),
                      {.logger = NullLogger()});
  EXPECT_THAT(no_client.Start(), StatusIs(absl::StatusCode::kInvalidArgument,
                                          HasSubstr("client")));

  // Types that do not compare need needs_update.
  struct Spec {
    int size = 0;
  };
  struct Vm {
    int size = 0;
  };
  FakeClient<std::string, Spec, Vm> vms(
      {.to_observed = [](const std::string&, const Spec& s) {
        return Vm{s.size};
      }});
  Syncer<std::string, Spec, Vm> bare(&runner, &vms, {.logger = NullLogger()});
  EXPECT_THAT(bare.Start(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("needs_update")));

  IntSyncer twice(&runner, &fake, {.logger = NullLogger()});
  EXPECT_THAT(twice.Start(), IsOk());
  EXPECT_THAT(twice.Start(), StatusIs(absl::StatusCode::kFailedPrecondition));
  twice.Stop();
}

// --- The fake itself
// ----------------------------------------------------------

TEST(FakeClientTest, BehavesLikeAStrictBackend) {
  IntFake fake;
  Context ctx;
  EXPECT_THAT(fake.Create(ctx, "a", 1), IsOk());
  EXPECT_THAT(fake.Create(ctx, "a", 2),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(fake.Update(ctx, "b", 1, 0),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(fake.Delete(ctx, "b", 0), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(fake.Update(ctx, "a", 3, 1), IsOk());
  EXPECT_EQ(fake.Get("a"), 3);
  EXPECT_THAT(fake.Delete(ctx, "a", 3), IsOk());
  EXPECT_TRUE(fake.world().empty());
  EXPECT_EQ(fake.stats().calls, 6);
  EXPECT_EQ(fake.stats().failed, 3);
  EXPECT_EQ(fake.CallsFor("a"), 4);
  EXPECT_EQ(fake.CallsFor("a", SyncOp::kCreate), 2);
}

TEST(FakeClientTest, InjectsFailuresThrowsAndHints) {
  IntFake fake;
  Context ctx;
  fake.FailNextFor("x", 1, absl::InvalidArgumentError("no"));
  fake.FailNext(1);
  EXPECT_THAT(fake.Create(ctx, "a", 1),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(fake.Create(ctx, "x", 1),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_FALSE(fake.Get("a").has_value());
  fake.RetryAfterNext(1, absl::Seconds(3));
  absl::Status hinted = fake.Create(ctx, "a", 1);
  EXPECT_EQ(RetryAfterHint(hinted), absl::Seconds(3));
  fake.FailNextAfterApplying(1);
  EXPECT_THAT(fake.Create(ctx, "a", 1),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(fake.Get("a"), 1);  // Done despite the error.
  fake.ThrowNext(1);
  EXPECT_THROW((void)fake.Update(ctx, "a", 2, 1), std::runtime_error);
  EXPECT_EQ(fake.Get("a"), 1);
  EXPECT_EQ(fake.in_flight(), 0);
  EXPECT_EQ(fake.stats().threw, 1);
  // The failure rate is seeded: about 30% of many calls fail.
  fake.SetFailureRate(0.3);
  int failed = 0;
  for (int i = 0; i < 1000; ++i) {
    if (!fake.Update(ctx, "a", i, 0).ok()) ++failed;
  }
  EXPECT_GT(failed, 200);
  EXPECT_LT(failed, 400);
}

TEST(FakeClientTest, LatencyIsOnTheClockAndCancellable) {
  SimulatedClock clock;
  IntFake fake({.clock = &clock});
  fake.SetLatency(absl::Seconds(5));
  std::stop_source cancel;
  absl::Status first, second;
  std::thread t([&] {
    Context ctx(cancel.get_token(), &clock);
    first = fake.Create(ctx, "a", 1);
    second = fake.Create(ctx, "b", 1);
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  EXPECT_EQ(clock.NextDeadline(), clock.Now() + absl::Seconds(5));
  clock.AdvanceTime(absl::Seconds(5));
  ASSERT_TRUE(AwaitCondition([&] { return fake.Get("a").has_value(); }));
  ASSERT_TRUE(clock.AwaitWaiters(1));
  cancel.request_stop();
  t.join();
  EXPECT_THAT(first, IsOk());
  EXPECT_THAT(second, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_FALSE(fake.Get("b").has_value());
}

TEST(FakeClientTest, ObservationsAreImmediateHeldOrDropped) {
  std::vector<std::pair<std::string, std::optional<int>>> seen;
  IntFake fake(
      {.watcher = [&](const std::string& k, const std::optional<int>& v) {
        seen.emplace_back(k, v);
      }});
  Context ctx;
  ASSERT_THAT(fake.Create(ctx, "a", 1), IsOk());
  ASSERT_EQ(seen.size(), 1u);  // Before Create returned.
  fake.SetObservation(FakeObservation::kHeld);
  ASSERT_THAT(fake.Update(ctx, "a", 2, 1), IsOk());
  ASSERT_THAT(fake.Delete(ctx, "a", 2), IsOk());
  EXPECT_EQ(seen.size(), 1u);
  EXPECT_EQ(fake.held_observations(), 2);
  EXPECT_EQ(fake.DeliverHeld(), 2);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[1], std::make_pair(std::string("a"), std::optional<int>(2)));
  EXPECT_EQ(seen[2], std::make_pair(std::string("a"), std::optional<int>()));
  fake.SetObservation(FakeObservation::kDropped);
  fake.Set("b", 1);
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_EQ(fake.Get("b"), 1);
}

// A client whose calls wait, ignoring their cancellation, until opened, and
// then report that the system saw a newer owner's token.
class RefusedLateClient final : public SyncerClient<std::string, int, int> {
 public:
  absl::Status Create(const Context&, const std::string&, const int&) override {
    return Refuse();
  }
  absl::Status Update(const Context&, const std::string&, const int&,
                      const int&) override {
    return Refuse();
  }
  absl::Status Delete(const Context&, const std::string&, const int&) override {
    return Refuse();
  }
  void AwaitEntered() { entered_.wait(false); }
  void Open() {
    open_.store(true);
    open_.notify_all();
  }

 private:
  absl::Status Refuse() {
    entered_.store(true);
    entered_.notify_all();
    open_.wait(false);
    return StaleOwnerError("the system saw a newer token");
  }
  std::atomic<bool> entered_{false};
  std::atomic<bool> open_{false};
};

TEST(SyncerStaleTest, ARefusalThatComesBackAfterTheKeyLeftIsStillCounted) {
  // A pod that froze with a write in flight: by the time the refusal comes
  // back, the key has left the range. The result is discarded, and still
  // counted as a stale refusal, so operators see the stale writer.
  Runner runner({.name = "stale", .logger = testing::NullLogger()});
  ASSERT_THAT(runner.Start(), IsOk());
  RefusedLateClient client;
  MetricsRegistry metrics;
  Syncer<std::string, int, int> syncer(
      &runner, &client,
      {.name = "late", .metrics = &metrics, .logger = testing::NullLogger()});
  ASSERT_THAT(syncer.Start(), IsOk());
  const Context ctx = Context().WithTimeout(absl::Seconds(10));
  ASSERT_THAT(runner.PostAndWait(ctx,
                                 [&] {
                                   syncer.MarkDesiredComplete();
                                   syncer.SetDesired("k", 1);
                                 }),
              IsOk());
  client.AwaitEntered();
  ASSERT_THAT(
      runner.PostAndWait(
          ctx,
          [&] { syncer.Rescope([](const std::string&) { return false; }); }),
      IsOk());
  client.Open();
  ASSERT_TRUE(testing::AwaitCondition(
      [&] { return syncer.stats().results_discarded == 1; }));
  EXPECT_EQ(syncer.stats().stale_refusals, 1);
  EXPECT_EQ(metrics
                .GetCounter("setpoint_syncer_stale_refusals_total", "",
                            {{"syncer", "late"}})
                .Value(),
            1);
  syncer.Stop();
  runner.Stop();
}

}  // namespace
}  // namespace setpoint
