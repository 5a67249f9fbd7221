// Tests for setpoint/processor/synchronizable.h.
#include "setpoint/processor/synchronizable.h"

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace setpoint {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// A module whose own condition the test sets, logging its hooks and observer
// calls to a shared log so tests can check the order across modules.
class Module : public Synchronizable {
 public:
  explicit Module(std::string name, std::vector<std::string>* log = nullptr)
      : Synchronizable(std::move(name)), log_(log) {
    AddSyncObserver(
        [this](bool in_sync) { Log(in_sync ? "observer+" : "observer-"); });
  }

  void Set(bool synced) { SetSelfSynced(synced); }
  bool Inputs() const { return InputsInSync(); }

  int synced_calls = 0;
  int lost_calls = 0;
  // Runs in OnInputsSyncChanged when set.
  std::function<void(bool)> on_inputs;

 protected:
  void OnSynced() override {
    ++synced_calls;
    Log("synced");
  }
  void OnLostSync() override {
    ++lost_calls;
    Log("lost");
  }
  void OnInputsSyncChanged(bool inputs_in_sync) override {
    if (on_inputs) on_inputs(inputs_in_sync);
  }

 private:
  void Log(const std::string& what) {
    if (log_ != nullptr) log_->push_back(name() + " " + what);
  }
  std::vector<std::string>* log_;
};

TEST(Synchronizable, WithoutInputsFollowsItsOwnCondition) {
  Module a("a");
  EXPECT_FALSE(a.InSync());
  EXPECT_TRUE(a.Inputs());  // Vacuously.
  a.Set(true);
  EXPECT_TRUE(a.InSync());
  EXPECT_TRUE(a.SelfSynced());
  a.Set(false);
  EXPECT_FALSE(a.InSync());
}

TEST(Synchronizable, InSyncOnlyWhenItselfAndEveryInputAre) {
  Module a("a"), b("b"), c("c");
  c.DependOn(&a);
  c.DependOn(&b);
  c.Set(true);
  EXPECT_FALSE(c.InSync());
  EXPECT_TRUE(c.SelfSynced());
  a.Set(true);
  EXPECT_FALSE(c.InSync());
  b.Set(true);
  EXPECT_TRUE(c.InSync());
  EXPECT_TRUE(c.Inputs());

  a.Set(false);
  EXPECT_FALSE(c.InSync());
  EXPECT_FALSE(c.Inputs());
  EXPECT_TRUE(c.SelfSynced());
  a.Set(true);
  EXPECT_TRUE(c.InSync());

  c.Set(false);
  EXPECT_FALSE(c.InSync());
  EXPECT_TRUE(c.Inputs());
}

TEST(Synchronizable, TransitionsPropagateDownstreamInOrderWithinOneCall) {
  std::vector<std::string> log;
  Module a("a", &log), b("b", &log), c("c", &log), d("d", &log);
  // a -> b -> c, and a -> d connected after b.
  b.DependOn(&a);
  c.DependOn(&b);
  d.DependOn(&a);
  b.Set(true);
  c.Set(true);
  d.Set(true);
  EXPECT_THAT(log, IsEmpty());

  a.Set(true);
  EXPECT_THAT(
      log, ElementsAre("a synced", "a observer+", "b synced", "b observer+",
                       "c synced", "c observer+", "d synced", "d observer+"));
  log.clear();
  a.Set(false);
  EXPECT_THAT(log,
              ElementsAre("a lost", "a observer-", "b lost", "b observer-",
                          "c lost", "c observer-", "d lost", "d observer-"));
}

TEST(Synchronizable, HooksAndObserversRunOncePerTransition) {
  Module a("a");
  int observed_true = 0;
  int observed_false = 0;
  a.AddSyncObserver(
      [&](bool in_sync) { ++(in_sync ? observed_true : observed_false); });
  a.Set(false);  // Already out of sync: no transition.
  EXPECT_EQ(a.lost_calls, 0);
  a.Set(true);
  a.Set(true);
  EXPECT_EQ(a.synced_calls, 1);
  EXPECT_EQ(observed_true, 1);
  a.Set(false);
  a.Set(false);
  EXPECT_EQ(a.lost_calls, 1);
  EXPECT_EQ(observed_false, 1);
}

TEST(Synchronizable, DiamondJoinTransitionsOnce) {
  std::vector<std::string> log;
  Module a("a", &log), b("b", &log), c("c", &log), d("d", &log);
  b.DependOn(&a);
  c.DependOn(&a);
  d.DependOn(&b);
  d.DependOn(&c);
  b.Set(true);
  c.Set(true);
  d.Set(true);

  a.Set(true);
  EXPECT_EQ(d.synced_calls, 1);
  // d comes last: only once both of its inputs are in sync.
  EXPECT_THAT(
      log, ElementsAre("a synced", "a observer+", "b synced", "b observer+",
                       "c synced", "c observer+", "d synced", "d observer+"));
  a.Set(false);
  EXPECT_EQ(d.lost_calls, 1);
  EXPECT_FALSE(d.InSync());
  a.Set(true);
  EXPECT_EQ(d.synced_calls, 2);
}

TEST(Synchronizable, DependingOnTheSameInputTwiceIsANoOp) {
  Module a("a"), b("b");
  b.DependOn(&a);
  b.DependOn(&a);
  b.Set(true);
  EXPECT_FALSE(b.InSync());
  a.Set(true);
  EXPECT_EQ(b.synced_calls, 1);
  // One link only: removing it once frees b from a.
  b.StopDependingOn(&a);
  a.Set(false);
  EXPECT_TRUE(b.InSync());
  EXPECT_EQ(b.lost_calls, 0);
}

TEST(Synchronizable, StopDependingOnReevaluates) {
  Module a("a"), b("b");
  b.DependOn(&a);
  b.Set(true);
  EXPECT_FALSE(b.InSync());
  b.StopDependingOn(&a);
  EXPECT_TRUE(b.InSync());
  b.StopDependingOn(&a);  // Not an input any more: nothing happens.
  EXPECT_EQ(b.synced_calls, 1);
}

TEST(SynchronizableDeathTest, ACycleAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Module a("a"), b("b"), c("c");
  b.DependOn(&a);
  c.DependOn(&b);
  EXPECT_DEATH(a.DependOn(&c), "sync dependency cycle: a -> c");
  EXPECT_DEATH(a.DependOn(&a), "sync dependency cycle");
}

TEST(Synchronizable, DestroyingAModuleUnlinksIt) {
  Module a("a"), c("c");
  auto b = std::make_unique<Module>("b");
  b->DependOn(&a);
  c.DependOn(b.get());
  c.Set(true);
  b.reset();
  // a no longer reaches b; c no longer waits for it.
  a.Set(true);
  a.Set(false);
  c.Set(false);
  c.Set(true);
  EXPECT_TRUE(c.InSync());
  EXPECT_TRUE(c.Inputs());

  // An input destroyed first: its output forgets it.
  auto in = std::make_unique<Module>("in");
  Module out("out");
  out.DependOn(in.get());
  in.reset();
  out.Set(true);
  EXPECT_TRUE(out.InSync());
  // The links are gone on both sides: a new dependency works as usual.
  out.DependOn(&a);
  EXPECT_FALSE(out.InSync());
}

TEST(Synchronizable, InputsChangeHookMayChangeTheModulesOwnCondition) {
  std::vector<std::string> log;
  Module a("a", &log), t("t", &log), s("s", &log);
  s.DependOn(&t);
  s.Set(true);
  t.DependOn(&a);
  std::vector<bool> heard;
  // Like a transformer: its own condition is void while its inputs are out
  // of sync, and holds again only once it has done its work.
  t.on_inputs = [&](bool inputs_in_sync) {
    heard.push_back(inputs_in_sync);
    if (!inputs_in_sync) t.Set(false);
  };
  t.Set(true);
  a.Set(true);
  EXPECT_TRUE(t.InSync());
  EXPECT_TRUE(s.InSync());

  log.clear();
  heard.clear();
  a.Set(false);
  EXPECT_FALSE(t.SelfSynced());
  EXPECT_THAT(log, ElementsAre("a lost", "a observer-", "t lost", "t observer-",
                               "s lost", "s observer-"));
  a.Set(true);
  EXPECT_FALSE(t.InSync());  // Waits for its own condition again.
  t.Set(true);
  EXPECT_TRUE(s.InSync());
  EXPECT_THAT(heard, ElementsAre(false, true));
  EXPECT_EQ(t.lost_calls, 1);

  // A module that becomes ready as its inputs come back is in sync within
  // the same call, downstream included.
  t.on_inputs = [&](bool inputs_in_sync) { t.Set(inputs_in_sync); };
  a.Set(false);
  EXPECT_FALSE(s.InSync());
  a.Set(true);
  EXPECT_TRUE(t.InSync());
  EXPECT_TRUE(s.InSync());
}

TEST(Synchronizable, AChangeMadeWhileATransitionIsAnnouncedIsHeardAfterIt) {
  std::vector<std::string> log;
  Module a("a", &log), b("b", &log);
  b.DependOn(&a);
  b.Set(true);
  // The first observer (the module's own logging) runs before this one,
  // which reverses the transition it is told about; the observer added next
  // must still hear both transitions, in order.
  a.AddSyncObserver([&](bool in_sync) {
    if (in_sync) a.Set(false);
  });
  std::vector<bool> late;
  a.AddSyncObserver([&](bool in_sync) { late.push_back(in_sync); });

  a.Set(true);
  EXPECT_FALSE(a.InSync());
  EXPECT_FALSE(b.InSync());
  EXPECT_THAT(late, ElementsAre(true, false));
  EXPECT_THAT(log,
              ElementsAre("a synced", "a observer+", "b synced", "b observer+",
                          "a lost", "a observer-", "b lost", "b observer-"));
}

}  // namespace
}  // namespace setpoint
