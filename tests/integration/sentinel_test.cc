// RedisNodeRegistry behind Redis Sentinel: one master, two replicas and
// three redis-sentinel processes started by the test (RedisSentinelSet).
// Discovery, the ROLE confirmation, errors that name the sentinel and what
// it said, following a SIGKILLed master, and the cost of WAIT per grant.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/base/clock.h"
#include "setpoint/registry/redis_node_registry.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/child_process.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/redis_sentinel_set.h"
#include "setpoint/testing/redis_server.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint {
namespace {

using ::setpoint::testing::AwaitCondition;
using ::setpoint::testing::FreeLoopbackPort;
using ::setpoint::testing::IsOk;
using ::setpoint::testing::NullLogger;
using ::setpoint::testing::RedisCommandAt;
using ::setpoint::testing::RedisSentinelSet;
using ::setpoint::testing::RedisSentinelSetOptions;
using ::setpoint::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::unique_ptr<RedisNodeRegistry> SentinelRegistry(
    std::vector<std::string> sentinels, const std::string& master,
    RedisNodeRegistryOptions o = {}) {
  o.sentinels = std::move(sentinels);
  o.master_name = master;
  o.logger = NullLogger();
  o.reconnect_backoff = {.initial = absl::Milliseconds(5),
                         .max = absl::Milliseconds(50)};
  auto r = RedisNodeRegistry::Create(std::move(o));
  EXPECT_THAT(r.status(), IsOk());
  return r.ok() ? std::move(*r) : nullptr;
}

int PortOf(const std::string& address) {
  return std::stoi(address.substr(address.rfind(':') + 1));
}

// A fake sentinel on a loopback port: answers every command with the same
// address, so a test can make "the sentinels" name a replica.
class FakeSentinel {
 public:
  explicit FakeSentinel(const std::string& named) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(fd_, 8);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    std::string host = named.substr(0, named.rfind(':'));
    std::string port = named.substr(named.rfind(':') + 1);
    reply_ = absl::StrCat("*2\r\n$", host.size(), "\r\n", host, "\r\n$",
                          port.size(), "\r\n", port, "\r\n");
    thread_ = std::jthread([this](std::stop_token stop) { Serve(stop); });
  }
  ~FakeSentinel() {
    thread_.request_stop();
    thread_.join();
    close(fd_);
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  // Every connection at once (the registry's discovery and its
  // subscription to +switch-master may both be open): each request gets
  // the reply naming `named`.
  void Serve(std::stop_token stop) {
    std::vector<pollfd> fds{{fd_, POLLIN, 0}};
    while (!stop.stop_requested()) {
      for (pollfd& p : fds) p.revents = 0;
      if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
      std::vector<pollfd> next{fds[0]};
      for (size_t i = 1; i < fds.size(); ++i) {
        const int c = fds[i].fd;
        if (fds[i].revents == 0) {
          next.push_back(fds[i]);
          continue;
        }
        char buf[1024];
        if (read(c, buf, sizeof(buf)) > 0 &&
            send(c, reply_.data(), reply_.size(), MSG_NOSIGNAL) >= 0) {
          next.push_back(fds[i]);
        } else {
          close(c);
        }
      }
      if ((fds[0].revents & POLLIN) != 0) {
        const int c = accept(fd_, nullptr, nullptr);
        if (c >= 0) next.push_back({c, POLLIN, 0});
      }
      fds = std::move(next);
    }
    for (size_t i = 1; i < fds.size(); ++i) close(fds[i].fd);
  }
  int fd_ = -1;
  int port_ = 0;
  std::string reply_;
  std::jthread thread_;
};

class SentinelTest : public ::testing::Test {
 protected:
  void SetUp() override { SETPOINT_START_REDIS_OR_SKIP(redis_); }
  absl::StatusOr<PollResult> Poll(RedisNodeRegistry& r,
                                  std::vector<std::string> ids) {
    auto v = r.Poll(ctx_, {.kinds = {{"vm", std::move(ids)}},
                           .lease = absl::Seconds(3),
                           .min_version = version_});
    if (v.ok()) {
      epoch_ = v->epoch;
      version_ = std::max(version_, v->version);
    }
    return v;
  }
  // Lets grants through at once (tests of other things than the grace).
  void AllowGrants(RedisNodeRegistry& r) {
    ASSERT_THAT(RedisCommandAt(PortOf(redis_.master_address()),
                               {"SET", r.prefix() + ":grants_from", "0"})
                    .status(),
                IsOk());
  }

  RedisSentinelSet redis_;
  std::string epoch_;
  uint64_t version_ = 0;
  Context ctx_ = Context::Background();
};

TEST_F(SentinelTest, SentinelDiscoveryFindsTheMasterPastADeadSentinel) {
  // A dead sentinel first: discovery moves on to the next one, and the one
  // that answered goes to the front.
  std::vector<std::string> sentinels = redis_.sentinel_addresses();
  sentinels.insert(sentinels.begin(),
                   absl::StrCat("127.0.0.1:", FreeLoopbackPort()));
  auto r = SentinelRegistry(sentinels, redis_.master_name());
  ASSERT_THAT(Poll(*r, {"a/vm/0"}).status(), IsOk());
  EXPECT_EQ(r->master_address(), redis_.master_address());
  AllowGrants(*r);
  EXPECT_THAT(r->Grant(ctx_, "vm", "a/vm/0", {0, 16}, epoch_).status(), IsOk());
}

TEST_F(SentinelTest, SentinelsAllDownNamesEachOne) {
  const std::string a = absl::StrCat("127.0.0.1:", FreeLoopbackPort());
  const std::string b = absl::StrCat("127.0.0.1:", FreeLoopbackPort());
  auto r = SentinelRegistry({a, b}, redis_.master_name());
  auto v = Poll(*r, {"a/vm/0"});
  EXPECT_THAT(v.status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(v.status().message()),
              AllOf(HasSubstr("resolve master=setpoint"),
                    HasSubstr("sentinel=" + a), HasSubstr("sentinel=" + b)));
}

TEST_F(SentinelTest, SentinelThatDoesNotKnowTheNameOrIsNotASentinelIsNamed) {
  // A plain Redis in the list, and a master name nobody monitors.
  const std::string plain = redis_.server_addresses()[1];
  auto r = SentinelRegistry({plain, redis_.sentinel_addresses()[0]}, "nobody");
  auto v = Poll(*r, {"a/vm/0"});
  EXPECT_THAT(v.status(), StatusIs(absl::StatusCode::kUnavailable));
  const std::string msg(v.status().message());
  EXPECT_THAT(msg, HasSubstr("sentinel=" + plain + " said \"ERR unknown"));
  EXPECT_THAT(msg, HasSubstr("sentinel=" + redis_.sentinel_addresses()[0] +
                             " does not know the master name"));
  // The plain Redis first, then a real sentinel: discovery goes on.
  auto ok = SentinelRegistry({plain, redis_.sentinel_addresses()[1]},
                             redis_.master_name());
  EXPECT_THAT(Poll(*ok, {"a/vm/0"}).status(), IsOk());
}

TEST_F(SentinelTest, SentinelNamingAReplicaIsRefusedByRole) {
  const std::string replica = redis_.server_addresses()[1];
  FakeSentinel liar(replica);
  auto r = SentinelRegistry({liar.address()}, redis_.master_name());
  auto v = Poll(*r, {"a/vm/0"});
  EXPECT_THAT(v.status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(v.status().message()),
              AllOf(HasSubstr("confirm master=setpoint redis=" + replica),
                    HasSubstr("ROLE says \"slave\"")));
}

TEST_F(SentinelTest, SentinelFailoverIsFollowedWithANewEpoch) {
  auto r = SentinelRegistry(redis_.sentinel_addresses(), redis_.master_name());
  ASSERT_THAT(Poll(*r, {"a/vm/0"}).status(), IsOk());
  const std::string first_epoch = epoch_;
  const std::string old = redis_.KillMaster();
  absl::StatusOr<std::string> promoted =
      redis_.AwaitFailover(old, absl::Seconds(30));
  ASSERT_THAT(promoted.status(), IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return Poll(*r, {"a/vm/0"}).ok(); },
                             absl::Seconds(20)));
  EXPECT_EQ(r->master_address(), *promoted);
  // Another server run: the registry forgot nothing silently.
  EXPECT_NE(epoch_, first_epoch);
}

// What WAIT costs per grant on loopback: round trips and time, over the
// same registry and master, without and with grant_wait_replicas = 1.
TEST_F(SentinelTest, SentinelGrantWaitCostPerGrant) {
  constexpr int kGrants = 1000;
  double ms[2];
  int64_t trips[2];
  for (int wait = 0; wait < 2; ++wait) {
    auto r = SentinelRegistry(redis_.sentinel_addresses(), redis_.master_name(),
                              {.grant_wait_replicas = wait});
    const std::string id = absl::StrCat("w", wait, "/vm/0");
    ASSERT_THAT(Poll(*r, {id}).status(), IsOk());
    AllowGrants(*r);
    const uint32_t begin = 16 * static_cast<uint32_t>(wait);
    // Once before measuring: the first calls load the scripts.
    ASSERT_THAT(r->Grant(ctx_, "vm", id, {begin, begin + 16}, epoch_).status(),
                IsOk());
    ASSERT_THAT(r->Release(ctx_, "vm", id, Assignment{}), IsOk());
    const int64_t before = r->round_trips();
    const absl::Time start = Clock::Monotonic()->Now();
    for (int i = 0; i < kGrants; ++i) {
      // Release then grant again: a grant each time, a new token each time.
      ASSERT_THAT(r->Release(ctx_, "vm", id, Assignment{}), IsOk());
      ASSERT_THAT(
          r->Grant(ctx_, "vm", id, {begin, begin + 16}, epoch_).status(),
          IsOk());
    }
    const absl::Duration took = Clock::Monotonic()->Now() - start;
    trips[wait] = r->round_trips() - before;
    ms[wait] = absl::ToDoubleMilliseconds(took) / kGrants;
  }
  // One release and one grant per step; WAIT adds exactly one round trip.
  EXPECT_EQ(trips[0], 2 * kGrants);
  EXPECT_EQ(trips[1], 3 * kGrants);
  std::printf(
      "release+grant: %.3f ms and %.1f round trips without WAIT, "
      "%.3f ms and %.1f round trips with WAIT 1: WAIT costs %.3f ms "
      "per grant\n",
      ms[0], static_cast<double>(trips[0]) / kGrants, ms[1],
      static_cast<double>(trips[1]) / kGrants, ms[1] - ms[0]);
  RecordProperty("grant_ms_without_wait_us", static_cast<int>(ms[0] * 1000));
  RecordProperty("grant_ms_with_wait_us", static_cast<int>(ms[1] * 1000));
}

TEST_F(SentinelTest, SentinelGrantWaitForMoreReplicasThanExistFails) {
  auto r = SentinelRegistry(
      redis_.sentinel_addresses(), redis_.master_name(),
      {.grant_wait_replicas = 3, .grant_wait_timeout = absl::Milliseconds(50)});
  ASSERT_THAT(Poll(*r, {"a/vm/0"}).status(), IsOk());
  AllowGrants(*r);
  auto t = r->Grant(ctx_, "vm", "a/vm/0", {0, 16}, epoch_);
  EXPECT_THAT(t.status(), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(t.status().message()),
              HasSubstr("only 2 of 3 replicas acknowledged"));
}

// setpointctl finds the master through the sentinels as a pod does, and
// names the sentinels when it cannot.
TEST_F(SentinelTest, SentinelSetpointctlReadsTheRegistryThroughSentinels) {
  auto r = SentinelRegistry(redis_.sentinel_addresses(), redis_.master_name(),
                            {.ns = "ctl"});
  ASSERT_THAT(Poll(*r, {"a/vm/0"}).status(), IsOk());
  const std::string sentinels = absl::StrJoin(redis_.sentinel_addresses(), ",");
  testing::ChildProcess ok({SETPOINT_CTL, "--registry.type=redis",
                            "--registry.sentinels=" + sentinels,
                            "--registry.master_name=" + redis_.master_name(),
                            "--registry.namespace=ctl", "status"});
  EXPECT_EQ(ok.AwaitExit(), 0) << ok.err();
  EXPECT_THAT(ok.out(), HasSubstr("a/vm/0"));
  const std::string dead = absl::StrCat("127.0.0.1:", FreeLoopbackPort());
  testing::ChildProcess down({SETPOINT_CTL, "--registry.type=redis",
                              "--registry.sentinels=" + dead,
                              "--registry.master_name=" + redis_.master_name(),
                              "--registry.namespace=ctl", "status"});
  EXPECT_EQ(down.AwaitExit(), 1) << down.err();
  EXPECT_THAT(down.err(), AllOf(HasSubstr("via sentinels " + dead),
                                HasSubstr("sentinel=" + dead)));
}

TEST(SentinelOptionsTest, SentinelSettingsAreValidated) {
  auto bad = [](RedisNodeRegistryOptions o) {
    return std::string(ValidateRedisNodeRegistryOptions(o).message());
  };
  EXPECT_THAT(bad({.sentinels = {"127.0.0.1:26379"}}),
              HasSubstr("master_name must be set with sentinels"));
  EXPECT_THAT(bad({.master_name = "m"}),
              HasSubstr("master_name needs sentinels"));
  EXPECT_THAT(bad({.sentinels = {"unix:///tmp/s.sock"}, .master_name = "m"}),
              HasSubstr("a sentinel needs host:port"));
  EXPECT_THAT(bad({.sentinels = {"nope"}, .master_name = "m"}),
              HasSubstr("sentinels redis address \"nope\""));
  EXPECT_THAT(bad({.sentinels = {"127.0.0.1:26379"},
                   .master_name = "m",
                   .sentinel_username = "u"}),
              HasSubstr("sentinel_username needs a sentinel_password"));
  EXPECT_THAT(bad({.grant_wait_replicas = -1}),
              HasSubstr("grant_wait_replicas must be >= 0"));
  EXPECT_THAT(bad({.command_timeout = absl::Milliseconds(100),
                   .grant_wait_replicas = 1}),
              HasSubstr("grant_wait_timeout must be > 0 and shorter"));
  EXPECT_THAT(ValidateRedisNodeRegistryOptions(
                  {.sentinels = {"127.0.0.1:26379", "[::1]:26380"},
                   .master_name = "m"}),
              IsOk());
}

}  // namespace
}  // namespace setpoint
