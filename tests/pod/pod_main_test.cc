#include "setpoint/pod/pod_main.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "http_load.h"
#include "httplib.h"
#include "setpoint/base/context.h"
#include "setpoint/registry/in_memory_node_registry.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/child_process.h"
#include "setpoint/testing/idle_node.h"
#include "setpoint/testing/redis_server.h"
#include "setpoint/testing/status_matchers.h"
#include "spdlog/sinks/ostream_sink.h"

namespace setpoint {
namespace {

using ::setpoint::testing::IsOk;
using ::setpoint::testing::StatusIs;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

std::unique_ptr<Node> MakeNoop(const NodeInfo&) {
  return std::make_unique<::setpoint::testing::IdleNode>();
}

// A program with kinds "work" (1 node, ring 128) and "idle" (2 nodes), and
// a flag --jobs=<n>.
struct Program {
  int jobs = 0;
  PodMainOptions options;

  Program() {
    options = {
        .program = "prog",
        .description = "Runs the work.",
        .kinds = {{.kind = "work",
                   .count = 1,
                   .ring_size = 128,
                   .factory = MakeNoop},
                  {.kind = "idle", .count = 2, .factory = MakeNoop}},
        .flags = {{.name = "jobs",
                   .help = "how many jobs to make",
                   .set =
                       [this](std::string_view v) {
                         if (!absl::SimpleAtoi(
                                 absl::string_view(v.data(), v.size()),
                                 &jobs)) {
                           return absl::InvalidArgumentError("not a number");
                         }
                         return absl::OkStatus();
                       }}},
    };
  }

  PodArgsResult Parse(std::vector<std::string> flags) const {
    std::vector<const char*> argv = {"/usr/bin/prog"};
    for (const std::string& f : flags) argv.push_back(f.c_str());
    return ParsePodArgs(static_cast<int>(argv.size()), argv.data(), options);
  }
};

// A temporary file with `text`, removed at the end of the test.
class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    path_ = ::testing::TempDir() + "/pod_main_test_" +
            std::to_string(getpid()) + "_" + std::to_string(counter_++) +
            ".yaml";
    std::ofstream(path_) << text;
  }
  ~TempFile() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

// ---- ParsePodArgs ----------------------------------------------------------

TEST(ParsePodArgsTest, OverridesReachTheConfig) {
  Program p;
  PodArgsResult r =
      p.Parse({"--lease=5s", "--pod_id=p1", "--registry.type=redis",
               "--registry.address=10.0.0.1:7000", "--duration=30s",
               "--log_level=debug", "--log_format=json", "--jobs=7"});
  ASSERT_TRUE(r.args.has_value()) << r.text;
  const PodConfig& c = r.args->config;
  EXPECT_EQ(c.manager.lease, absl::Seconds(5));
  EXPECT_EQ(c.manager.pod_id, "p1");
  EXPECT_EQ(c.registry_type, "redis");
  EXPECT_EQ(c.redis.address, "10.0.0.1:7000");
  EXPECT_EQ(r.args->duration, absl::Seconds(30));
  EXPECT_EQ(r.args->log_level, spdlog::level::debug);
  EXPECT_EQ(r.args->log_format, PodLogFormat::kJson);
  EXPECT_EQ(p.jobs, 7);
}

TEST(ParsePodArgsTest, DefaultsWithoutFlags) {
  Program p;
  PodArgsResult r = p.Parse({});
  ASSERT_TRUE(r.args.has_value()) << r.text;
  EXPECT_EQ(r.args->config.registry_type, "memory");
  EXPECT_EQ(r.args->config_path, "");
  EXPECT_EQ(r.args->duration, absl::ZeroDuration());
  EXPECT_EQ(r.args->log_level, spdlog::level::info);
  EXPECT_EQ(r.args->log_format, PodLogFormat::kText);
}

TEST(ParsePodArgsTest, KindCountsMergeWithTheProgramsKinds) {
  Program p;
  PodArgsResult r = p.Parse({"--kinds.work.count=3"});
  ASSERT_TRUE(r.args.has_value()) << r.text;
  const auto& kinds = r.args->config.manager.kinds;
  ASSERT_EQ(kinds.size(), 2u);
  EXPECT_EQ(kinds[0].kind, "work");
  EXPECT_EQ(kinds[0].count, 3);
  EXPECT_EQ(kinds[0].ring_size, 128u);
  EXPECT_NE(kinds[0].factory, nullptr);
  EXPECT_EQ(kinds[1].kind, "idle");
  EXPECT_EQ(kinds[1].count, 2);
  EXPECT_NE(kinds[1].factory, nullptr);
}

TEST(ParsePodArgsTest, TheFileChangesTheKindsAndFlagsWinOverIt) {
  Program p;
  TempFile file("lease: 4s\nkinds: [{kind: idle, count: 5}]\n");
  PodArgsResult r = p.Parse({"--config=" + file.path(), "--lease=6s"});
  ASSERT_TRUE(r.args.has_value()) << r.text;
  EXPECT_EQ(r.args->config_path, file.path());
  EXPECT_EQ(r.args->config.manager.lease, absl::Seconds(6));
  ASSERT_EQ(r.args->config.manager.kinds.size(), 2u);
  EXPECT_EQ(r.args->config.manager.kinds[1].count, 5);
  EXPECT_NE(r.args->config.manager.kinds[1].factory, nullptr);
}

TEST(ParsePodArgsTest, ALaterFlagWins) {
  Program p;
  PodArgsResult r = p.Parse(
      {"--lease=5s", "--lease=7s", "--log_level=warn", "--log_level=off"});
  ASSERT_TRUE(r.args.has_value()) << r.text;
  EXPECT_EQ(r.args->config.manager.lease, absl::Seconds(7));
  EXPECT_EQ(r.args->log_level, spdlog::level::off);
}

TEST(ParsePodArgsTest, UnknownFlagIsCode2NamingTheFlag) {
  Program p;
  PodArgsResult r = p.Parse({"--bogus=1"});
  EXPECT_FALSE(r.args.has_value());
  EXPECT_EQ(r.exit_code, kPodExitBadConfig);
  EXPECT_THAT(r.text, AllOf(StartsWith("prog: "), HasSubstr("--bogus")));
  EXPECT_EQ(r.text.back(), '\n');
}

TEST(ParsePodArgsTest, NeverEchoesAValueItDoesNotUnderstand) {
  Program p;
  for (const std::vector<std::string>& flags :
       std::vector<std::vector<std::string>>{
           {"--registry.pasword=hunter2"},
           {"--registry.password", "hunter2"},
           {"--registry.type=redis", "--registry.password=hunter2",
            "--registry.password_env=SOME_VAR"}}) {
    PodArgsResult r = p.Parse(flags);
    EXPECT_EQ(r.exit_code, kPodExitBadConfig) << flags[0];
    EXPECT_THAT(r.text, Not(HasSubstr("hunter2")));
  }
}

TEST(ParsePodArgsTest, WhatIsNotANameValueFlagIsCode2) {
  Program p;
  PodArgsResult positional = p.Parse({"lease"});
  EXPECT_EQ(positional.exit_code, kPodExitBadConfig);
  EXPECT_THAT(positional.text, HasSubstr("argument 1 is not a flag"));
  PodArgsResult bare = p.Parse({"--lease"});
  EXPECT_EQ(bare.exit_code, kPodExitBadConfig);
  EXPECT_THAT(bare.text, HasSubstr("--lease needs a value"));
}

TEST(ParsePodArgsTest, BadValuesAreCode2NamingTheFlag) {
  Program p;
  struct Case {
    std::string flag;
    std::string want;
  };
  for (const Case& c : std::vector<Case>{
           {"--duration=soon", "--duration"},
           {"--duration=-1s", "--duration must not be negative"},
           {"--lease=bogus", "lease"},
           {"--kinds.work.count=0", "kinds.work.count"},
           {"--log_level=loud", "--log_level"},
           {"--log_format=xml", "--log_format"},
           {"--jobs=many", "--jobs: not a number"},
       }) {
    PodArgsResult r = p.Parse({c.flag});
    EXPECT_FALSE(r.args.has_value()) << c.flag;
    EXPECT_EQ(r.exit_code, kPodExitBadConfig) << c.flag;
    EXPECT_THAT(r.text, HasSubstr(c.want)) << c.flag;
  }
}

TEST(ParsePodArgsTest, AKindTheProgramDoesNotRunIsCode2) {
  Program p;
  PodArgsResult by_flag = p.Parse({"--kinds.other.count=2"});
  EXPECT_EQ(by_flag.exit_code, kPodExitBadConfig);
  EXPECT_THAT(by_flag.text, AllOf(HasSubstr("kind \"other\""),
                                  HasSubstr("it runs: work, idle")));
  TempFile file("kinds: [{kind: other}]\n");
  PodArgsResult by_file = p.Parse({"--config=" + file.path()});
  EXPECT_EQ(by_file.exit_code, kPodExitBadConfig);
  EXPECT_THAT(by_file.text, HasSubstr("kind \"other\""));
}

TEST(ParsePodArgsTest, BadYamlIsCode2NamingTheFileAndLine) {
  Program p;
  TempFile file("lease: 3s\nleese: 4s\n");
  PodArgsResult r = p.Parse({"--config=" + file.path()});
  EXPECT_EQ(r.exit_code, kPodExitBadConfig);
  EXPECT_THAT(r.text, AllOf(HasSubstr(file.path()), HasSubstr("leese"),
                            HasSubstr("line 2")));
}

TEST(ParsePodArgsTest, TheDefaultConfigPathIsReadUnlessConfigIsGiven) {
  Program p;
  TempFile file("lease: 4s\n");
  p.options.default_config_path = file.path();
  PodArgsResult from_default = p.Parse({});
  ASSERT_TRUE(from_default.args.has_value()) << from_default.text;
  EXPECT_EQ(from_default.args->config.manager.lease, absl::Seconds(4));

  p.options.default_config_path = "/nonexistent/pod.yaml";
  PodArgsResult missing = p.Parse({});
  EXPECT_EQ(missing.exit_code, kPodExitBadConfig);
  EXPECT_THAT(missing.text, HasSubstr("/nonexistent/pod.yaml"));
  PodArgsResult none = p.Parse({"--config="});
  ASSERT_TRUE(none.args.has_value()) << none.text;
  EXPECT_EQ(none.args->config.manager.lease, absl::Seconds(3));
}

TEST(ParsePodArgsTest, HelpListsEveryFlagAndIsCode0) {
  Program p;
  // --help wins over a bad flag before it, and calls no setter.
  PodArgsResult r = p.Parse({"--jobs=5", "--bogus=1", "--help"});
  EXPECT_FALSE(r.args.has_value());
  EXPECT_EQ(r.exit_code, kPodExitOk);
  EXPECT_EQ(p.jobs, 0);
  EXPECT_THAT(r.text, StartsWith("usage: prog "));
  for (const char* want : {"Runs the work.", "work (count 1, ring_size 128)",
                           "idle (count 2, ring_size 4096)", "--config=<path>",
                           "--duration=<duration>", "--log_level=<level>",
                           "--log_format=text|json", "--help", "--jobs=<value>",
                           "how many jobs to make", "Exit codes"}) {
    EXPECT_THAT(r.text, HasSubstr(want));
  }
  for (const PodConfigKey& key : PodConfigKeys()) {
    EXPECT_THAT(r.text, HasSubstr(absl::StrCat("--", std::string(key.path), "=",
                                               std::string(key.value))));
  }
  EXPECT_EQ(p.Parse({"-h"}).exit_code, kPodExitOk);
  EXPECT_EQ(PodUsage(p.options), r.text);
}

TEST(ParsePodArgsTest, BrokenProgramOptionsAreCode1) {
  Program clash;
  clash.options.flags[0].name = "lease";
  EXPECT_EQ(clash.Parse({}).exit_code, kPodExitFailed);
  EXPECT_THAT(clash.Parse({}).text, HasSubstr("--lease clashes"));
  Program builtin;
  builtin.options.flags[0].name = "duration";
  EXPECT_EQ(builtin.Parse({}).exit_code, kPodExitFailed);
  Program no_factory;
  no_factory.options.kinds[1].factory = nullptr;
  EXPECT_EQ(no_factory.Parse({}).exit_code, kPodExitFailed);
  EXPECT_THAT(no_factory.Parse({}).text, HasSubstr("\"idle\" has no factory"));
  Program no_kinds;
  no_kinds.options.kinds.clear();
  EXPECT_EQ(no_kinds.Parse({}).exit_code, kPodExitFailed);
}

TEST(ParsePodArgsTest, TheProgramNameDefaultsToArgv0) {
  Program p;
  p.options.program = "";
  PodArgsResult r = p.Parse({"--bogus=1"});
  EXPECT_THAT(r.text, StartsWith("prog: "));
}

// ---- MakeNodeRegistry
// ---------------------------------------------------------

TEST(MakeNodeRegistryTest, MemoryIsAnInMemoryRegistry) {
  PodConfig config;
  auto registry = MakeNodeRegistry(config, nullptr);
  ASSERT_THAT(registry.status(), IsOk());
  EXPECT_NE(dynamic_cast<InMemoryNodeRegistry*>(registry->get()), nullptr);
}

TEST(MakeNodeRegistryTest, AnUnreachableRedisIsCreatedAndFailsItsCalls) {
  PodConfig config;
  config.registry_type = "redis";
  // Nobody listens on this socket: Create does not connect, calls fail.
  config.redis.address =
      "unix://" + ::testing::TempDir() + "/pod_main_test_nobody.sock";
  auto registry = MakeNodeRegistry(config, nullptr);
  ASSERT_THAT(registry.status(), IsOk());
  auto poll = (*registry)->Poll(
      Context::Background().WithTimeout(absl::Seconds(5)),
      {.kinds = {{"work", {"p/work/0"}}}, .lease = absl::Seconds(3)});
  EXPECT_THAT(poll.status(),
              AnyOf(StatusIs(absl::StatusCode::kUnavailable),
                    StatusIs(absl::StatusCode::kDeadlineExceeded)));
}

TEST(MakeNodeRegistryTest, InvalidRedisOptionsAndTypesAreRefused) {
  PodConfig config;
  config.registry_type = "redis";
  config.redis.ns = "";
  EXPECT_THAT(MakeNodeRegistry(config, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("make node registry"),
                             HasSubstr("ns must not be empty"))));
  config.registry_type = "etcd";
  EXPECT_THAT(MakeNodeRegistry(config, nullptr).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("registry.type must be memory or redis")));
}

// ---- Logs -------------------------------------------------------------------

// Logs `messages` through MakePodLogger into a string, one per line.
std::vector<std::string> LogLines(
    PodLogFormat format, spdlog::level::level_enum level,
    const std::vector<std::pair<spdlog::level::level_enum, std::string>>&
        messages,
    const std::string& name = "pod-t", const std::string& pod = "") {
  std::ostringstream out;
  PodArgs args;
  args.config.manager.pod_id = pod;
  args.log_format = format;
  args.log_level = level;
  auto logger = MakePodLogger(
      name, args, std::make_shared<spdlog::sinks::ostream_sink_st>(out));
  for (const auto& [l, text] : messages) logger->log(l, "{}", text);
  logger->flush();
  std::vector<std::string> lines = absl::StrSplit(out.str(), '\n');
  EXPECT_EQ(lines.back(), "");  // Every line ends in a newline.
  lines.pop_back();
  return lines;
}

// The line without its time, which must be RFC 3339 UTC with microseconds.
std::string WithoutTime(const std::string& line) {
  static const std::regex kTime(
      R"re(^\{"time":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z",)re");
  std::smatch m;
  EXPECT_TRUE(std::regex_search(line, m, kTime)) << line;
  return m.empty() ? line : "{" + line.substr(m.length(0));
}

TEST(JsonLogTest, OneObjectPerLineWithTheFourFields) {
  auto lines = LogLines(PodLogFormat::kJson, spdlog::level::info,
                        {{spdlog::level::info, "pod started nodes=2"},
                         {spdlog::level::warn, "retrying"},
                         {spdlog::level::err, "failed"}});
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(WithoutTime(lines[0]),
            R"({"level":"info","logger":"pod-t","msg":"pod started nodes=2"})");
  EXPECT_EQ(WithoutTime(lines[1]),
            R"({"level":"warn","logger":"pod-t","msg":"retrying"})");
  EXPECT_EQ(WithoutTime(lines[2]),
            R"({"level":"error","logger":"pod-t","msg":"failed"})");
}

TEST(JsonLogTest, EscapesQuotesNewlinesAndControlBytes) {
  std::string msg = "he said \"hi\"\\ then\nnext\r\ttab\b\f";
  msg += std::string("\x01\x1f\x7f", 3);
  msg += std::string("\0end", 4);
  auto lines = LogLines(PodLogFormat::kJson, spdlog::level::info,
                        {{spdlog::level::info, msg}}, "a\"b");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(WithoutTime(lines[0]),
            R"({"level":"info","logger":"a\"b","msg":"he said \"hi\"\\ then)"
            R"(\nnext\r\ttab\b\f\u0001\u001f\u007f\u0000end"})");
}

TEST(JsonLogTest, KeepsUtf8AndReplacesWhatIsNotUtf8) {
  std::string msg = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";  // é € 😀
  msg += " bad:\xff";
  msg += " overlong:\xc0\xaf";
  msg += " surrogate:\xed\xa0\x80";
  msg += " cut:\xe2\x82";
  auto lines = LogLines(PodLogFormat::kJson, spdlog::level::info,
                        {{spdlog::level::info, msg}});
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(WithoutTime(lines[0]),
            "{\"level\":\"info\",\"logger\":\"pod-t\",\"msg\":\"caf\xc3\xa9 "
            "\xe2\x82\xac \xf0\x9f\x98\x80 bad:\\ufffd overlong:\\ufffd\\ufffd "
            "surrogate:\\ufffd\\ufffd\\ufffd cut:\\ufffd\\ufffd\"}");
}

TEST(JsonLogTest, TheLevelFilters) {
  auto lines = LogLines(PodLogFormat::kJson, spdlog::level::warn,
                        {{spdlog::level::debug, "no"},
                         {spdlog::level::info, "no"},
                         {spdlog::level::warn, "yes"}});
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("\"msg\":\"yes\""));
  EXPECT_TRUE(LogLines(PodLogFormat::kJson, spdlog::level::off,
                       {{spdlog::level::err, "no"}})
                  .empty());
}

TEST(JsonLogTest, LiftsPodNodeKindComponentAndKeyIntoFields) {
  auto lines = LogLines(
      PodLogFormat::kJson, spdlog::level::info,
      {{spdlog::level::info,
        "shard range assigned node=pod-a/vm/1 range=[0,8) token=3"},
       {spdlog::level::warn,
        "syncer create failed, retrying syncer=vms key=\"web 1\" failures=2"},
       {spdlog::level::info, "pod stopping pod=pod-b signal=SIGTERM"},
       {spdlog::level::info, "node=x/y notanode=1 skey=2"}},
      "pod-t", "pod-t");
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_THAT(lines[0], HasSubstr(R"("logger":"pod-t","pod":"pod-a",)"
                                  R"("node":"pod-a/vm/1","kind":"vm","msg":)"));
  // No node in the message: the logger's own pod; the part and the key.
  EXPECT_THAT(lines[1], HasSubstr(R"("pod":"pod-t","component":"syncer/vms",)"
                                  R"("key":"web 1","msg":)"));
  EXPECT_THAT(lines[2], HasSubstr(R"("logger":"pod-t","pod":"pod-b","msg":)"));
  // A node= that is not a node id is kept as it is; partial words are not
  // keys.
  EXPECT_THAT(lines[3], HasSubstr(R"("pod":"pod-t","node":"x/y","msg":)"));
}

TEST(JsonLogTest, ALoggerNamedAfterANodeGivesItsFields) {
  std::vector<std::pair<std::string, std::string>> fields =
      LogFields("plan step failed plan=zone attempt=2", "pod-c/zone/0", "");
  EXPECT_THAT(
      fields,
      ::testing::ElementsAre(
          std::pair<std::string, std::string>{"pod", "pod-c"},
          std::pair<std::string, std::string>{"node", "pod-c/zone/0"},
          std::pair<std::string, std::string>{"kind", "zone"},
          std::pair<std::string, std::string>{"component", "plan/zone"}));
  EXPECT_TRUE(LogFields("nothing here", "prog", "").empty());
}

TEST(TextLogTest, TimeLevelLoggerMessage) {
  auto lines = LogLines(PodLogFormat::kText, spdlog::level::info,
                        {{spdlog::level::info, "pod started nodes=2"},
                         {spdlog::level::debug, "hidden"}});
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(std::regex_match(
      lines[0], std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z info )"
                           R"(pod-t: pod started nodes=2)")))
      << lines[0];
}

// ---- PodMain in a real process (tests/pod/test_pod.cc) --------------------

// A test_pod process with its stdout and stderr on pipes.
class PodProcess : public testing::ChildProcess {
 public:
  explicit PodProcess(const std::vector<std::string>& flags)
      : ChildProcess(Args(flags)) {}
  bool AwaitOut(const std::string& text,
                absl::Duration timeout = absl::Seconds(20)) {
    return ChildProcess::AwaitOut(text, 1, timeout);
  }
  bool AwaitErr(const std::string& text,
                absl::Duration timeout = absl::Seconds(20)) {
    return ChildProcess::AwaitErr(text, 1, timeout);
  }

 private:
  static std::vector<std::string> Args(const std::vector<std::string>& flags) {
    std::vector<std::string> args = {SETPOINT_TEST_POD};
    args.insert(args.end(), flags.begin(), flags.end());
    return args;
  }
};

// `extra` after fast polls, so the node gets its range at once, and a free
// port for the listener (tests run side by side).
std::vector<std::string> Flags(std::vector<std::string> extra) {
  std::vector<std::string> flags = {"--poll_interval=50ms", "--lease=1s",
                                    "--http.address=127.0.0.1:0"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

TEST(PodMainProcessTest, SigtermStopsGracefullyWithCode0) {
  PodProcess pod(Flags({"--pod_id=graceful", "--log_format=json"}));
  ASSERT_TRUE(pod.started());
  ASSERT_TRUE(pod.AwaitOut("started pod=graceful\n")) << pod.err();
  ASSERT_TRUE(pod.AwaitOut("range node=graceful/work/0 [0,4096)\n"))
      << pod.out() << pod.err();
  pod.Signal(SIGTERM);
  EXPECT_EQ(pod.AwaitExit(), kPodExitOk) << pod.err();
  EXPECT_THAT(pod.err(),
              AllOf(HasSubstr("pod stopping pod=graceful signal=SIGTERM"),
                    HasSubstr("pod stopped pod=graceful exit_code=0")));
  // --log_format=json: every line of the log is one JSON object, and each
  // names the pod in a field of its own.
  std::vector<std::string> lines =
      absl::StrSplit(pod.err(), '\n', absl::SkipEmpty());
  EXPECT_FALSE(lines.empty());
  for (const std::string& line : lines) {
    EXPECT_THAT(line, StartsWith("{\"time\":\"")) << line;
    EXPECT_THAT(line, HasSubstr(",\"pod\":\"graceful\",")) << line;
    EXPECT_EQ(line.back(), '}') << line;
  }
  EXPECT_THAT(pod.err(), HasSubstr("\"logger\":\"graceful\",\"pod\":"
                                   "\"graceful\",\"msg\":\"ops server "
                                   "listening address=127.0.0.1:"));
  // The manager's lines about a node carry it, and its kind, as fields.
  EXPECT_THAT(pod.err(), HasSubstr("\"pod\":\"graceful\",\"node\":"
                                   "\"graceful/work/0\",\"kind\":\"work\""));
}

TEST(PodMainProcessTest, ThePodsNodesShareOneUpdaterPoolOfTheConfigsSize) {
  PodProcess pod(
      Flags({"--pod_id=pool", "--kinds.work.count=2", "--updater_threads=3"}));
  ASSERT_TRUE(pod.started());
  ASSERT_TRUE(pod.AwaitOut("started pod=pool\n")) << pod.err();
  const std::string out = pod.out();
  const std::regex created(
      "created node=pool/work/([01]) updaters=(\\S+) "
      "threads=(\\d+)");
  std::vector<std::string> pools;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), created);
       it != std::sregex_iterator(); ++it) {
    EXPECT_EQ((*it)[3].str(), "3") << out;
    pools.push_back((*it)[2].str());
  }
  ASSERT_EQ(pools.size(), 2u) << out;
  EXPECT_NE(pools[0], "none");
  EXPECT_EQ(pools[0], pools[1]);
  pod.Signal(SIGTERM);
  EXPECT_EQ(pod.AwaitExit(), kPodExitOk) << pod.err();

  PodProcess none(Flags({"--pod_id=nopool", "--updater_threads=0"}));
  ASSERT_TRUE(none.started());
  // The node's first range may be printed between the two lines.
  ASSERT_TRUE(none.AwaitOut("started pod=nopool\n"))
      << none.out() << none.err();
  EXPECT_NE(
      none.out().find("created node=nopool/work/0 updaters=none threads=0\n"),
      std::string::npos)
      << none.out();
  none.Signal(SIGTERM);
  EXPECT_EQ(none.AwaitExit(), kPodExitOk) << none.err();
}

TEST(PodMainProcessTest, ASecondSignalDuringASlowStopExitsAtOnceWithCode1) {
  PodProcess pod(Flags({"--pod_id=slow", "--slow_stop=true"}));
  ASSERT_TRUE(pod.started());
  ASSERT_TRUE(pod.AwaitOut("range node=slow/work/0 [0,4096)\n"))
      << pod.out() << pod.err();
  pod.Signal(SIGTERM);
  // The stop hands the range back; the node blocks in that update.
  ASSERT_TRUE(pod.AwaitOut("slow update node=slow/work/0\n")) << pod.err();
  pod.Signal(SIGINT);
  EXPECT_EQ(pod.AwaitExit(), kPodExitFailed) << pod.err();
  EXPECT_THAT(pod.err(),
              HasSubstr("test_pod: second SIGINT during the graceful stop; "
                        "exiting at once\n"));
  EXPECT_THAT(pod.err(), Not(HasSubstr("pod stopped")));
}

TEST(PodMainProcessTest, TheEndOfDurationStopsWithCode0) {
  PodProcess pod(Flags({"--duration=100ms"}));
  ASSERT_TRUE(pod.started());
  EXPECT_EQ(pod.AwaitExit(), kPodExitOk) << pod.err();
  EXPECT_THAT(pod.out(), HasSubstr("started pod="));
  EXPECT_THAT(pod.err(), ContainsRegex("pod stopping pod=[^ ]+ "
                                       "duration=100ms"));
}

TEST(PodMainProcessTest, ABadLeaseIsCode2) {
  PodProcess pod({"--lease=bogus"});
  ASSERT_TRUE(pod.started());
  EXPECT_EQ(pod.AwaitExit(), kPodExitBadConfig);
  EXPECT_THAT(pod.err(), AllOf(StartsWith("test_pod: "), HasSubstr("lease"),
                               HasSubstr("is not a duration")));
  EXPECT_EQ(pod.out(), "");
}

TEST(PodMainProcessTest, HelpGoesToStdoutWithCode0) {
  PodProcess pod({"--help"});
  ASSERT_TRUE(pod.started());
  EXPECT_EQ(pod.AwaitExit(), kPodExitOk);
  EXPECT_THAT(pod.out(), AllOf(StartsWith("usage: test_pod "),
                               HasSubstr("--slow_stop=<value>")));
  EXPECT_EQ(pod.err(), "");
}

TEST(PodMainProcessTest, AFactoryFailureIsCode1) {
  PodProcess pod(Flags({"--fail_factory=true"}));
  ASSERT_TRUE(pod.started());
  EXPECT_EQ(pod.AwaitExit(), kPodExitFailed) << pod.err();
  EXPECT_THAT(pod.err(), HasSubstr("returned null"));
  EXPECT_THAT(pod.out(), Not(HasSubstr("started")));
}

TEST(PodMainProcessTest, AnUnreachableRedisIsNotAFailure) {
  PodProcess pod(Flags({"--registry.type=redis",
                        "--registry.address=unix://" + ::testing::TempDir() +
                            "/pod_main_test_nobody.sock",
                        "--registry.connect_timeout=50ms"}));
  ASSERT_TRUE(pod.started());
  // The manager started and keeps polling; the node stays idle.
  ASSERT_TRUE(pod.AwaitOut("started pod=")) << pod.err();
  pod.Signal(SIGTERM);
  EXPECT_EQ(pod.AwaitExit(), kPodExitOk) << pod.err();
  EXPECT_THAT(pod.out(), Not(HasSubstr("range node=")));
}

// The port the pod's listener bound, from its log line, or 0.
int ListeningPort(const std::string& log) {
  std::smatch m;
  static const std::regex kLine(
      R"(ops server listening address=127\.0\.0\.1:(\d+))");
  if (!std::regex_search(log, m, kLine)) return 0;
  int port = 0;
  return absl::SimpleAtoi(m[1].str(), &port) ? port : 0;
}

TEST(PodMainProcessTest, ServesProbesMetricsAndStatusOverHttp) {
  PodProcess pod(Flags({"--pod_id=web"}));
  ASSERT_TRUE(pod.started());
  ASSERT_TRUE(pod.AwaitErr("ops server listening address=")) << pod.err();
  ASSERT_TRUE(pod.AwaitOut("range node=web/work/0 [0,4096)\n")) << pod.err();
  const int port = ListeningPort(pod.err());
  ASSERT_GT(port, 0) << pod.err();
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10, 0);
  auto healthz = c.Get("/healthz");
  ASSERT_TRUE(healthz);
  EXPECT_EQ(healthz->status, 200) << healthz->body;
  // Ready once a renewal succeeded: poll with a deadline.
  int ready_status = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    auto readyz = c.Get("/readyz");
    if (readyz && (ready_status = readyz->status) == 200) break;
  }
  EXPECT_EQ(ready_status, 200);
  // The node's range counts once UpdateShardRange returned (the test pod
  // prints its line inside it): poll with a deadline.
  auto get_until = [&](const std::string& path, const std::string& want) {
    std::string body;
    while (std::chrono::steady_clock::now() < deadline) {
      auto res = c.Get(path.c_str());
      if (res && res->status == 200) body = res->body;
      if (body.find(want) != std::string::npos) break;
    }
    return body;
  };
  const std::string metrics = get_until(
      "/metrics",
      "setpoint_node_shards_owned{pod=\"web\",kind=\"work\",node=\"web/"
      "work/0\"} 4096");
  EXPECT_THAT(metrics,
              HasSubstr("setpoint_node_shards_owned{pod=\"web\",kind=\"work\","
                        "node=\"web/work/0\"} 4096"));
  EXPECT_THAT(metrics, HasSubstr("setpoint_registry_polls_total{pod=\"web\"}"));
  EXPECT_THAT(
      metrics,
      HasSubstr("setpoint_registry_poll_duration_seconds_count{pod=\"web\"}"));
  const std::string status = get_until(
      "/statusz", "\"id\":\"web/work/0\",\"kind\":\"work\",\"range\":[0,4096]");
  EXPECT_THAT(status, HasSubstr(",\"pod\":\"web\""));
  EXPECT_THAT(status, HasSubstr("{\"config\":\"pod_id=web "));
  EXPECT_THAT(status,
              HasSubstr("\"id\":\"web/work/0\",\"kind\":\"work\",\"range\":[0,"
                        "4096]"));
  pod.Signal(SIGTERM);
  EXPECT_EQ(pod.AwaitExit(), kPodExitOk) << pod.err();
}

TEST(PodMainProcessTest, AListenerThatCannotBindIsCode1BeforeAnyShard) {
  PodProcess first(Flags({"--pod_id=first"}));
  ASSERT_TRUE(first.started());
  ASSERT_TRUE(first.AwaitErr("ops server listening address=")) << first.err();
  const int port = ListeningPort(first.err());
  ASSERT_GT(port, 0);
  PodProcess second(Flags(
      {"--pod_id=second", absl::StrCat("--http.address=127.0.0.1:", port)}));
  EXPECT_EQ(second.AwaitExit(), kPodExitFailed) << second.err();
  EXPECT_THAT(second.err(),
              HasSubstr("pod not started pod=second: http.address: ops "
                        "server: cannot listen on 127.0.0.1:"));
  EXPECT_THAT(second.out(), Not(HasSubstr("range node=")));
  first.Signal(SIGTERM);
  EXPECT_EQ(first.AwaitExit(), kPodExitOk) << first.err();
}

TEST(PodMainProcessTest, AnEmptyHttpAddressServesNothing) {
  PodProcess pod(Flags({"--pod_id=quiet", "--http.address="}));
  ASSERT_TRUE(pod.AwaitOut("range node=quiet/work/0 [0,4096)\n")) << pod.err();
  EXPECT_THAT(pod.err(), Not(HasSubstr("ops server listening")));
  pod.Signal(SIGTERM);
  EXPECT_EQ(pod.AwaitExit(), kPodExitOk) << pod.err();
}

// ---- Failing loudly: the registry refuses the pod's settings ----------------

class RegistrySettingsTest : public ::testing::Test {
 protected:
  RegistrySettingsTest()
      : server_({.tcp = false,
                 .requirepass = "right",
                 .acl_users = {"user pods on >pods-pass ~* &* +@all"}}) {}
  // Runs a pod with `flags` against the server and expects it to fail
  // loudly: code 2 within a few seconds, one error naming `what`, no shard
  // taken and nothing said about a deregistration.
  void ExpectRefused(std::vector<std::string> flags, const std::string& what) {
    std::vector<std::string> all = {"--pod_id=refused", "--registry.type=redis",
                                    "--registry.address=" + server_.address()};
    all.insert(all.end(), flags.begin(), flags.end());
    const absl::Time start = absl::Now();
    PodProcess pod(Flags(all));
    ASSERT_TRUE(pod.started());
    EXPECT_EQ(pod.AwaitExit(absl::Seconds(20)), kPodExitBadConfig) << pod.err();
    EXPECT_LT(absl::Now() - start, absl::Seconds(5));
    EXPECT_EQ(testing::ChildProcess::Count(pod.err(), "error"), 1) << pod.err();
    EXPECT_THAT(pod.err(), HasSubstr("pod not started pod=refused: the "
                                     "registry refuses its settings"));
    EXPECT_THAT(pod.err(), HasSubstr(what));
    EXPECT_THAT(pod.err(), Not(HasSubstr("deregister")));
    EXPECT_THAT(pod.err(), Not(HasSubstr("right")));  // No password shown.
    EXPECT_THAT(pod.out(), Not(HasSubstr("started pod=")));
  }
  testing::RedisServer server_;
};

TEST_F(RegistrySettingsTest, AWrongPasswordIsCode2BeforeAnyShard) {
  SETPOINT_START_REDIS_OR_SKIP(server_);
  ExpectRefused({"--registry.password=wrong"}, "WRONGPASS");
}

TEST_F(RegistrySettingsTest, NoPasswordIsCode2) {
  SETPOINT_START_REDIS_OR_SKIP(server_);
  ExpectRefused({}, "NOAUTH");
}

TEST_F(RegistrySettingsTest, AUserThatDoesNotExistIsCode2) {
  SETPOINT_START_REDIS_OR_SKIP(server_);
  ExpectRefused({"--registry.username=nobody", "--registry.password=pods-pass"},
                "user=nobody");
}

TEST_F(RegistrySettingsTest, ADatabaseTheServerDoesNotHaveIsCode2) {
  SETPOINT_START_REDIS_OR_SKIP(server_);
  ExpectRefused({"--registry.password=right", "--registry.db=4000"},
                "select db=4000");
}

TEST_F(RegistrySettingsTest, TheRightSettingsRunAndOwnTheRing) {
  SETPOINT_START_REDIS_OR_SKIP(server_);
  PodProcess pod(
      Flags({"--pod_id=fine", "--registry.type=redis",
             "--registry.address=" + server_.address(),
             "--registry.username=pods", "--registry.password=pods-pass"}));
  ASSERT_TRUE(pod.AwaitOut("range node=fine/work/0 [0,4096)\n")) << pod.err();
  pod.Signal(SIGTERM);
  EXPECT_EQ(pod.AwaitExit(), kPodExitOk) << pod.err();
}

// ---- The listener of a real pod under load, and its series -----------------

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// The value of the sample `series` (name and labels, exactly) in a
// Prometheus text scrape, or -1.
double Sample(const std::string& scrape, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(scrape, '\n')) {
    if (absl::ConsumePrefix(&line, series) && absl::ConsumePrefix(&line, " ")) {
      double v;
      if (absl::SimpleAtod(line, &v)) return v;
    }
  }
  return -1;
}

// Resident memory of `pid` in bytes, from /proc, or -1.
double ResidentBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "VmRSS:")) {
      double kb = 0;
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (f.size() >= 2 && absl::SimpleAtod(f[1], &kb)) return kb * 1024;
    }
  }
  return -1;
}

TEST(PodListenerTest, ProbesHoldUnderIdleSlowAndScrapingClients) {
  PodProcess pod(Flags({"--pod_id=busy", "--series=1000"}));
  ASSERT_TRUE(pod.AwaitOut("range node=busy/work/0 [0,4096)\n")) << pod.err();
  const int port = ListeningPort(pod.err());
  ASSERT_GT(port, 0) << pod.err();
  const std::string owned =
      "setpoint_node_shards_owned{pod=\"busy\",kind=\"work\",node=\"busy/work/"
      "0\"}";
  std::string scrape;
  ASSERT_TRUE(testing::AwaitCondition([&] {
    scrape =
        http_load::Fetch(port, http_load::Get("/metrics"), absl::Seconds(5))
            .body;
    return Sample(scrape, owned) == 4096;
  })) << scrape;
  const double token = Sample(
      scrape,
      "setpoint_node_fencing_token{pod=\"busy\",kind=\"work\",node=\"busy/"
      "work/0\"}");

  // /metrics with 1,000 series more, idle: the target is 20 ms at p99.
  std::vector<double> metrics_ms;
  for (int i = 0; i < 50; ++i) {
    http_load::Answer a =
        http_load::Fetch(port, http_load::Get("/metrics"), absl::Seconds(5));
    ASSERT_EQ(a.status, 200) << a.error;
    metrics_ms.push_back(absl::ToDoubleMilliseconds(a.took));
  }
  const double rss_before = ResidentBytes(pod.pid());

  http_load::Load clients(port, {.idle = 300, .slowloris = 50, .scrapers = 4});
  clients.Start();
  ASSERT_TRUE(testing::AwaitCondition([&] { return clients.open() >= 350; }));
  // Held past the request timeout (2 s), so the deadlines are at work.
  const absl::Time probing = absl::Now() + absl::Seconds(2);
  std::vector<double> healthz_ms;
  int failed = 0;
  while (absl::Now() < probing || healthz_ms.size() < 100) {
    const absl::Time next = absl::Now() + absl::Milliseconds(10);
    // kubelet gives a probe 1 s; 5 s here, for sanitizers on a loaded
    // machine (the figures printed below are the measure).
    http_load::Answer a =
        http_load::Fetch(port, http_load::Get("/healthz"), absl::Seconds(5));
    if (a.status != 200) {
      ++failed;
      ADD_FAILURE() << "probe " << healthz_ms.size() << ": " << a.status << " "
                    << a.error << " after " << a.took << "\n"
                    << a.body;
    }
    healthz_ms.push_back(absl::ToDoubleMilliseconds(a.took));
    absl::SleepFor(next - absl::Now());  // A probe every 10 ms at most.
  }
  const double rss_loaded = ResidentBytes(pod.pid());
  clients.Stop();

  // Safety, exactly: no probe failed, the shards stayed where they were.
  EXPECT_EQ(failed, 0);
  scrape =
      http_load::Fetch(port, http_load::Get("/metrics"), absl::Seconds(5)).body;
  EXPECT_EQ(Sample(scrape, owned), 4096);
  EXPECT_EQ(Sample(scrape,
                   "setpoint_node_fencing_token{pod=\"busy\",kind=\"work\","
                   "node=\"busy/work/0\"}"),
            token);
  EXPECT_EQ(Sample(scrape, "setpoint_node_self_fences_total{pod=\"busy\"}"), 0);
  EXPECT_EQ(clients.scrape_failures(), 0);
  // Latency, generously (the targets are 100 ms and 20 ms; a loaded 2-core
  // machine running sanitizers is slower): the figures are in the log.
  const double healthz_p99 = http_load::Percentile(healthz_ms, 0.99);
  const double metrics_p99 = http_load::Percentile(metrics_ms, 0.99);
  std::printf(
      "healthz under load: p50 %.2f ms p99 %.2f ms (%zu probes); "
      "/metrics idle: p99 %.2f ms; rss %.1f -> %.1f MiB\n",
      http_load::Percentile(healthz_ms, 0.5), healthz_p99, healthz_ms.size(),
      metrics_p99, rss_before / (1 << 20), rss_loaded / (1 << 20));
  EXPECT_LT(healthz_p99, 800);
  EXPECT_LT(metrics_p99, 500);
  // Memory bounded: 350 held connections cost buffers, not a thread each.
  // (Under a sanitizer resident memory also holds its shadow and the
  // quarantine of freed blocks: not a measure there.)
  if (!kSanitized) {
    EXPECT_LT(rss_loaded - rss_before, 64.0 * (1 << 20));
  }
  EXPECT_THAT(scrape, HasSubstr("setpoint_ops_http_connections_closed_total{"
                                "pod=\"busy\",reason=\"request_timeout\"}"));
  pod.Signal(SIGTERM);
  EXPECT_EQ(pod.AwaitExit(), kPodExitOk) << pod.err();
  // The listener said what it shed.
  EXPECT_THAT(pod.err(), HasSubstr("ops listener shedding clients"));
}

TEST(PodListenerTest, PublishesReadinessRingSizesAndProcessSeries) {
  PodProcess pod(Flags({"--pod_id=series", "--kinds.work.ring_size=64"}));
  ASSERT_TRUE(pod.AwaitOut("range node=series/work/0 [0,64)\n")) << pod.err();
  const int port = ListeningPort(pod.err());
  std::string scrape;
  ASSERT_TRUE(testing::AwaitCondition([&] {
    scrape =
        http_load::Fetch(port, http_load::Get("/metrics"), absl::Seconds(5))
            .body;
    return Sample(scrape, "setpoint_pod_ready{pod=\"series\"}") == 1;
  })) << scrape;
  EXPECT_EQ(
      Sample(scrape, "setpoint_kind_ring_size{pod=\"series\",kind=\"work\"}"),
      64);
  // Counters are there at 0 before their first event.
  EXPECT_EQ(Sample(scrape,
                   "setpoint_registry_errors_total{pod=\"series\",op=\"poll\","
                   "code=\"unavailable\"}"),
            0);
  EXPECT_GT(Sample(scrape, "process_resident_memory_bytes"), 1 << 20);
  EXPECT_GE(Sample(scrape, "process_cpu_seconds_total"), 0);
  EXPECT_GT(Sample(scrape, "process_open_fds"), 3);
  EXPECT_GT(Sample(scrape, "process_max_fds"), 3);
  EXPECT_GT(Sample(scrape, "process_threads"), 3);
  const double start = Sample(scrape, "process_start_time_seconds");
  EXPECT_NEAR(start, absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()),
              120);
  pod.Signal(SIGTERM);
  EXPECT_EQ(pod.AwaitExit(), kPodExitOk) << pod.err();
}

// ---- promtool ---------------------------------------------------------------

// promtool's path, or "" (skip locally, fail in CI).
std::string Promtool() {
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/bin"}) {
    std::string path = absl::StrCat(dir, "/promtool");
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

#define SETPOINT_PROMTOOL_OR_SKIP(var)                                   \
  const std::string var = Promtool();                                    \
  if (var.empty()) {                                                     \
    if (testing::RedisRequired()) FAIL() << "promtool is not installed"; \
    GTEST_SKIP() << "promtool is not installed (Debian: prometheus)";    \
  }

TEST(PromtoolTest, ARealPodsScrapeIsCleanForPromtoolCheckMetrics) {
  SETPOINT_PROMTOOL_OR_SKIP(promtool);
  PodProcess pod(Flags({"--pod_id=lint"}));
  ASSERT_TRUE(pod.AwaitOut("range node=lint/work/0 [0,4096)\n")) << pod.err();
  const int port = ListeningPort(pod.err());
  const std::string file = ::testing::TempDir() + "/pod_main_test_scrape.txt";
  {
    std::ofstream out(file);
    out << http_load::Fetch(port, http_load::Get("/metrics"), absl::Seconds(5))
               .body;
  }
  testing::ChildProcess check(
      {"/bin/sh", "-c", absl::StrCat(promtool, " check metrics < ", file)});
  EXPECT_EQ(check.AwaitExit(), 0) << check.out() << check.err();
  EXPECT_EQ(check.out() + check.err(), "");  // Not even a lint warning.
  pod.Signal(SIGTERM);
  EXPECT_EQ(pod.AwaitExit(), kPodExitOk) << pod.err();
}

TEST(PromtoolTest, TheAlertRulesPassTheirTests) {
  SETPOINT_PROMTOOL_OR_SKIP(promtool);
  testing::ChildProcess run({promtool, "test", "rules",
                             SETPOINT_DOCS_DIR
                             "/alerts/setpoint.rules.test.yml"});
  EXPECT_EQ(run.AwaitExit(), 0) << run.out() << run.err();
  EXPECT_THAT(run.out() + run.err(), HasSubstr("SUCCESS"));
}

TEST(PromtoolTest, TheOperationsGuideShowsTheRulesAsShipped) {
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  const std::string rules =
      read(SETPOINT_DOCS_DIR "/alerts/setpoint.rules.yml");
  ASSERT_FALSE(rules.empty());
  EXPECT_THAT(read(SETPOINT_DOCS_DIR "/operations.md"), HasSubstr(rules));
}

}  // namespace
}  // namespace setpoint
