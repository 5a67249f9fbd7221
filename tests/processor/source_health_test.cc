// SourceHealth read from one thread while another records: the reader's
// status is its own (no storage shared with the writer's record).
#include "setpoint/processor/source_health.h"

#include <atomic>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace setpoint {
namespace {

using ::testing::HasSubstr;

TEST(SourceHealthTest, AStatusReadOnAnotherThreadSharesNothingWithTheRecord) {
  SourceHealth health({.name = "zone"});
  health.Started();
  constexpr int kFailures = 2000;
  std::atomic<bool> done{false};
  // The reader copies the last error out, reads its message and drops it
  // while the writer replaces the record's error with a new one: under
  // ThreadSanitizer a shared representation showed as a race here.
  std::thread reader([&] {
    while (!done.load()) {
      std::string why = health.NotReady();
      std::string json;
      health.AppendJson(&json);
      ASSERT_THAT(why, HasSubstr("source zone"));
      ASSERT_THAT(json, HasSubstr("\"source\":\"zone\""));
    }
  });
  for (int i = 0; i < kFailures; ++i) {
    health.ListFailed(
        absl::UnavailableError(absl::StrCat("PowerDNS: connection refused #", i,
                                            " (a message on the heap)")),
        absl::Milliseconds(1));
  }
  done.store(true);
  reader.join();
  SourceStatus s = health.status();
  EXPECT_EQ(s.list_failures, kFailures);
  EXPECT_EQ(s.consecutive_failures, kFailures);
  EXPECT_THAT(std::string(s.last_error.message()),
              HasSubstr(absl::StrCat("#", kFailures - 1, " ")));
  EXPECT_THAT(health.NotReady(),
              HasSubstr(absl::StrCat(kFailures, " failures in a row")));
}

}  // namespace
}  // namespace setpoint
