// The real setpointctl binary, run as a process against a real redis-server
// that NodeManagers (in this process) populate.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "registry/redis/redis_client.h"
#include "setpoint/node/node_manager.h"
#include "setpoint/registry/redis_node_registry.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/child_process.h"
#include "setpoint/testing/idle_node.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/redis_server.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint {
namespace {

using ::setpoint::testing::AwaitCondition;
using ::setpoint::testing::IsOk;
using ::setpoint::testing::NullLogger;
using ::setpoint::testing::RedisServer;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kNamespace[] = "ctltest";
constexpr uint32_t kRing = 64;

// True when a line of `text` matches `pattern` (ECMAScript).
bool HasLine(const std::string& text, const std::string& pattern) {
  std::regex re(pattern);
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (std::regex_search(line, re)) return true;
  }
  return false;
}

// A setpointctl process with its stdout and stderr on pipes.
class CtlProcess : public testing::ChildProcess {
 public:
  explicit CtlProcess(const std::vector<std::string>& flags)
      : ChildProcess(Args(flags)) {}

  // Reads both pipes until a line of stdout matches `pattern`.
  bool AwaitLine(const std::string& pattern,
                 absl::Duration timeout = absl::Seconds(20)) {
    return ReadUntil([&] { return HasLine(out(), pattern); }, timeout);
  }

 private:
  static std::vector<std::string> Args(const std::vector<std::string>& flags) {
    std::vector<std::string> args = {SETPOINT_CTL};
    args.insert(args.end(), flags.begin(), flags.end());
    return args;
  }
};

struct CtlRun {
  int code;
  std::string out;
  std::string err;
};

using QuietNode = ::setpoint::testing::IdleNode;

class SetpointctlTest : public ::testing::Test {
 protected:
  void SetUp() override { SETPOINT_START_REDIS_OR_SKIP(server_); }
  void TearDown() override {
    for (auto& p : pods_) p->Stop();
  }

  NodeManager& StartPod(const std::string& pod, int count) {
    auto registry = RedisNodeRegistry::Create({.address = server_.address(),
                                               .ns = kNamespace,
                                               .logger = NullLogger()});
    EXPECT_THAT(registry.status(), IsOk());
    registries_.push_back(std::move(*registry));
    pods_.push_back(std::make_unique<NodeManager>(NodeManagerOptions{
        .pod_id = pod,
        .kinds = {{.kind = "vm",
                   .count = count,
                   .ring_size = kRing,
                   .factory =
                       [](const NodeInfo&) {
                         return std::make_unique<QuietNode>();
                       }}},
        .registry = registries_.back().get(),
        .poll_interval = absl::Milliseconds(50),
        .lease = absl::Milliseconds(500),
        .operation_timeout = absl::Milliseconds(200),
        .logger = NullLogger(),
    }));
    EXPECT_THAT(pods_.back()->Start(), IsOk());
    return *pods_.back();
  }

  // The registry flags of every command here.
  std::vector<std::string> Registry() const {
    return {"--registry.type=redis", "--registry.address=" + server_.address(),
            absl::StrCat("--registry.namespace=", kNamespace)};
  }

  CtlRun Ctl(std::vector<std::string> args, bool registry_flags = true) {
    std::vector<std::string> flags;
    if (registry_flags) flags = Registry();
    flags.insert(flags.end(), args.begin(), args.end());
    CtlProcess p(flags);
    int code = p.AwaitExit();
    return CtlRun{code, p.out(), p.err()};
  }

  // `nodes` live nodes of these pods, the ring split evenly between them.
  static bool Balanced(const std::vector<NodeManager*>& pods, int nodes) {
    uint32_t total = 0;
    int active = 0;
    for (NodeManager* pod : pods) {
      for (const NodeState& n : pod->Nodes()) {
        if (n.active.range.Empty()) continue;
        ++active;
        total += n.active.range.size();
        if (n.active.range.size() + 1 < kRing / nodes ||
            n.active.range.size() > kRing / nodes + 1) {
          return false;
        }
      }
    }
    return active == nodes && total == kRing;
  }
  static bool AllEmpty(NodeManager& pod) {
    for (const NodeState& n : pod.Nodes()) {
      if (!n.active.range.Empty()) return false;
    }
    return true;
  }

  RedisServer server_;
  std::vector<std::unique_ptr<RedisNodeRegistry>> registries_;
  std::vector<std::unique_ptr<NodeManager>> pods_;
};

// The table row of a node: its pod, state, range, share and token.
std::string Row(const NodeState& n, const std::string& pod,
                const std::string& state, const std::string& share) {
  return absl::StrCat(n.id, " +", pod, " +", state, " +",
                      std::regex_replace(n.active.range.ToString(),
                                         std::regex(R"([\[\)+])"), R"(\$&)"),
                      " +", share, "% +", n.active.token, " +[0-9.]+m?s");
}

TEST_F(SetpointctlTest, StatusShowsEveryNodeAsTheManagersSeeIt) {
  NodeManager& a = StartPod("a", 2);
  NodeManager& b = StartPod("b", 2);
  ASSERT_TRUE(AwaitCondition([&] { return Balanced({&a, &b}, 4); }));
  CtlRun r = Ctl({"status"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  EXPECT_THAT(r.out, StartsWith(absl::StrCat("registry ", server_.address(),
                                             " namespace ", kNamespace, "\n")));
  EXPECT_THAT(r.out, HasSubstr("grants   open"));
  EXPECT_THAT(r.out, HasSubstr("kind vm  ring 64"));
  EXPECT_THAT(r.out, HasSubstr("  unowned: none\n"));
  for (NodeManager* pod : {&a, &b}) {
    for (const NodeState& n : pod->Nodes()) {
      EXPECT_TRUE(HasLine(r.out, Row(n, pod->pod_id(), "active", "25.0")))
          << Row(n, pod->pod_id(), "active", "25.0") << "\n"
          << r.out;
    }
  }
  EXPECT_TRUE(HasLine(r.out, R"(^  a +vm +active +2 +32 +-$)")) << r.out;
  EXPECT_TRUE(HasLine(r.out, R"(^  b +vm +active +2 +32 +-$)")) << r.out;
  EXPECT_THAT(r.out, Not(HasSubstr("warnings")));

  CtlRun j = Ctl({"status", "--json"});
  ASSERT_EQ(j.code, 0) << j.err;
  EXPECT_THAT(j.out, StartsWith("{\"address\":"));
  EXPECT_EQ(CtlProcess::Count(j.out, "\n"), 1);
  EXPECT_THAT(j.out, HasSubstr(absl::StrCat("\"namespace\":\"", kNamespace,
                                            "\",\"epoch\":\"")));
  EXPECT_THAT(j.out, HasSubstr("\"grants_refused_for_ms\":0,"
                               "\"all_drained\":false"));
  EXPECT_THAT(j.out, HasSubstr("{\"pod\":\"a\",\"state\":\"active\","
                               "\"drained\":false,\"drained_since\":null,"
                               "\"nodes\":2,\"kinds\":[{\"kind\":\"vm\","
                               "\"nodes\":2,\"shards\":32}]}"));
  EXPECT_THAT(j.out, HasSubstr("\"kind\":\"vm\",\"ring_size\":64,"
                               "\"ring_size_recorded\":true"));
  for (NodeManager* pod : {&a, &b}) {
    for (const NodeState& n : pod->Nodes()) {
      EXPECT_THAT(j.out,
                  HasSubstr(absl::StrCat(
                      "{\"id\":\"", n.id, "\",\"pod\":\"", pod->pod_id(),
                      "\",\"state\":\"active\",\"range\":[",
                      n.active.range.Hull().begin, ",",
                      n.active.range.Hull().end, "],\"shards\":",
                      n.active.range.RunsJson(), ",\"token\":", n.active.token,
                      ",\"share_percent\":25.000,\"lease_expires_in_ms\":")));
    }
  }
  EXPECT_THAT(j.out, HasSubstr("\"unowned\":[],\"unowned_shards\":0}],"
                               "\"warnings\":[]}"));
}

TEST_F(SetpointctlTest, DrainHandsThePodsShardsOverAndUndrainGivesThemBack) {
  NodeManager& a = StartPod("a", 2);
  NodeManager& b = StartPod("b", 2);
  ASSERT_TRUE(AwaitCondition([&] { return Balanced({&a, &b}, 4); }));
  CtlRun d = Ctl({"drain", "b"});
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_THAT(d.out, HasSubstr("pod b drained"));
  EXPECT_THAT(d.out, Not(HasSubstr("every pod is drained")));
  ASSERT_TRUE(AwaitCondition([&] { return Balanced({&a}, 2) && AllEmpty(b); }));
  EXPECT_TRUE(b.stats().drained);
  CtlRun s = Ctl({"status"});
  ASSERT_EQ(s.code, 0) << s.err;
  for (const NodeState& n : b.Nodes()) {
    EXPECT_TRUE(HasLine(
        s.out, absl::StrCat(n.id, " +b +drained +- +0.0% +- +[0-9.]+m?s$")))
        << s.out;
  }
  for (const NodeState& n : a.Nodes()) {
    EXPECT_TRUE(HasLine(s.out, Row(n, "a", "active", "50.0"))) << s.out;
  }
  EXPECT_TRUE(HasLine(s.out, R"(^  b +vm +drained +2 +0 +20\d\d-)")) << s.out;
  EXPECT_THAT(s.out, HasSubstr("  unowned: none\n"));
  CtlRun j = Ctl({"status", "--json=true"});
  ASSERT_EQ(j.code, 0) << j.err;
  EXPECT_THAT(j.out, HasSubstr("{\"pod\":\"b\",\"state\":\"drained\","
                               "\"drained\":true,\"drained_since\":\"20"));
  EXPECT_THAT(j.out, HasSubstr("\"all_drained\":false"));

  // Every pod drained: nobody owns anything, and status says so.
  d = Ctl({"drain", "a"});
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_THAT(d.out, HasSubstr("every pod is drained"));
  ASSERT_TRUE(AwaitCondition([&] { return AllEmpty(a) && AllEmpty(b); }));
  s = Ctl({"status"});
  ASSERT_EQ(s.code, 0) << s.err;
  EXPECT_THAT(s.out, HasSubstr("EVERY POD: nobody owns anything"));
  EXPECT_THAT(s.out, HasSubstr("  unowned: [0,64) (64 shards, 100.0%)\n"));
  j = Ctl({"status", "--json"});
  EXPECT_THAT(j.out, HasSubstr("\"all_drained\":true"));
  EXPECT_THAT(j.out, HasSubstr("\"unowned\":[[0,64]],\"unowned_shards\":64"));

  CtlRun u = Ctl({"undrain", "a"});
  ASSERT_EQ(u.code, 0) << u.err;
  u = Ctl({"undrain", "b"});
  ASSERT_EQ(u.code, 0) << u.err;
  EXPECT_THAT(u.out, HasSubstr("pod b undrained"));
  ASSERT_TRUE(AwaitCondition([&] { return Balanced({&a, &b}, 4); }));
  EXPECT_FALSE(b.stats().drained);
}

TEST_F(SetpointctlTest, DrainOfAPodThatHasNotJoinedWaitsForIt) {
  NodeManager& a = StartPod("a", 1);
  ASSERT_TRUE(AwaitCondition([&] { return Balanced({&a}, 1); }));
  CtlRun d = Ctl({"drain", "later"});
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_THAT(d.out, HasSubstr("pod later has no live node"));
  NodeManager& later = StartPod("later", 1);
  ASSERT_TRUE(AwaitCondition([&] { return later.stats().drained; }));
  CtlRun s = Ctl({"status"});
  EXPECT_TRUE(HasLine(s.out, R"(^  later +vm +drained +1 +0 )")) << s.out;
  EXPECT_TRUE(Balanced({&a}, 1));
  EXPECT_TRUE(AllEmpty(later));
}

TEST_F(SetpointctlTest, WatchRedrawsWhenOwnershipChangesAndStopsOnSignal) {
  NodeManager& a = StartPod("a", 1);
  NodeManager& b = StartPod("b", 1);
  ASSERT_TRUE(AwaitCondition([&] { return Balanced({&a, &b}, 2); }));
  std::vector<std::string> flags = Registry();
  flags.insert(flags.end(), {"watch", "--interval=20ms"});
  CtlProcess watch(flags);
  ASSERT_TRUE(watch.AwaitOut("\npods\n")) << watch.err();
  // Leases are renewed all the time, and nothing else changes: 300 ms of
  // looks every 20 ms bring no redraw.
  EXPECT_FALSE(watch.AwaitOut("\npods\n", 2, absl::Milliseconds(300)))
      << watch.out();
  CtlRun d = Ctl({"drain", "b"});
  ASSERT_EQ(d.code, 0) << d.err;
  // Draining (still holding), then drained: at least one redraw shows it.
  ASSERT_TRUE(watch.AwaitLine(R"(^  b +vm +drained +1 +0 +20)")) << watch.out();
  watch.Signal(SIGTERM);
  EXPECT_EQ(watch.AwaitExit(), 0) << watch.err();
  // --count stops it by itself.
  flags = Registry();
  flags.insert(flags.end(), {"watch", "--json", "--count=1"});
  CtlProcess once(flags);
  EXPECT_EQ(once.AwaitExit(), 0) << once.err();
  EXPECT_EQ(CtlProcess::Count(once.out(), "{\"address\""), 1);
  EXPECT_THAT(once.out(), HasSubstr("\"pod\":\"b\",\"state\":\"drained\""));
}

TEST_F(SetpointctlTest, ConfigFileGivesTheRegistryLikeAPods) {
  NodeManager& a = StartPod("a", 1);
  ASSERT_TRUE(AwaitCondition([&] { return Balanced({&a}, 1); }));
  const std::string path = ::testing::TempDir() + "/setpointctl_test_" +
                           std::to_string(getpid()) + ".yaml";
  std::ofstream(path) << "pod_id: ignored\nkinds:\n  - {kind: vm, count: 3}\n"
                      << "registry:\n  type: redis\n  address: "
                      << server_.address() << "\n  namespace: " << kNamespace
                      << "\n";
  CtlRun r = Ctl({"--config=" + path, "status"}, /*registry_flags=*/false);
  std::filesystem::remove(path);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(absl::StrCat("namespace ", kNamespace)));
  EXPECT_TRUE(HasLine(r.out, R"(^  a/vm/0 +a +active +\[0,64\) +100\.0%)"))
      << r.out;
}

TEST_F(SetpointctlTest, ExitCodesAndOneLineErrors) {
  // 1: the registry cannot be reached; the message names it and the error.
  const std::string nowhere =
      "unix://" + ::testing::TempDir() + "/nowhere.sock";
  CtlRun r = Ctl({"--registry.type=redis", "--registry.address=" + nowhere,
                  "--registry.connect_timeout=200ms", "status"},
                 /*registry_flags=*/false);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err,
              AllOf(StartsWith("setpointctl: registry " + nowhere),
                    HasSubstr("namespace default"), HasSubstr("No such file")));
  EXPECT_EQ(CtlProcess::Count(r.err, "\n"), 1) << r.err;
  EXPECT_THAT(r.out, IsEmpty());
  r = Ctl(
      {"--registry.type=redis", "--registry.address=" + nowhere, "drain", "b"},
      /*registry_flags=*/false);
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("drain pod=b"));
  // 2: usage and configuration, naming the flag.
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  std::vector<Case> cases = {
      {{"--bogus=1", "status"}, "unknown flag --bogus"},
      {{"status", "--registry.db=x"}, "registry.db"},
      {{"status", "--interval=soon"}, "--interval"},
      {{"watch", "--count=-1"}, "--count"},
      {{"status", "--json=maybe"}, "--json"},
      {{"--registry.password", "status"}, "--registry.password needs a value"},
      {{}, "no command"},
      {{"stat"}, "unknown command \"stat\""},
      {{"drain"}, "drain takes one pod id"},
      {{"drain", "a/vm/0"}, "pod id"},
      {{"status", "extra"}, "status takes no arguments"},
      {{"--config=/nonexistent/pod.yaml", "status"}, "/nonexistent/pod.yaml"},
  };
  for (const Case& c : cases) {
    CtlRun bad = Ctl(c.args);
    EXPECT_EQ(bad.code, 2) << c.message << ": " << bad.err;
    EXPECT_THAT(bad.err,
                AllOf(StartsWith("setpointctl: "), HasSubstr(c.message)));
    EXPECT_EQ(CtlProcess::Count(bad.err, "\n"), 1) << bad.err;
  }
  r = Ctl({"status"}, /*registry_flags=*/false);
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--registry.type=redis"));
  r = Ctl({"--help"}, /*registry_flags=*/false);
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, AllOf(StartsWith("usage: setpointctl"),
                           HasSubstr("drain <pod>"), HasSubstr("Exit codes")));
}

// Runs a raw command, to write into our keys as someone else would.
redis::RedisReply Raw(const std::string& address,
                      const std::vector<std::string>& argv) {
  auto endpoint = redis::ParseRedisAddress(address);
  redis::RedisClient client(*endpoint, RedisNodeRegistryOptions{},
                            NullLogger());
  auto reply = client.Command(argv);
  EXPECT_THAT(reply.status(), IsOk());
  return reply.ok() ? *reply : redis::RedisReply{};
}

TEST_F(SetpointctlTest, OddRegistryContentsAreWarningsNotACrash) {
  NodeManager& a = StartPod("a", 1);
  ASSERT_TRUE(AwaitCondition([&] { return Balanced({&a}, 1); }));
  const std::string prefix = absl::StrCat("{setpoint:", kNamespace, "}");
  // Someone else's drain flag whose time does not parse, a held record
  // without a member, a member that is not a node id.
  Raw(server_.address(), {"HSET", prefix + ":drained", "x", "yes please"});
  Raw(server_.address(),
      {"HSET", prefix + ":kind:vm:held", "ghost/vm/0", "0 64 1"});
  Raw(server_.address(),
      {"ZADD", prefix + ":kind:vm:members", "+inf", "not-an-id"});
  CtlRun r = Ctl({"status"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(
      HasLine(r.out, R"(^  x +- +drained \(no nodes\) +0 +0 +unknown$)"))
      << r.out;
  EXPECT_TRUE(HasLine(r.out, R"(^  a/vm/0 +a +active +\[0,64\) +100\.0%)"))
      << r.out;
  EXPECT_TRUE(
      HasLine(r.out, R"(^  not-an-id +not-an-id +active +- .* forever$)"))
      << r.out;
  EXPECT_THAT(r.out, HasSubstr("\nwarnings\n"));
  EXPECT_TRUE(HasLine(r.out, R"(^  .*pod "x" holds "yes please")")) << r.out;
  EXPECT_TRUE(HasLine(r.out, R"(^  .*"ghost/vm/0", which is not a member)"))
      << r.out;
  EXPECT_TRUE(HasLine(r.out, R"(^  .*member "not-an-id" is not)")) << r.out;
  CtlRun j = Ctl({"status", "--json"});
  ASSERT_EQ(j.code, 0) << j.err;
  EXPECT_THAT(j.out, HasSubstr("{\"pod\":\"x\",\"state\":\"drained (no "
                               "nodes)\",\"drained\":true,"
                               "\"drained_since\":null"));
  EXPECT_THAT(j.out, HasSubstr("\\\"yes please\\\""));
  // A drain record of another type: a clear error naming the key, exit 1.
  Raw(server_.address(), {"DEL", prefix + ":drained"});
  Raw(server_.address(), {"SET", prefix + ":drained", "x"});
  r = Ctl({"status"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr(prefix + ":drained"),
                           HasSubstr("holds a string")));
  r = Ctl({"undrain", "x"});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr(prefix + ":drained"));
  Raw(server_.address(), {"DEL", prefix + ":drained"});
}

}  // namespace
}  // namespace setpoint
