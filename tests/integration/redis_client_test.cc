// RedisClient's reads of pushed messages (a subscribed connection) against
// a real redis-server: a message is delivered, and a readable wake
// descriptor ends a read at once, long before its timeout (a registry's
// reader threads stop that way when it is destroyed, so a pod's exit does
// not wait out their timeout).
#include "registry/redis/redis_client.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>

#include "gtest/gtest.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/redis_server.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint {
namespace {

using ::setpoint::testing::IsOk;
using ::setpoint::testing::NullLogger;
using ::setpoint::testing::RedisServer;

class RedisClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SETPOINT_START_REDIS_OR_SKIP(server_);
    wake_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    ASSERT_GE(wake_, 0);
  }
  void TearDown() override {
    if (wake_ >= 0) close(wake_);
  }
  redis::RedisClient Client() {
    return redis::RedisClient(*redis::ParseRedisAddress(server_.address()), {},
                              NullLogger());
  }

  RedisServer server_;
  int wake_ = -1;
};

TEST_F(RedisClientTest, AMessageIsReadWithAWakeDescriptorGiven) {
  redis::RedisClient sub = Client();
  ASSERT_THAT(sub.Command({"SUBSCRIBE", "ch"}).status(), IsOk());
  redis::RedisClient pub = Client();
  ASSERT_THAT(pub.Command({"PUBLISH", "ch", "hello"}).status(), IsOk());
  absl::StatusOr<redis::RedisReply> msg =
      sub.ReadPushed(absl::Seconds(30), wake_);
  ASSERT_THAT(msg.status(), IsOk());
  ASSERT_EQ(msg->type, redis::RedisReply::Type::kArray);
  ASSERT_EQ(msg->elements.size(), 3u);
  EXPECT_EQ(msg->elements[2].str, "hello");
}

TEST_F(RedisClientTest, AReadableWakeDescriptorEndsTheReadAtOnce) {
  redis::RedisClient sub = Client();
  ASSERT_THAT(sub.Command({"SUBSCRIBE", "ch"}).status(), IsOk());
  const uint64_t one = 1;
  ASSERT_EQ(write(wake_, &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<redis::RedisReply> msg =
      sub.ReadPushed(absl::Seconds(30), wake_);
  // Nothing was published: the read ends empty, and not after its 30 s.
  ASSERT_THAT(msg.status(), IsOk());
  EXPECT_NE(msg->type, redis::RedisReply::Type::kArray);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  // The connection is still subscribed: a later message arrives.
  redis::RedisClient pub = Client();
  ASSERT_THAT(pub.Command({"PUBLISH", "ch", "later"}).status(), IsOk());
  absl::StatusOr<redis::RedisReply> later = sub.ReadPushed(absl::Seconds(30));
  ASSERT_THAT(later.status(), IsOk());
  ASSERT_EQ(later->type, redis::RedisReply::Type::kArray);
  EXPECT_EQ(later->elements[2].str, "later");
}

}  // namespace
}  // namespace setpoint
