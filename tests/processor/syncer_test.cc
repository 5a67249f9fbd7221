#include "setpoint/processor/syncer.h"

#include <string>

#include "absl/container/flat_hash_map.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/base/mutex.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/store.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/run_on_runner.h"

namespace setpoint {
namespace {

using ::setpoint::testing::AwaitCondition;
using ::setpoint::testing::NullLogger;
using ::setpoint::testing::RunOnRunner;

// A world of ints; every change is pushed back to the observed store on the
// runner, as a watch would.
class IntWorld : public SyncerClient<std::string, int, int> {
 public:
  explicit IntWorld(Runner* runner, Store<std::string, int>* store)
      : runner_(runner), store_(store) {}
  absl::Status Create(const Context&, const std::string& key,
                      const int& desired) override {
    return Write(key, desired);
  }
  absl::Status Update(const Context&, const std::string& key,
                      const int& desired, const int&) override {
    return Write(key, desired);
  }
  absl::Status Delete(const Context&, const std::string& key,
                      const int&) override {
    {
      MutexLock l(&mu_);
      ++calls_;
      world_.erase(key);
    }
    (void)runner_->Post([this, key] { store_->Delete(key); });
    return absl::OkStatus();
  }
  int calls() {
    MutexLock l(&mu_);
    return calls_;
  }
  absl::flat_hash_map<std::string, int> world() {
    MutexLock l(&mu_);
    return world_;
  }

 private:
  absl::Status Write(const std::string& key, int value) {
    {
      MutexLock l(&mu_);
      ++calls_;
      world_[key] = value;
    }
    (void)runner_->Post([this, key, value] { store_->Set(key, value); });
    return absl::OkStatus();
  }
  Runner* runner_;
  Store<std::string, int>* store_;
  Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int> world_ ABSL_GUARDED_BY(mu_);
};

TEST(SyncerTest, CreatesUpdatesAndDeletesToMatchDesired) {
  Runner runner({.name = "t", .logger = NullLogger()});
  Store<std::string, int> store({.logger = NullLogger()});
  IntWorld world(&runner, &store);
  Syncer<std::string, int, int> syncer(&runner, &world,
                                       {.logger = NullLogger()});
  syncer.ObserveFrom(&store);
  syncer.MarkDesiredComplete();
  store.MarkSynced();
  ASSERT_TRUE(syncer.Start().ok());
  ASSERT_TRUE(runner.Start().ok());
  ASSERT_TRUE(RunOnRunner(runner, [&] {
    syncer.SetDesired("a", 1);
    syncer.SetDesired("b", 2);
  }));
  ASSERT_TRUE(AwaitCondition([&] { return world.world().size() == 2; }));
  ASSERT_TRUE(RunOnRunner(runner, [&] {
    syncer.SetDesired("a", 5);
    syncer.DeleteDesired("b");
  }));
  ASSERT_TRUE(AwaitCondition([&] {
    auto w = world.world();
    return w.size() == 1 && w.contains("a") && w["a"] == 5;
  }));
  ASSERT_TRUE(AwaitCondition([&] {
    auto s = RunOnRunner(runner, [&] { return syncer.StatusSnapshot(); });
    return s.has_value() && s->converged == 1 && s->keys == 1;
  }));
  EXPECT_EQ(world.calls(), 4);
  SyncerCounters c = syncer.counters();
  EXPECT_EQ(c.creates, 2);
  EXPECT_EQ(c.updates, 1);
  EXPECT_EQ(c.deletes, 1);
  syncer.Stop();
  runner.Stop();
}

}  // namespace
}  // namespace setpoint
