#include "setpoint/node/pod_config.h"

#include <cstdlib>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint {
namespace {

using ::setpoint::testing::IsOk;
using ::setpoint::testing::StatusIs;
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
      {{"lease=3s"}, "lease=3s"},
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

}  // namespace
}  // namespace setpoint
