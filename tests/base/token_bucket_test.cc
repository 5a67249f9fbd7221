#include "setpoint/base/token_bucket.h"

#include "gtest/gtest.h"

namespace setpoint {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(TokenBucketTest, StartsFullThenRefillsAtTheRate) {
  TokenBucket b(/*rate=*/2, /*burst=*/3);
  EXPECT_TRUE(b.Take(kT0));
  EXPECT_TRUE(b.Take(kT0));
  EXPECT_TRUE(b.Take(kT0));
  EXPECT_FALSE(b.Take(kT0));
  EXPECT_EQ(b.NextToken(kT0), kT0 + absl::Milliseconds(500));
  EXPECT_FALSE(b.Take(kT0 + absl::Milliseconds(499)));
  EXPECT_TRUE(b.Take(kT0 + absl::Milliseconds(500)));
  // Never more than the burst, however long it waited.
  const absl::Time later = kT0 + absl::Hours(1);
  int taken = 0;
  while (b.Take(later)) ++taken;
  EXPECT_EQ(taken, 3);
}

TEST(TokenBucketTest, RateZeroIsUnlimitedAndBurstAtLeastOne) {
  TokenBucket unlimited(0, 1);
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(unlimited.Take(kT0));
  EXPECT_TRUE(unlimited.unlimited());
  TokenBucket tiny(1, 0);
  EXPECT_EQ(tiny.burst(), 1);
  EXPECT_TRUE(tiny.Take(kT0));
  EXPECT_FALSE(tiny.Take(kT0));
}

TEST(TokenBucketTest, AClockThatStepsBackTakesNothingExtra) {
  TokenBucket b(1, 1);
  EXPECT_TRUE(b.Take(kT0));
  EXPECT_FALSE(b.Take(kT0 - absl::Seconds(10)));
  EXPECT_TRUE(b.Take(kT0 + absl::Seconds(1)));
}

}  // namespace
}  // namespace setpoint
