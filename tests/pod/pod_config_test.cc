#include "setpoint/pod/pod_config.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint {
namespace {

using ::setpoint::testing::IsOk;
using ::setpoint::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kFull[] = R"(
pod_id: pod-a
poll_interval: 250ms
lease: 2s
kinds:
  - {kind: vm, count: 2, ring_size: 1024}
  - kind: dns
registry:
  type: redis
  address: unix:///run/redis.sock
  username: ctrl
  password: hunter2
  db: 3
  namespace: prod
  command_timeout: 300ms
)";

TEST(PodConfigTest, ParsesEveryField) {
  auto c = ParsePodConfig(kFull);
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_EQ(c->manager.pod_id, "pod-a");
  EXPECT_EQ(c->manager.poll_interval, absl::Milliseconds(250));
  EXPECT_EQ(c->manager.lease, absl::Seconds(2));
  ASSERT_EQ(c->manager.kinds.size(), 2u);
  EXPECT_EQ(c->manager.kinds[0].kind, "vm");
  EXPECT_EQ(c->manager.kinds[0].count, 2);
  EXPECT_EQ(c->manager.kinds[0].ring_size, 1024u);
  EXPECT_EQ(c->manager.kinds[1].kind, "dns");
  EXPECT_EQ(c->manager.kinds[1].count, 1);
  EXPECT_EQ(c->registry_type, "redis");
  EXPECT_EQ(c->redis.address, "unix:///run/redis.sock");
  EXPECT_EQ(c->redis.username, "ctrl");
  EXPECT_EQ(c->redis.password, "hunter2");
  EXPECT_EQ(c->redis.db, 3);
  EXPECT_EQ(c->redis.ns, "prod");
  EXPECT_EQ(c->redis.command_timeout, absl::Milliseconds(300));
  EXPECT_THAT(c->ToString(), Not(HasSubstr("hunter2")));
  EXPECT_THAT(c->ToString(), HasSubstr("password=<redacted>"));
}

TEST(PodConfigTest, OverridesWinOverTheFile) {
  auto c =
      ParsePodConfig(kFull, {"--lease=5s", "--registry.address=h:7000",
                             "--kinds.vm.count=4", "--kinds.jobs.count=1"});
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_EQ(c->manager.lease, absl::Seconds(5));
  EXPECT_EQ(c->redis.address, "h:7000");
  EXPECT_EQ(c->manager.kinds[0].count, 4);
  ASSERT_EQ(c->manager.kinds.size(), 3u);
  EXPECT_EQ(c->manager.kinds[2].kind, "jobs");
}

TEST(PodConfigTest, DefaultsNeedAtLeastOneKind) {
  EXPECT_THAT(ParsePodConfig("").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("kinds")));
  auto c = ParsePodConfig("", {"--kinds.vm.count=1"});
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_EQ(c->registry_type, "memory");
  EXPECT_EQ(c->manager.lease, absl::Seconds(3));
  EXPECT_EQ(c->manager.poll_interval, absl::Milliseconds(500));
}

TEST(PodConfigTest, TheProgramsKindsAreDefaultsTheConfigMayChange) {
  std::vector<NodeKindOptions> kinds = {
      {.kind = "work",
       .count = 2,
       .ring_size = 256,
       .factory = [](const NodeInfo&) -> std::unique_ptr<Node> {
         return nullptr;
       }},
      {.kind = "idle", .count = 1, .ring_size = 64, .factory = nullptr}};
  // Without a file the program's kinds are enough.
  auto plain = ParsePodConfig("", {}, kinds);
  ASSERT_THAT(plain.status(), IsOk());
  ASSERT_EQ(plain->manager.kinds.size(), 2u);
  EXPECT_EQ(plain->manager.kinds[0].count, 2);
  EXPECT_EQ(plain->manager.kinds[0].ring_size, 256u);
  EXPECT_NE(plain->manager.kinds[0].factory, nullptr);

  auto c = ParsePodConfig("kinds: [{kind: extra}, {kind: work, count: 3}]\n",
                          {"--kinds.work.ring_size=512"}, kinds);
  ASSERT_THAT(c.status(), IsOk());
  ASSERT_EQ(c->manager.kinds.size(), 3u);
  EXPECT_EQ(c->manager.kinds[0].kind, "work");
  EXPECT_EQ(c->manager.kinds[0].count, 3);          // The file's.
  EXPECT_EQ(c->manager.kinds[0].ring_size, 512u);   // The override's.
  EXPECT_NE(c->manager.kinds[0].factory, nullptr);  // The program's.
  EXPECT_EQ(c->manager.kinds[1].kind, "idle");
  EXPECT_EQ(c->manager.kinds[1].ring_size, 64u);
  EXPECT_EQ(c->manager.kinds[2].kind, "extra");  // Added, without a factory.
  EXPECT_EQ(c->manager.kinds[2].factory, nullptr);
}

TEST(PodConfigTest, ToStringShowsEveryKeyByItsPath) {
  auto c = ParsePodConfig(kFull, {"--updater_threads=3"});
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string s = c->ToString();
  EXPECT_THAT(s, HasSubstr("lease=2s "));
  EXPECT_THAT(s, HasSubstr("updater_threads=3 "));
  EXPECT_THAT(s, HasSubstr("kinds.vm.count=2 kinds.dns.count=1 "
                           "kinds.vm.ring_size=1024 "));
  EXPECT_THAT(s, HasSubstr("registry.type=redis "
                           "registry.address=unix:///run/redis.sock "));
  EXPECT_THAT(s, HasSubstr("registry.password=<redacted> registry.db=3 "));
  EXPECT_THAT(s, Not(HasSubstr("password_env")));
  // Every key ToString shows parses back to the same text.
  // (The password, redacted, is given again.)
  std::vector<std::string> overrides;
  for (absl::string_view part : absl::StrSplit(s, ' ')) {
    overrides.push_back(absl::StrCat("--", part));
  }
  auto again = ParsePodConfig("", overrides,
                              {NodeKindOptions{.kind = "vm"}, {.kind = "dns"}});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ToString(), s);
}

TEST(PodConfigTest, UpdaterThreadsIsAKey) {
  auto c = ParsePodConfig("updater_threads: 0\n", {},
                          {NodeKindOptions{.kind = "vm"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->updater_threads, 0);
  EXPECT_THAT(ParsePodConfig("", {"--updater_threads=2000"}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("updater_threads must be in 0..1024")));
}

TEST(PodConfigTest, TheKeysDefaultsComeFromPodConfigItself) {
  const PodConfig defaults;
  for (const PodConfigKey& key : PodConfigKeys()) {
    if (key.path == "lease") {
      EXPECT_EQ(key.default_value,
                absl::FormatDuration(defaults.manager.lease));
    }
    if (key.path == "updater_threads") {
      EXPECT_EQ(key.default_value, absl::StrCat(defaults.updater_threads));
    }
    if (key.path == "kinds.<kind>.ring_size") {
      EXPECT_EQ(key.default_value, "the program's, else 4096");
    }
    if (key.path == "registry.password_env") {
      EXPECT_EQ(key.default_value, "");
    }
  }
}

TEST(PodConfigTest, EveryKeyIsInThePodGuide) {
  std::ifstream in(SETPOINT_DOCS_DIR "/pod.md");
  std::stringstream guide;
  guide << in.rdbuf();
  ASSERT_FALSE(guide.str().empty());
  for (const PodConfigKey& key : PodConfigKeys()) {
    EXPECT_THAT(guide.str(),
                HasSubstr(absl::StrCat("| `", std::string(key.path), "` |")))
        << key.path;
  }
}

TEST(PodConfigTest, EveryListedKeyIsOneTheParserKnows) {
  ASSERT_FALSE(PodConfigKeys().empty());
  for (const PodConfigKey& key : PodConfigKeys()) {
    std::string path(key.path);
    if (size_t at = path.find("<kind>"); at != std::string::npos) {
      path.replace(at, 6, "vm");
    }
    EXPECT_FALSE(key.help.empty()) << path;
    EXPECT_FALSE(key.value.empty()) << path;
    if (path == "http.address") continue;  // Empty: the listener is off.
    // An empty value is refused only once the key is known.
    EXPECT_THAT(ParsePodConfig(kFull, {"--" + path + "="}).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(path + " must not be empty")))
        << path;
  }
}

TEST(PodConfigTest, RefusesBadInputNamingTheField) {
  struct Case {
    std::vector<std::string> overrides;
    std::string field;
  };
  std::vector<Case> cases = {
      {{"--kinds.vm.ring_size=0"}, "kinds.vm.ring_size"},
      {{"--kinds.vm.count=0"}, "count"},
      {{"--kinds.vm.count=two"}, "kinds.vm.count"},
      {{"--lease=250ms"}, "lease"},
      {{"--lease=soon"}, "lease"},
      {{"--registry.address=nohost"}, "address"},
      {{"--registry.type=etcd"}, "registry.type"},
      {{"--registry.db=-1"}, "db"},
      {{"--leese=3s"}, "leese"},
      {{"--kinds.vm.size=3"}, "kinds.vm.size"},
      {{"lease=3s"}, "override \"lease=\""},
      {{"--registry.password_env=SETPOINT_TEST_UNSET_VAR"},
       "registry.password_env"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(
        ParsePodConfig(kFull, c.overrides).status(),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)))
        << c.field;
  }
  EXPECT_THAT(
      ParsePodConfig("kinds:\n  - {kind: vm}\n  - {kind: vm}\n").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("appears twice")));
  EXPECT_THAT(
      ParsePodConfig("lease: [1, 2").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 1")));
  // A bad password never shows up in an error.
  auto s = ParsePodConfig(kFull, {"--registry.password=s3cr3t", "--db=x"});
  EXPECT_THAT(std::string(s.status().message()), Not(HasSubstr("s3cr3t")));
}

TEST(PodConfigTest, PasswordFromEnvironmentOrFile) {
  setenv("SETPOINT_TEST_PASSWORD", "from-env", 1);
  auto c =
      ParsePodConfig(kFull, {"--registry.password_env=SETPOINT_TEST_PASSWORD"});
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_EQ(c->redis.password, "from-env");
  std::string path = ::testing::TempDir() + "/pw";
  std::ofstream(path) << "from-file\n";
  c = ParsePodConfig(kFull, {"--registry.password_file=" + path});
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_EQ(c->redis.password, "from-file");
}

TEST(PodConfigTest, LoadsAFile) {
  std::string path = ::testing::TempDir() + "/pod.yaml";
  std::ofstream(path) << kFull;
  auto c = LoadPodConfig(path);
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_EQ(c->manager.pod_id, "pod-a");
  EXPECT_THAT(LoadPodConfig("/nonexistent/pod.yaml").status(),
              StatusIs(absl::StatusCode::kNotFound));
}

// ---- Refusals: each names the field (and the rule) ------------------------

// A minimal valid document, to add one bad line to.
constexpr char kMinimal[] = "kinds:\n  - {kind: vm}\n";

// kInvalidArgument with a message holding every one of `parts`.
::testing::Matcher<absl::Status> Refused(std::vector<std::string> parts) {
  std::vector<::testing::Matcher<std::string>> all;
  for (std::string& p : parts) all.push_back(HasSubstr(std::move(p)));
  return StatusIs(absl::StatusCode::kInvalidArgument,
                  ::testing::AllOfArray(all));
}

// A fresh directory under the test's temp dir.
std::string TempPath(const std::string& name) {
  std::string dir = ::testing::TempDir() + "/pod_config_test";
  std::filesystem::create_directories(dir);
  std::string path = dir + "/" + name;
  std::filesystem::remove_all(path);
  return path;
}

TEST(PodConfigTest, RefusesAnUnknownKeyWithoutAValue) {
  EXPECT_THAT(ParsePodConfig(std::string(kMinimal) + "leese:\n").status(),
              Refused({"leese (line 3)", "is not a known key"}));
  EXPECT_THAT(ParsePodConfig(std::string(kMinimal) +
                             "registry: {type: redis, adress: }")
                  .status(),
              Refused({"registry.adress", "is not a known key"}));
  EXPECT_THAT(ParsePodConfig("kinds:\n  - {kind: vm, size: }\n").status(),
              Refused({"kinds[0].size", "is not a known key"}));
}

TEST(PodConfigTest, RefusesAnEmptyRegistryType) {
  EXPECT_THAT(
      ParsePodConfig(std::string(kMinimal) + "registry: {type: }\n").status(),
      Refused({"registry.type (line 3)", "must not be empty"}));
  EXPECT_THAT(ParsePodConfig(kMinimal, {"--registry.type="}).status(),
              Refused({"registry.type", "must not be empty"}));
}

TEST(PodConfigTest, RefusesEmptyValuesOfKnownKeys) {
  struct Case {
    std::string line;
    std::string field;
  };
  std::vector<Case> cases = {
      {"lease:", "lease (line 3)"},
      {"lease: ~", "lease (line 3)"},
      {"lease: null", "lease (line 3)"},
      {"pod_id: ''", "pod_id (line 3)"},
      {"poll_interval:", "poll_interval (line 3)"},
      {"fence_margin:", "fence_margin (line 3)"},
      {"operation_timeout:", "operation_timeout (line 3)"},
      {"registry:", "registry (line 3)"},
      {"registry: {type: redis, address: }", "registry.address (line 3)"},
      {"registry: {type: redis, db: }", "registry.db (line 3)"},
      {"registry: {type: redis, password: ''}", "registry.password (line 3)"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ParsePodConfig(absl::StrCat(kMinimal, c.line, "\n")).status(),
                Refused({c.field, "must not be empty"}))
        << c.line;
  }
  EXPECT_THAT(ParsePodConfig("kinds:\n").status(),
              Refused({"kinds (line 1)", "must not be empty"}));
  EXPECT_THAT(ParsePodConfig("kinds:\n  - {kind: vm, count: }\n").status(),
              Refused({"kinds.vm.count (line 2)", "must not be empty"}));
  EXPECT_THAT(ParsePodConfig("kinds:\n  - {kind: ''}\n").status(),
              Refused({"kinds[0].kind", "must not be empty"}));
}

TEST(PodConfigTest, RefusesRegistrySettingsWithoutAType) {
  EXPECT_THAT(
      ParsePodConfig(std::string(kMinimal) + "registry: {address: h:1}\n")
          .status(),
      Refused({"registry.type", "must be given", "whole ring"}));
  EXPECT_THAT(ParsePodConfig(kMinimal, {"--registry.namespace=prod"}).status(),
              Refused({"registry.type", "must be given"}));
  // An explicit memory registry may keep the file's Redis settings.
  EXPECT_THAT(ParsePodConfig(kFull, {"--registry.type=memory"}).status(),
              IsOk());
}

TEST(PodConfigTest, RefusesALeaseShorterThanTwoPollIntervals) {
  EXPECT_THAT(
      ParsePodConfig(kMinimal, {"--lease=550ms", "--poll_interval=500ms"})
          .status(),
      Refused(
          {"lease (550ms) must be >= 2 * poll_interval (500ms)", "fail once"}));
  // The sharded example's test matches "lease .* must be > poll_interval".
  EXPECT_THAT(ParsePodConfig(kMinimal, {"--lease=100ms"}).status(),
              Refused({"lease (100ms) must be > poll_interval (500ms)"}));
  EXPECT_THAT(ParsePodConfig(kMinimal, {"--lease=1s", "--poll_interval=500ms",
                                        "--fence_margin=499ms"})
                  .status(),
              IsOk());
}

TEST(PodConfigTest, RefusesADefaultFenceMarginThatFencesEveryCycle) {
  // max(20% of 1s, 500ms) = 500ms is not < 1s - 500ms.
  EXPECT_THAT(
      ParsePodConfig(kMinimal, {"--lease=1s", "--poll_interval=500ms"})
          .status(),
      Refused({"fence_margin (500ms, the default max(20% of lease, "
               "poll_interval)) must leave more than poll_interval (500ms) of "
               "the lease (1s)"}));
}

TEST(PodConfigTest, RefusesAFenceMarginOfLeaseMinusPollOrMore) {
  EXPECT_THAT(ParsePodConfig(kMinimal, {"--fence_margin=2500ms"}).status(),
              Refused({"fence_margin (2.5s) must leave more than "
                       "poll_interval (500ms) of the lease (3s)"}));
  EXPECT_THAT(ParsePodConfig(kMinimal, {"--fence_margin=2499ms"}).status(),
              IsOk());
}

TEST(PodConfigTest, RefusesDurationsThatAreNotWholeMilliseconds) {
  for (const char* o :
       {"--lease=2500500us", "--poll_interval=1.5ms", "--fence_margin=600.5ms",
        "--operation_timeout=1001us", "--registry.command_timeout=300.1ms"}) {
    std::string field(
        std::string_view(o).substr(2, std::string_view(o).find('=') - 2));
    EXPECT_THAT(ParsePodConfig(kFull, {o}).status(),
                Refused({field, "whole number of milliseconds"}))
        << o;
  }
}

TEST(PodConfigTest, RefusesDurationsBelowOneMillisecond) {
  for (const char* o :
       {"--poll_interval=500us", "--poll_interval=0", "--lease=-3s",
        "--fence_margin=-1ms", "--registry.connect_timeout=0s"}) {
    std::string field(
        std::string_view(o).substr(2, std::string_view(o).find('=') - 2));
    EXPECT_THAT(ParsePodConfig(kFull, {o}).status(),
                Refused({field, "must be >= 1ms"}))
        << o;
  }
}

TEST(PodConfigTest, RefusesInfiniteAndHugeDurations) {
  for (const char* o :
       {"--lease=inf", "--operation_timeout=inf", "--fence_margin=inf",
        "--poll_interval=-inf", "--registry.command_timeout=inf"}) {
    std::string field(
        std::string_view(o).substr(2, std::string_view(o).find('=') - 2));
    EXPECT_THAT(ParsePodConfig(kFull, {o}).status(),
                Refused({field, "must be finite"}))
        << o;
  }
  EXPECT_THAT(ParsePodConfig(kFull, {"--lease=25h"}).status(),
              Refused({"lease", "must be <= 24h"}));
}

TEST(PodConfigTest, RefusesCountsAbove1024) {
  EXPECT_THAT(
      ParsePodConfig(kMinimal, {"--kinds.vm.count=2147483647"}).status(),
      Refused({"kinds.vm.count", "must be in 1..1024"}));
  EXPECT_THAT(ParsePodConfig("kinds:\n  - {kind: vm, count: 1025}\n").status(),
              Refused({"kinds.vm.count (line 2)", "1..1024"}));
  EXPECT_THAT(ParsePodConfig(kMinimal, {"--kinds.vm.count=1024"}).status(),
              IsOk());
}

TEST(PodConfigTest, NudgeBurstIsAPositiveCount) {
  auto c = ParsePodConfig(kMinimal, {"--nudge_burst=8"});
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_EQ(c->manager.nudge_burst, 8);
  EXPECT_THAT(ParsePodConfig(kMinimal, {"--nudge_burst=0"}).status(),
              Refused({"nudge_burst", "1..1000"}));
}

TEST(PodConfigTest, StaticMembershipIsTrueOrFalseAndNeedsAPodId) {
  auto c = ParsePodConfig(kMinimal, {"--static_membership=true", "--pod_id=a"});
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_TRUE(c->manager.static_membership);
  c = ParsePodConfig(
      "pod_id: a\nstatic_membership: false\nkinds:\n  - {kind: "
      "vm}\n");
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_FALSE(c->manager.static_membership);
  EXPECT_THAT(
      ParsePodConfig(kMinimal, {"--static_membership=yes", "--pod_id=a"})
          .status(),
      Refused({"static_membership", "true or false", "\"yes\""}));
  // The default id changes with every start: nothing would take the places.
  EXPECT_THAT(ParsePodConfig(kMinimal, {"--static_membership=true"}).status(),
              Refused({"static_membership", "pod_id"}));
}

TEST(PodConfigTest, RefusesMoreThan64Kinds) {
  std::string text = "kinds:\n";
  for (int i = 0; i < 65; ++i) absl::StrAppend(&text, "  - {kind: k", i, "}\n");
  EXPECT_THAT(ParsePodConfig(text).status(),
              Refused({"kinds", "at most 64 kinds"}));
  std::vector<std::string> overrides;
  for (int i = 0; i < 65; ++i) {
    overrides.push_back(absl::StrCat("--kinds.k", i, ".count=1"));
  }
  EXPECT_THAT(ParsePodConfig("", overrides).status(),
              Refused({"kinds", "at most 64 kinds"}));
}

TEST(PodConfigTest, RefusesRingSizesOutside1To2To20) {
  for (const char* o :
       {"--kinds.vm.ring_size=0", "--kinds.vm.ring_size=-1",
        "--kinds.vm.ring_size=1048577", "--kinds.vm.ring_size=4294967296"}) {
    EXPECT_THAT(ParsePodConfig(kMinimal, {o}).status(),
                Refused({"kinds.vm.ring_size", "must be in 1..1048576"}))
        << o;
  }
  EXPECT_THAT(
      ParsePodConfig(kMinimal, {"--kinds.vm.ring_size=1048576"}).status(),
      IsOk());
}

TEST(PodConfigTest, RefusesDatabasesOutsideAnInt) {
  EXPECT_THAT(ParsePodConfig(kFull, {"--registry.db=99999999999"}).status(),
              Refused({"registry.db", "must be in 0..2147483647"}));
}

TEST(PodConfigTest, RefusesControlCharactersAndSpacesInIds) {
  EXPECT_THAT(
      ParsePodConfig(std::string(kMinimal) + "pod_id: \"pod\\ta\"\n").status(),
      Refused({"pod_id (line 3)", "\\x09 at byte 3"}));
  EXPECT_THAT(ParsePodConfig(kMinimal, {"--pod_id=pod a"}).status(),
              Refused({"pod_id", "printable ASCII without spaces", "\\x20"}));
  EXPECT_THAT(ParsePodConfig("kinds:\n  - {kind: \"v\\x01m\"}\n").status(),
              Refused({"kinds[0].kind (line 2)", "\\x01 at byte 1"}));
  EXPECT_THAT(ParsePodConfig(kFull, {"--registry.namespace=pr\nod"}).status(),
              Refused({"registry.namespace", "\\x0a at byte 2"}));
  EXPECT_THAT(ParsePodConfig(kFull, {"--registry.username=c\x7ftrl"}).status(),
              Refused({"registry.username", "\\x7f at byte 1"}));
  EXPECT_THAT(ParsePodConfig("", {"--kinds.v m.count=1"}).status(),
              Refused({"kinds.v m.count kind", "\\x20 at byte 1"}));
  EXPECT_THAT(ParsePodConfig("", {"--pod_id=caf\xc3\xa9", "--kinds.vm.count=1"})
                  .status(),
              Refused({"pod_id", "\\xc3 at byte 3"}));
}

TEST(PodConfigTest, RefusesControlCharactersInOtherValues) {
  EXPECT_THAT(
      ParsePodConfig(kFull, {"--registry.address=127.0.0.1:6379\r"}).status(),
      Refused({"registry.address", "control characters", "\\x0d at byte 14"}));
  EXPECT_THAT(ParsePodConfig(kFull, {"--lease=3s\n"}).status(),
              Refused({"lease", "\\x0a"}));
}

TEST(PodConfigTest, RefusesKindNamesWithDotsOrSlashes) {
  EXPECT_THAT(ParsePodConfig("kinds:\n  - {kind: a.b}\n").status(),
              Refused({"kinds[0].kind", "must not contain '.'"}));
  EXPECT_THAT(ParsePodConfig("kinds:\n  - {kind: a/b}\n").status(),
              Refused({"kinds[0].kind", "'/'"}));
  EXPECT_THAT(ParsePodConfig(kMinimal, {"--pod_id=a/b"}).status(),
              Refused({"pod_id", "must not contain '/'"}));
}

TEST(PodConfigTest, RefusesDuplicateKeysNamingBothLines) {
  EXPECT_THAT(
      ParsePodConfig(std::string(kMinimal) + "lease: 3s\nlease: 4s\n").status(),
      Refused({"lease appears twice", "lines 3 and 4"}));
  EXPECT_THAT(ParsePodConfig(std::string(kMinimal) +
                             "registry:\n  type: redis\n  db: 1\n  db: 2\n")
                  .status(),
              Refused({"registry.db appears twice", "lines 5 and 6"}));
  EXPECT_THAT(
      ParsePodConfig("kinds:\n  - {kind: vm, count: 1, count: 2}\n").status(),
      Refused({"kinds[0].count appears twice", "lines 2 and 2"}));
  EXPECT_THAT(
      ParsePodConfig(std::string(kMinimal) + "kinds:\n  - {kind: dns}\n")
          .status(),
      Refused({"kinds appears twice", "lines 1 and 3"}));
}

TEST(PodConfigTest, RefusesSeveralDocuments) {
  EXPECT_THAT(
      ParsePodConfig(std::string(kMinimal) + "---\nlease: 4s\n").status(),
      Refused({"line 3", "second YAML document"}));
  EXPECT_THAT(ParsePodConfig(std::string(kMinimal) + "...\n---\n").status(),
              Refused({"second YAML document"}));
}

TEST(PodConfigTest, RefusesAliases) {
  EXPECT_THAT(ParsePodConfig("lease: &l 3s\npoll_interval: *l\n").status(),
              Refused({"line 2", "aliases"}));
  // An alias to the sequence it is in would make a cycle.
  EXPECT_THAT(ParsePodConfig("kinds: &k [*k]\n").status(),
              Refused({"line 1", "aliases"}));
}

TEST(PodConfigTest, RefusesAnAliasBombQuickly) {
  // Billion laughs: 9^9 "lol"s from a few hundred bytes.
  std::string bomb =
      "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\","
      "\"lol\",\"lol\",\"lol\"]\n";
  for (char c = 'b'; c <= 'i'; ++c) {
    absl::StrAppend(&bomb, std::string(1, c), ": &", std::string(1, c), " [");
    for (int i = 0; i < 9; ++i) {
      absl::StrAppend(&bomb, i == 0 ? "" : ",", "*", std::string(1, c - 1));
    }
    absl::StrAppend(&bomb, "]\n");
  }
  absl::Time start = absl::Now();
  EXPECT_THAT(ParsePodConfig(bomb).status(), Refused({"line 2", "aliases"}));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
}

TEST(PodConfigTest, RefusesDeepNesting) {
  std::string text = "lease: " + std::string(100, '[') + std::string(100, ']');
  EXPECT_THAT(ParsePodConfig(text).status(), Refused({"nests deeper than 32"}));
}

TEST(PodConfigTest, RefusesWhatIsNotAMapOfSettings) {
  EXPECT_THAT(ParsePodConfig("- lease\n- 3s\n").status(),
              Refused({"the document (line 1)", "must be a map"}));
  EXPECT_THAT(
      ParsePodConfig(std::string(kMinimal) + "lease: {a: 1}\n").status(),
      Refused({"lease (line 3)", "must be a single value, not a map"}));
  EXPECT_THAT(
      ParsePodConfig(std::string(kMinimal) + "registry: redis\n").status(),
      Refused({"registry (line 3)", "must be a map"}));
  EXPECT_THAT(ParsePodConfig("kinds: {kind: vm}\n").status(),
              Refused({"kinds (line 1)", "must be a list"}));
  EXPECT_THAT(ParsePodConfig(std::string(kMinimal) + "? [a]\n: 1\n").status(),
              Refused({"the document", "keys must be names"}));
}

TEST(PodConfigTest, RefusesTextLargerThan1MiB) {
  std::string text(kPodConfigMaxBytes + 1, '#');
  EXPECT_THAT(ParsePodConfig(text).status(),
              Refused({"1048577 bytes", "limit is 1048576"}));
}

TEST(PodConfigTest, LoadRefusesDevZeroQuickly) {
  absl::Time start = absl::Now();
  EXPECT_THAT(LoadPodConfig("/dev/zero").status(),
              Refused({"pod config /dev/zero: ", "not a regular file",
                       "character device"}));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
}

TEST(PodConfigTest, LoadRefusesADirectory) {
  std::string dir = TempPath("dir");
  std::filesystem::create_directory(dir);
  EXPECT_THAT(LoadPodConfig(dir).status(), Refused({dir, "is a directory"}));
}

TEST(PodConfigTest, LoadRefusesAFifoWithoutBlocking) {
  std::string fifo = TempPath("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(LoadPodConfig(fifo).status(),
              Refused({fifo, "not a regular file (a FIFO)"}));
}

TEST(PodConfigTest, LoadRefusesAFileLargerThan1MiB) {
  std::string path = TempPath("big.yaml");
  std::ofstream(path) << kMinimal << std::string(kPodConfigMaxBytes, '#');
  EXPECT_THAT(LoadPodConfig(path).status(),
              Refused({path, "limit is 1048576"}));
}

TEST(PodConfigTest, LoadNamesThePathInParseErrors) {
  std::string path = TempPath("pod.yaml");
  std::ofstream(path) << kMinimal << "leese: 3s\n";
  EXPECT_THAT(LoadPodConfig(path).status(),
              Refused({"pod config " + path + ": leese (line 3)"}));
}

TEST(PodConfigTest, RefusesAPasswordFileThatIsNotARegularFile) {
  std::string dir = TempPath("pwdir");
  std::filesystem::create_directory(dir);
  EXPECT_THAT(
      ParsePodConfig(kFull, {"--registry.password_file=" + dir}).status(),
      Refused({"registry.password_file", dir, "is a directory"}));
  EXPECT_THAT(
      ParsePodConfig(kFull, {"--registry.password_file=/dev/zero"}).status(),
      Refused({"registry.password_file", "/dev/zero", "not a regular file"}));
  EXPECT_THAT(
      ParsePodConfig(kFull, {"--registry.password_file=/nonexistent/pw"})
          .status(),
      Refused({"registry.password_file", "/nonexistent/pw"}));
}

TEST(PodConfigTest, RefusesAnEmptyPasswordFile) {
  std::string path = TempPath("empty_pw");
  std::ofstream(path).flush();
  EXPECT_THAT(
      ParsePodConfig(kFull, {"--registry.password_file=" + path}).status(),
      Refused({"registry.password_file", path, "AUTH would be skipped"}));
  std::ofstream(path) << "\nsecret\n";
  EXPECT_THAT(
      ParsePodConfig(kFull, {"--registry.password_file=" + path}).status(),
      Refused({"registry.password_file", "no password on its first line"}));
}

TEST(PodConfigTest, RefusesAnEmptyPasswordEnvironmentVariable) {
  setenv("SETPOINT_TEST_EMPTY_PASSWORD", "", 1);
  EXPECT_THAT(
      ParsePodConfig(kFull,
                     {"--registry.password_env=SETPOINT_TEST_EMPTY_PASSWORD"})
          .status(),
      Refused({"registry.password_env", "which is empty"}));
}

TEST(PodConfigTest, RefusesTwoPasswordSources) {
  setenv("SETPOINT_TEST_PASSWORD2", "x", 1);
  std::string text =
      std::string(kFull) + "  password_env: SETPOINT_TEST_PASSWORD2\n";
  EXPECT_THAT(ParsePodConfig(text).status(),
              Refused({"registry.password and registry.password_env",
                       "exclude each other"}));
  EXPECT_THAT(ParsePodConfig(
                  kMinimal, {"--registry.type=redis", "--registry.password=a",
                             "--registry.password_env=SETPOINT_TEST_PASSWORD2"})
                  .status(),
              Refused({"exclude each other"}));
}

TEST(PodConfigTest, OverridesGetTheSameChecks) {
  struct Case {
    std::string override;
    std::vector<std::string> parts;
  };
  std::vector<Case> cases = {
      {"--leese=", {"leese", "is not a known key"}},
      {"--registry=redis", {"registry", "is not a known key"}},
      {"--registry.adress=h:1", {"registry.adress", "is not a known key"}},
      {"--kinds.vm=1", {"kinds.vm", "must look like kinds.<kind>."}},
      {"--kinds..count=1", {"kinds..count kind", "must not be empty"}},
      {"--lease=", {"lease", "must not be empty"}},
      {"--lease=1.5ms", {"lease", "whole number of milliseconds"}},
      {"--lease=3", {"lease", "is not a duration"}},
      {"--pod_id=a\tb", {"pod_id", "\\x09"}},
      {"--=3s", {"override \"--=\"", "--path=value"}},
      {"--lease", {"override \"--lease\"", "--path=value"}},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(ParsePodConfig(kFull, {c.override}).status(), Refused(c.parts))
        << c.override;
  }
  // A malformed override never echoes its value: it may be a password.
  auto s = ParsePodConfig(kFull, {"registry.password=s3cr3t"});
  EXPECT_THAT(s.status(), Refused({"override \"registry.password=\""}));
  EXPECT_THAT(std::string(s.status().message()), Not(HasSubstr("s3cr3t")));
}

TEST(PodConfigTest, AcceptsAnAnchorWithoutAlias) {
  EXPECT_THAT(ParsePodConfig("kinds: &k\n  - {kind: vm}\n").status(), IsOk());
}

}  // namespace
}  // namespace setpoint

namespace setpoint {
namespace {

using ::setpoint::testing::IsOk;
using ::setpoint::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kSentinel[] = R"(
kinds:
  - kind: vm
registry:
  type: redis
  sentinels: 10.0.0.7:26379, 10.0.0.8:26379,[::1]:26380
  master_name: setpoint
  sentinel_username: watcher
  sentinel_password: s3cret
  password: hunter2
  grant_wait_replicas: 1
  grant_wait_timeout: 200ms
)";

TEST(PodConfigTest, SentinelSettings) {
  auto c = ParsePodConfig(kSentinel);
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_THAT(c->redis.sentinels,
              ElementsAre("10.0.0.7:26379", "10.0.0.8:26379", "[::1]:26380"));
  EXPECT_EQ(c->redis.master_name, "setpoint");
  EXPECT_EQ(c->redis.sentinel_username, "watcher");
  EXPECT_EQ(c->redis.sentinel_password, "s3cret");
  EXPECT_EQ(c->redis.password, "hunter2");
  EXPECT_EQ(c->redis.grant_wait_replicas, 1);
  EXPECT_EQ(c->redis.grant_wait_timeout, absl::Milliseconds(200));
  // The sentinels' password is never shown.
  EXPECT_THAT(c->ToString(), Not(HasSubstr("s3cret")));
  EXPECT_THAT(c->ToString(), HasSubstr("registry.sentinels="));
}

TEST(PodConfigTest, SentinelSettingsRefusedTogetherOrAlone) {
  EXPECT_THAT(ParsePodConfig(kSentinel, {"--registry.address=h:6379"}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("registry.address and registry.sentinels "
                                 "exclude each other")));
  EXPECT_THAT(ParsePodConfig("kinds: [{kind: vm}]\nregistry: {type: redis, "
                             "sentinels: 'a:1'}\n")
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("master_name must be set with sentinels")));
  EXPECT_THAT(
      ParsePodConfig(kSentinel, {"--registry.sentinels=a:1,,b:2"}).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("has an empty address in its list")));
  EXPECT_THAT(
      ParsePodConfig(
          "kinds: [{kind: vm}]\nregistry: {type: redis, sentinels: 'a:1', "
          "master_name: m, sentinel_password: x, sentinel_password_env: "
          "HOME}\n")
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("exclude each other: give one")));
  // An override of one source of the sentinels' password replaces the
  // file's.
  auto c = ParsePodConfig(kSentinel, {"--registry.sentinel_password_env=HOME"});
  ASSERT_THAT(c.status(), IsOk());
  EXPECT_EQ(c->redis.sentinel_password, std::getenv("HOME"));
}

}  // namespace
}  // namespace setpoint
