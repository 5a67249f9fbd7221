#include "setpoint/base/mutex.h"

#include <thread>

#include "gtest/gtest.h"
#include "setpoint/base/check.h"

namespace setpoint {
namespace {

TEST(Mutex, GuardsSharedStateAcrossThreads) {
  Mutex mu;
  CondVar cv;
  int counter = 0;
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 1000; ++i) {
          MutexLock l(&mu);
          ++counter;
          cv.SignalAll();
        }
      });
    }
    MutexLock l(&mu);
    EXPECT_TRUE(cv.Wait(&mu, {}, [&] { return counter == 4000; }));
  }
  EXPECT_EQ(counter, 4000);
}

TEST(CondVar, WaitIsCutShortByStop) {
  Mutex mu;
  CondVar cv;
  std::stop_source stop;
  bool result = true;
  std::jthread t([&] {
    MutexLock l(&mu);
    result = cv.Wait(&mu, stop.get_token(), [] { return false; });
  });
  stop.request_stop();
  t.join();
  EXPECT_FALSE(result);
}

TEST(ThreadChecker, BindsToTheFirstThreadUntilDetached) {
  ThreadChecker checker;
  EXPECT_TRUE(checker.CalledOnValidThread());
  bool other = true;
  std::thread([&] { other = checker.CalledOnValidThread(); }).join();
#ifdef NDEBUG
  EXPECT_TRUE(other);  // Release builds do not check.
#else
  EXPECT_FALSE(other);
#endif
  checker.Detach();
  std::thread([&] { other = checker.CalledOnValidThread(); }).join();
  EXPECT_TRUE(other);
}

TEST(CheckDeathTest, FailedCheckAbortsWithTheCondition) {
  // Re-executes the binary for the child: safe with the threads that other
  // tests (and sanitizers) leave behind.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  int n = -1;
  EXPECT_DEATH(SETPOINT_CHECK_MSG(n >= 0, "negative count n={}", n),
               "check failed.*n >= 0.*negative count n=-1");
  EXPECT_DEATH(SETPOINT_CHECK(n == 0), "check failed.*n == 0");
}

}  // namespace
}  // namespace setpoint
