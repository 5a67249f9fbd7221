// The Syncer with a BatchSyncerClient: every per-key promise holds for each
// operation inside a batch call.
#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "processor/syncer_rig.h"
#include "setpoint/base/context.h"
#include "setpoint/base/status.h"
#include "setpoint/processor/syncer.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/fake_batch_client.h"
#include "setpoint/testing/fake_client.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint {
namespace {

using ::setpoint::testing::AwaitCondition;
using ::setpoint::testing::FakeObservation;
using ::setpoint::testing::IntSyncer;
using ::setpoint::testing::IsOk;
using ::setpoint::testing::NullLogger;
using ::setpoint::testing::SyncerRig;
using ::testing::Each;
using ::testing::Le;

std::string Key(int i) { return absl::StrCat("rec-", i); }

struct Token {
  int64_t value = 0;
};
Context WithToken(int64_t token) {
  return Context().WithValue(std::make_shared<const Token>(Token{token}));
}

TEST(SyncerBatchTest, ConvergesInBatchesOfDistinctKeysOneCallAtATime) {
  SyncerRig rig({.options = {.max_batch = 50}, .batch = true});
  ASSERT_THAT(rig.Start(), IsOk());
  for (int i = 0; i < 200; ++i) rig.SetDesired(Key(i), i);
  rig.Advance(absl::Seconds(1));
  EXPECT_TRUE(rig.Converged(200));
  EXPECT_EQ(rig.world().world().size(), 200u);
  const auto stats = rig.batch().stats();
  EXPECT_EQ(stats.operations, 200);
  EXPECT_EQ(stats.batches, 4);  // 200 keys, 50 per call.
  EXPECT_EQ(stats.max_concurrent, 1);
  for (const auto& b : rig.batch().batches()) {
    EXPECT_THAT(b.keys.size(), Le(50u));
    EXPECT_EQ(std::set<std::string>(b.keys.begin(), b.keys.end()).size(),
              b.keys.size())
        << "a key twice in one batch";
  }
  EXPECT_EQ(rig.syncer().stats().creates, 200);
  EXPECT_EQ(rig.syncer().stats().batches, 4);
}

TEST(SyncerBatchTest, TheFirstOperationWaitsBatchDelayForCompany) {
  SyncerRig rig(
      {.options = {.max_batch = 100, .batch_delay = absl::Milliseconds(20)},
       .batch = true});
  ASSERT_THAT(rig.Start(), IsOk());
  rig.SetDesired(Key(0), 0);
  rig.Advance(absl::Milliseconds(10));
  EXPECT_EQ(rig.batch().stats().batches, 0) << "started before batch_delay";
  for (int i = 1; i < 30; ++i) rig.SetDesired(Key(i), i);
  rig.Advance(absl::Milliseconds(11));
  ASSERT_EQ(rig.batch().stats().batches, 1);
  EXPECT_EQ(rig.batch().batches()[0].keys.size(), 30u);
  // A full batch does not wait.
  for (int i = 100; i < 200; ++i) rig.SetDesired(Key(i), i);
  rig.Settle();
  EXPECT_EQ(rig.batch().stats().batches, 2);
}

TEST(SyncerBatchTest, AFailedOperationBacksOffAloneTheOthersSucceed) {
  SyncerRig rig({.options = {.backoff = {.initial = absl::Seconds(1),
                                         .max = absl::Seconds(8),
                                         .multiplier = 2,
                                         .jitter = 0}},
                 .batch = true});
  ASSERT_THAT(rig.Start(), IsOk());
  rig.world().FailNextFor(Key(3), 2, absl::UnavailableError("one key"));
  for (int i = 0; i < 10; ++i) rig.SetDesired(Key(i), i);
  rig.Advance(absl::Milliseconds(100));
  SyncerStatus<std::string> s = rig.Status();
  EXPECT_EQ(s.converged, 9);
  ASSERT_EQ(s.failures.size(), 1u);
  EXPECT_EQ(s.failures[0].key, Key(3));
  EXPECT_EQ(s.failures[0].failures, 1);
  // Its own backoff: 1 s, then 2 s, each in a batch call of its own.
  rig.Advance(absl::Milliseconds(850));
  EXPECT_EQ(rig.world().CallsFor(Key(3)), 1);
  rig.Advance(absl::Milliseconds(100));
  EXPECT_EQ(rig.world().CallsFor(Key(3)), 2);
  rig.Advance(absl::Seconds(2));
  EXPECT_EQ(rig.world().CallsFor(Key(3)), 3);
  EXPECT_TRUE(rig.Converged(10));
  EXPECT_EQ(rig.syncer().stats().failures, 2);
}

TEST(SyncerBatchTest, RetryAfterTerminalAndStalePerOperation) {
  SyncerRig rig({.batch = true});
  ASSERT_THAT(rig.Start(), IsOk());
  rig.world().FailNextFor(
      Key(1), 1,
      WithRetryAfter(absl::UnavailableError("busy"), absl::Seconds(5)));
  rig.world().FailNextFor(Key(2), 1, absl::InvalidArgumentError("bad"));
  rig.world().FailNextFor(Key(3), 1, StaleOwnerError("token 1 < 2"));
  rig.syncer().SetCallValues(WithToken(1));
  for (int i = 0; i < 5; ++i) rig.SetDesired(Key(i), i);
  rig.Advance(absl::Milliseconds(50));
  SyncerStatus<std::string> s = rig.Status();
  EXPECT_EQ(s.converged, 2);
  EXPECT_EQ(s.backing_off, 1);
  EXPECT_EQ(s.terminal, 1);
  EXPECT_EQ(s.stale, 1);
  // The hint, not the backoff: nothing for 5 s, then the retry.
  rig.Advance(absl::Seconds(4));
  EXPECT_EQ(rig.world().CallsFor(Key(1)), 1);
  rig.Advance(absl::Seconds(2));
  EXPECT_EQ(rig.world().CallsFor(Key(1)), 2);
  // Terminal waits for a change of the key; stale for new call values.
  rig.Advance(absl::Seconds(60));
  EXPECT_EQ(rig.world().CallsFor(Key(2)), 1);
  EXPECT_EQ(rig.world().CallsFor(Key(3)), 1);
  rig.SetDesired(Key(2), 20);
  rig.syncer().SetCallValues(WithToken(2));
  rig.Advance(absl::Milliseconds(50));
  EXPECT_TRUE(rig.Converged(5));
  EXPECT_EQ(rig.syncer().stats().stale_refusals, 1);
  EXPECT_EQ(rig.syncer().stats().terminal_failures, 1);
}

TEST(SyncerBatchTest, AWholeCallFailureFailsEachOperationWithIt) {
  SyncerRig rig({.options = {.backoff = {.initial = absl::Seconds(1),
                                         .max = absl::Seconds(1),
                                         .multiplier = 2,
                                         .jitter = 0}},
                 .batch = true});
  ASSERT_THAT(rig.Start(), IsOk());
  rig.batch().FailNextBatches(1, absl::InternalError("500"));
  for (int i = 0; i < 4; ++i) rig.SetDesired(Key(i), i);
  rig.Advance(absl::Milliseconds(50));
  SyncerStatus<std::string> s = rig.Status();
  EXPECT_EQ(s.backing_off, 4);
  for (const auto& f : s.failures) {
    EXPECT_EQ(f.last_error.message(), "500");
  }
  EXPECT_EQ(rig.syncer().stats().failures, 4);
  rig.Advance(absl::Seconds(1));
  EXPECT_TRUE(rig.Converged(4));
  EXPECT_EQ(rig.batch().stats().batches, 2);
}

TEST(SyncerBatchTest, AThrowingBatchFailsEachOperationAndIsRetried) {
  SyncerRig rig({.batch = true});
  ASSERT_THAT(rig.Start(), IsOk());
  rig.batch().ThrowNextBatches(1);
  for (int i = 0; i < 3; ++i) rig.SetDesired(Key(i), i);
  rig.Advance(absl::Milliseconds(50));
  EXPECT_EQ(rig.syncer().stats().client_threw, 3);
  for (const auto& f : rig.Status().failures) {
    EXPECT_EQ(f.last_error.code(), absl::StatusCode::kInternal);
    EXPECT_TRUE(ThrewException(f.last_error));
  }
  rig.Advance(absl::Seconds(1));
  EXPECT_TRUE(rig.Converged(3));
}

TEST(SyncerBatchTest, UpdatesDuringABatchCoalesceAndWaitForTheirObservation) {
  SyncerRig rig({.batch = true});
  rig.world().SetObservation(FakeObservation::kHeld);
  ASSERT_THAT(rig.Start(), IsOk());
  rig.SetDesired(Key(0), 1);
  rig.Advance(absl::Milliseconds(10));
  ASSERT_EQ(rig.batch().stats().batches, 1);
  // Done, not yet observed: 1,000 changes meanwhile start nothing...
  for (int v = 2; v < 1002; ++v) rig.SetDesired(Key(0), v);
  rig.Advance(absl::Seconds(1));
  EXPECT_EQ(rig.batch().stats().batches, 1);
  EXPECT_EQ(rig.Status().awaiting_observation, 1);
  // ...then one update to the last value once the world showed the create.
  rig.world().DeliverHeld();
  rig.Advance(absl::Milliseconds(10));
  EXPECT_EQ(rig.world().CallsFor(Key(0)), 2);
  EXPECT_EQ(rig.world().Get(Key(0)), 1001);
}

TEST(SyncerBatchTest, AtMostMaxBatchesInFlightAndOneOperationPerKey) {
  Runner runner({.name = "t", .logger = NullLogger()});
  testing::FakeClient<std::string, int> world;
  testing::FakeBatchClient<std::string, int> batch(&world);
  world.SetLatency(absl::Microseconds(200));
  IntSyncer syncer(
      &runner, &batch,
      {.max_batch = 8, .max_batches_in_flight = 2, .logger = NullLogger()});
  syncer.MarkDesiredComplete();
  ASSERT_THAT(syncer.Start(), IsOk());
  ASSERT_THAT(runner.Start(), IsOk());
  ASSERT_THAT(runner.PostAndWait(Context(),
                                 [&] {
                                   for (int i = 0; i < 100; ++i) {
                                     syncer.SetDesired(Key(i), i);
                                   }
                                 }),
              IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return syncer.stats().creates == 100; }));
  EXPECT_EQ(batch.stats().max_concurrent, 2);
  EXPECT_EQ(world.stats().max_concurrent_per_key, 1);
  EXPECT_THAT(batch.stats().max_size, Le(8));
  syncer.Stop();
  runner.Stop();
}

TEST(SyncerBatchTest, TheBatchCallCarriesTheCallValues) {
  std::vector<int64_t> seen;
  class Spy final : public BatchSyncerClient<std::string, int, int> {
   public:
    explicit Spy(std::vector<int64_t>* seen) : seen_(seen) {}
    absl::Status Apply(
        const Context& ctx,
        std::span<SyncOperation<std::string, int, int>>) override {
      const Token* t = ctx.Value<Token>();
      seen_->push_back(t == nullptr ? -1 : t->value);
      return absl::OkStatus();
    }
    std::vector<int64_t>* seen_;
  } spy(&seen);
  testing::SimulatedClock clock;
  Runner runner({.name = "t", .clock = &clock, .logger = NullLogger()});
  IntSyncer syncer(&runner, &spy,
                   {.manual_updates = true, .logger = NullLogger()});
  syncer.MarkDesiredComplete();
  ASSERT_THAT(syncer.Start(), IsOk());
  syncer.SetCallValues(WithToken(7));
  for (int i = 0; i < 3; ++i) syncer.SetDesired(Key(i), i);
  runner.RunUntilIdle();  // Ready; waits batch_delay for company.
  clock.AdvanceTime(absl::Milliseconds(5));
  runner.RunUntilIdle();
  syncer.RunUntilIdle();
  EXPECT_THAT(seen, ::testing::ElementsAre(7));
  syncer.Stop();
}

// A handoff while a batch call runs: the call holds keys that stay and keys
// that leave. It is cancelled and awaited like a single call; the staying
// keys are tried again without a failure; the leaving ones are forgotten,
// and their queued operations never start.
TEST(SyncerBatchTest, AHandoffCancelsTheBatchAndRequeuesTheKeysThatStay) {
  Runner runner({.name = "t", .logger = NullLogger()});
  testing::FakeClient<std::string, int> world;
  testing::FakeBatchClient<std::string, int> batch(&world);
  IntSyncer syncer(
      &runner, &batch,
      {.max_batch = 4,
       .backoff = {.initial = absl::Seconds(30), .max = absl::Seconds(30)},
       .logger = NullLogger()});
  syncer.MarkDesiredComplete();
  ASSERT_THAT(syncer.Start(), IsOk());
  ASSERT_THAT(runner.Start(), IsOk());
  batch.HoldBatches();
  // Keys "a*" stay, keys "b*" leave.
  const std::vector<std::string> keys = {"a1", "b1", "a2", "b2",
                                         "a3", "b3", "b4"};
  ASSERT_THAT(runner.PostAndWait(Context(),
                                 [&] {
                                   for (const auto& k : keys) {
                                     syncer.SetDesired(k, 1);
                                   }
                                 }),
              IsOk());
  ASSERT_TRUE(batch.AwaitHeldBatches(1));
  auto stays = [](const std::string& k) { return k[0] == 'a'; };
  ASSERT_THAT(runner.PostAndWait(Context(), [&] { syncer.Rescope(stays); }),
              IsOk());
  // The held call's context is cancelled: it returns ctx.Err() for all.
  ASSERT_TRUE(AwaitCondition([&] {
    return batch.batches()[0].result.code() == absl::StatusCode::kCancelled;
  }));
  ASSERT_THAT(
      syncer.AwaitCallsWithin(stays, Context().WithTimeout(absl::Seconds(10))),
      IsOk());
  batch.ReleaseBatches();
  // The staying keys are created soon (no 30 s backoff: not a failure),
  // the leaving ones never.
  ASSERT_TRUE(AwaitCondition([&] { return world.world().size() == 3; }));
  std::string calls;
  for (const auto& b : batch.batches()) {
    absl::StrAppend(&calls, "[", absl::StrJoin(b.keys, ","),
                    "]: ", b.result.ToString(), "; ");
  }
  EXPECT_EQ(syncer.stats().failures, 0) << calls;
  EXPECT_GE(syncer.stats().requeued, 1);
  EXPECT_GE(syncer.stats().calls_cancelled, 3);
  for (const char* gone : {"b1", "b2", "b3", "b4"}) {
    EXPECT_FALSE(world.Get(gone).has_value()) << gone;
  }
  // Every call after the first held only staying keys.
  const auto all = batch.batches();
  for (size_t i = 1; i < all.size(); ++i) {
    for (const auto& k : all[i].keys) EXPECT_TRUE(stays(k)) << k;
  }
  syncer.Stop();
  runner.Stop();
}

TEST(SyncerBatchTest, InvalidBatchOptionsAreRefusedNamingTheField) {
  Runner runner({.logger = NullLogger()});
  testing::FakeClient<std::string, int> world;
  testing::FakeBatchClient<std::string, int> batch(&world);
  IntSyncer a(&runner, &batch, {.max_batch = 0, .logger = NullLogger()});
  EXPECT_THAT(a.Start(), testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                           ::testing::HasSubstr("max_batch")));
  IntSyncer b(&runner, &batch,
              {.max_batches_in_flight = 0, .logger = NullLogger()});
  EXPECT_THAT(b.Start(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                ::testing::HasSubstr("max_batches_in_flight")));
  IntSyncer c(&runner, &batch,
              {.batch_delay = absl::Seconds(-1), .logger = NullLogger()});
  EXPECT_THAT(c.Start(),
              testing::StatusIs(absl::StatusCode::kInvalidArgument,
                                ::testing::HasSubstr("batch_delay")));
}

}  // namespace
}  // namespace setpoint
