// RedisNodeRegistry against a real redis-server started by the test.
#include <atomic>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "integration/redis_server.h"
#include "registry/redis/redis_client.h"
#include "setpoint/node/node_manager.h"
#include "setpoint/registry/redis_node_registry.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint {
namespace {

using ::setpoint::testing::AwaitCondition;
using ::setpoint::testing::IsOk;
using ::setpoint::testing::NullLogger;
using ::setpoint::testing::RedisServer;
using ::setpoint::testing::RedisServerOptions;
using ::setpoint::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

std::unique_ptr<RedisNodeRegistry> Registry(const std::string& address,
                                            RedisNodeRegistryOptions o = {}) {
  o.address = address;
  o.logger = NullLogger();
  o.reconnect_backoff = {.initial = absl::Milliseconds(5),
                         .max = absl::Milliseconds(50)};
  auto r = RedisNodeRegistry::Create(std::move(o));
  EXPECT_THAT(r.status(), IsOk());
  return r.ok() ? std::move(*r) : nullptr;
}

// Runs a raw command, for tests that write into our keys as someone else.
redis::RedisReply Raw(const std::string& address,
                      const std::vector<std::string>& argv,
                      const std::string& password = "") {
  auto endpoint = redis::ParseRedisAddress(address);
  RedisNodeRegistryOptions o{.password = password};
  redis::RedisClient client(*endpoint, o, NullLogger());
  auto reply = client.Command(argv);
  EXPECT_THAT(reply.status(), IsOk());
  return reply.ok() ? *reply : redis::RedisReply{};
}

class RedisRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override { SETPOINT_START_REDIS_OR_SKIP(server_); }
  absl::StatusOr<PollResult> Poll(RedisNodeRegistry& r,
                                  std::vector<std::string> ids,
                                  absl::Duration lease = absl::Seconds(3)) {
    auto v = r.Poll(ctx_, {.kinds = {{"vm", std::move(ids)}},
                           .lease = lease,
                           .min_version = version_});
    if (v.ok()) {
      epoch_ = v->epoch;
      version_ = std::max(version_, v->version);
    }
    return v;
  }
  // The epoch and highest version of the last poll, as a NodeManager keeps.
  std::string epoch_;
  uint64_t version_ = 0;
  RedisServer server_{RedisServerOptions{.tcp = true}};
  Context ctx_ = Context::Background();
};

TEST_F(RedisRegistryTest, SameProtocolAsInMemory) {
  auto r = Registry(server_.address());
  auto first = Poll(*r, {"b/vm/0", "a/vm/0"});
  ASSERT_THAT(first.status(), IsOk());
  EXPECT_THAT(first->kinds["vm"].members, ElementsAre("a/vm/0", "b/vm/0"));
  EXPECT_FALSE(first->epoch.empty());
  // A namespace seen for the first time refuses grants for one lease.
  EXPECT_THAT(r->Grant(ctx_, "vm", "a/vm/0", {0, 10}, epoch_).status(),
              StatusIs(absl::StatusCode::kAborted));
  Raw(server_.address(), {"SET", r->prefix() + ":grants_from", "0"});
  auto t1 = r->Grant(ctx_, "vm", "a/vm/0", {0, 100}, epoch_);
  ASSERT_THAT(t1.status(), IsOk());
  EXPECT_THAT(r->Grant(ctx_, "vm", "b/vm/0", {50, 200}, epoch_).status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("a/vm/0")));
  ASSERT_THAT(r->Release(ctx_, "vm", "a/vm/0", {{0, 50}, *t1}), IsOk());
  EXPECT_THAT(r->Release(ctx_, "vm", "a/vm/0", {{0, 60}, *t1}),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  auto t2 = r->Grant(ctx_, "vm", "b/vm/0", {50, 200}, epoch_);
  ASSERT_THAT(t2.status(), IsOk());
  EXPECT_GT(*t2, *t1);
  auto view = Poll(*r, {});
  ASSERT_THAT(view.status(), IsOk());
  EXPECT_EQ(view->kinds["vm"].held["a/vm/0"], (ShardAssignment{{0, 50}, *t1}));
  EXPECT_EQ(view->kinds["vm"].held["b/vm/0"],
            (ShardAssignment{{50, 200}, *t2}));
  EXPECT_EQ(view->epoch, first->epoch);
  EXPECT_THAT(r->Grant(ctx_, "vm", "ghost", {300, 400}, epoch_).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_THAT(r->Deregister(ctx_, "vm", {"a/vm/0"}), IsOk());
  view = Poll(*r, {});
  EXPECT_THAT(view->kinds["vm"].members, ElementsAre("b/vm/0"));
  EXPECT_FALSE(view->kinds["vm"].held.contains("a/vm/0"));
  // Keys carry the namespace's hash tag.
  auto keys = Raw(server_.address(), {"KEYS", "*"});
  for (const auto& k : keys.elements) {
    EXPECT_THAT(k.str, ::testing::StartsWith("{setpoint:default}:"));
  }
}

TEST_F(RedisRegistryTest, LeasesExpireOnTheServerClock) {
  auto r = Registry(server_.tcp_address());
  ASSERT_THAT(Poll(*r, {"a/vm/0"}, absl::Milliseconds(200)).status(), IsOk());
  ASSERT_TRUE(AwaitCondition([&] {
    auto v = Poll(*r, {"b/vm/0"}, absl::Seconds(5));
    return v.ok() && v->kinds["vm"].members.size() == 1;
  }));
}

TEST_F(RedisRegistryTest, NotifiesListenersOfChangesByOthers) {
  auto watcher = Registry(server_.address());
  auto writer = Registry(server_.address());
  std::atomic<int> changes{0};
  int64_t id = watcher->AddChangeListener([&] { ++changes; });
  // The subscription may take a moment; keep changing until one is heard.
  int n = 0;
  ASSERT_TRUE(AwaitCondition([&] {
    EXPECT_THAT(Poll(*writer, {"w/vm/" + std::to_string(n++)}).status(),
                IsOk());
    return changes.load() > 0;
  }));
  watcher->RemoveChangeListener(id);
}

TEST_F(RedisRegistryTest, UnreachableRedisIsUnavailableThenRecovers) {
  auto r = Registry(server_.address());
  ASSERT_THAT(Poll(*r, {"a/vm/0"}).status(), IsOk());
  server_.Stop();
  EXPECT_THAT(Poll(*r, {"a/vm/0"}).status(),
              StatusIs(absl::StatusCode::kUnavailable));
  ASSERT_THAT(server_.Start(), IsOk());
  // Empty memory: a new epoch, and scripts are loaded again (NOSCRIPT).
  ASSERT_TRUE(AwaitCondition([&] { return Poll(*r, {"a/vm/0"}).ok(); }));
}

TEST_F(RedisRegistryTest, PausedRedisTimesOut) {
  auto r =
      Registry(server_.address(), {.command_timeout = absl::Milliseconds(100)});
  ASSERT_THAT(Poll(*r, {"a/vm/0"}).status(), IsOk());
  server_.Pause();
  absl::Status s = Poll(*r, {"a/vm/0"}).status();
  server_.Resume();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s)) << s;
  ASSERT_TRUE(AwaitCondition([&] { return Poll(*r, {"a/vm/0"}).ok(); }));
}

TEST_F(RedisRegistryTest, GarbageInOurKeysIsRefusedClearlyNotACrash) {
  auto r = Registry(server_.address());
  ASSERT_THAT(Poll(*r, {"a/vm/0", "b/vm/0"}).status(), IsOk());
  Raw(server_.address(), {"SET", r->prefix() + ":grants_from", "0"});
  ASSERT_THAT(r->Grant(ctx_, "vm", "a/vm/0", {0, 10}, epoch_).status(), IsOk());
  const std::string held = r->prefix() + ":kind:vm:held";
  // A held value that does not parse: ignored in the view, and treated as
  // holding everything by grants.
  Raw(server_.address(), {"HSET", held, "a/vm/0", "not a range"});
  auto v = Poll(*r, {"a/vm/0", "b/vm/0"});
  ASSERT_THAT(v.status(), IsOk());
  EXPECT_FALSE(v->kinds["vm"].held.contains("a/vm/0"));
  EXPECT_THAT(r->Grant(ctx_, "vm", "b/vm/0", {100, 200}, epoch_).status(),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("parse")));
  // A key of the wrong type: a clear error naming it.
  const std::string members = r->prefix() + ":kind:vm:members";
  Raw(server_.address(), {"DEL", members});
  Raw(server_.address(), {"SET", members, "garbage"});
  EXPECT_THAT(Poll(*r, {"a/vm/0"}).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(members)));
  // Garbage in grants_from: a warning and one lease of no grants.
  Raw(server_.address(), {"DEL", members});
  Raw(server_.address(), {"SET", r->prefix() + ":grants_from", "soon"});
  ASSERT_THAT(Poll(*r, {"a/vm/0", "b/vm/0"}).status(), IsOk());
  EXPECT_THAT(r->Grant(ctx_, "vm", "b/vm/0", {100, 200}, epoch_).status(),
              StatusIs(absl::StatusCode::kAborted));
}

TEST(RedisAuthTest, PasswordAndAclUser) {
  RedisServer server(RedisServerOptions{
      .requirepass = "s3cret-pass",
      .acl_users = {"user ctrl on >ctrl-pass ~{setpoint:* &* +@all"}});
  SETPOINT_START_REDIS_OR_SKIP(server);
  Context ctx = Context::Background();
  PollRequest req{.kinds = {{"vm", {"a/vm/0"}}}};
  auto anonymous = Registry(server.address());
  absl::Status s = anonymous->Poll(ctx, req).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied));
  auto wrong = Registry(server.address(), {.password = "nope"});
  s = wrong->Poll(ctx, req).status();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("nope")));
  auto with_password = Registry(server.address(), {.password = "s3cret-pass"});
  EXPECT_THAT(with_password->Poll(ctx, req).status(), IsOk());
  auto acl =
      Registry(server.address(), {.username = "ctrl", .password = "ctrl-pass"});
  EXPECT_THAT(acl->Poll(ctx, req).status(), IsOk());
}

TEST(RedisOptionsTest, RefusesBadOptionsNamingTheField) {
  struct Case {
    RedisNodeRegistryOptions options;
    std::string field;
  };
  std::vector<Case> cases = {
      {{.address = "nohost"}, "address"},
      {{.address = "host:99999"}, "address"},
      {{.address = "::1:6379"}, "address"},
      {{.address = "unix://relative"}, "address"},
      {{.db = -1}, "db"},
      {{.ns = ""}, "ns"},
      {{.ns = "a}b"}, "ns"},
      {{.command_timeout = absl::ZeroDuration()}, "command_timeout"},
      {{.username = "u"}, "username"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(
        ValidateRedisNodeRegistryOptions(c.options),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field + " ")))
        << c.field;
  }
  EXPECT_THAT(ValidateRedisNodeRegistryOptions({.address = "[::1]:6379"}),
              IsOk());
  EXPECT_THAT(ValidateRedisNodeRegistryOptions({.address = "tcp://h:1"}),
              IsOk());
}

}  // namespace
}  // namespace setpoint

namespace setpoint {
namespace {

// A node that only remembers what it was told.
class QuietNode : public Node {
 public:
  absl::Status Run(const Context& ctx) override {
    (void)ctx.Wait(absl::InfiniteDuration());
    return absl::OkStatus();
  }
  void UpdateShardRange(const Context&, const ShardAssignment&) override {}
};

class RedisNodeManagerTest : public ::testing::Test {
 protected:
  void SetUp() override { SETPOINT_START_REDIS_OR_SKIP(server_); }
  NodeManager& StartPod(const std::string& pod,
                        absl::Duration lease = absl::Milliseconds(400)) {
    registries_.push_back(Registry(server_.address()));
    pods_.push_back(std::make_unique<NodeManager>(NodeManagerOptions{
        .pod_id = pod,
        .kinds = {{.kind = "vm",
                   .count = 2,
                   .ring_size = 64,
                   .factory =
                       [](const NodeInfo&) {
                         return std::make_unique<QuietNode>();
                       }}},
        .registry = registries_.back().get(),
        .poll_interval = absl::Milliseconds(50),
        .lease = lease,
        .operation_timeout = absl::Milliseconds(200),
        .logger = NullLogger(),
    }));
    EXPECT_THAT(pods_.back()->Start(), IsOk());
    return *pods_.back();
  }
  // The nodes of `pods` hold the whole ring between them.
  static bool Covered(const std::vector<NodeManager*>& pods) {
    uint32_t total = 0;
    for (NodeManager* p : pods) {
      for (const NodeState& n : p->Nodes()) total += n.active.range.size();
    }
    return total == 64;
  }
  static bool AllEmpty(NodeManager& pod) {
    for (const NodeState& n : pod.Nodes()) {
      if (!n.active.range.Empty()) return false;
    }
    return true;
  }
  void TearDown() override {
    for (auto& p : pods_) p->Stop();
  }
  RedisServer server_;
  std::vector<std::unique_ptr<RedisNodeRegistry>> registries_;
  std::vector<std::unique_ptr<NodeManager>> pods_;
};

TEST_F(RedisNodeManagerTest, RedisRestartMakesEveryoneStartOver) {
  NodeManager& a = StartPod("a");
  NodeManager& b = StartPod("b");
  ASSERT_TRUE(AwaitCondition([&] { return Covered({&a, &b}); }));
  ASSERT_THAT(server_.Restart(), IsOk());  // Empty memory: a new epoch.
  ASSERT_TRUE(AwaitCondition([&] {
    return a.stats().epoch_changes >= 1 && b.stats().epoch_changes >= 1;
  }));
  // Both fenced, then, one lease after the new epoch, share the ring again.
  ASSERT_TRUE(AwaitCondition([&] {
    return Covered({&a, &b}) && !AllEmpty(a) && !AllEmpty(b);
  }));
}

TEST_F(RedisNodeManagerTest, UnreachableRedisFencesEveryoneThenRecovers) {
  NodeManager& a = StartPod("a");
  NodeManager& b = StartPod("b");
  ASSERT_TRUE(AwaitCondition([&] { return Covered({&a, &b}); }));
  server_.Pause();  // Connections hang: every call times out.
  ASSERT_TRUE(AwaitCondition([&] { return AllEmpty(a) && AllEmpty(b); }));
  EXPECT_GE(a.stats().fences, 2);
  EXPECT_GE(b.stats().fences, 2);
  server_.Resume();
  ASSERT_TRUE(AwaitCondition([&] {
    return Covered({&a, &b}) && !AllEmpty(a) && !AllEmpty(b);
  }));
}

TEST_F(RedisNodeManagerTest, GracefulLeaveHandsOverAtOnce) {
  // A long lease: a takeover that waited for it would take 3 s or more.
  NodeManager& a = StartPod("a", absl::Seconds(3));
  NodeManager& b = StartPod("b", absl::Seconds(3));
  ASSERT_TRUE(AwaitCondition([&] { return Covered({&a, &b}); }));
  b.Stop();
  // Well under one lease: the release is published, not waited out (a few
  // milliseconds here; the bound leaves room for sanitizer builds).
  ASSERT_TRUE(AwaitCondition([&] { return Covered({&a}); }, absl::Seconds(1)));
}

}  // namespace
}  // namespace setpoint
