#include "setpoint/base/format.h"

#include "gtest/gtest.h"
#include "setpoint/base/json.h"

namespace setpoint {
namespace {

TEST(Format, AbslTypes) {
  EXPECT_EQ(fmt::format("{}", absl::OkStatus()), "OK");
  EXPECT_EQ(fmt::format("err={}", absl::UnavailableError("redis down")),
            "err=UNAVAILABLE: redis down");
  EXPECT_EQ(fmt::format("{}", absl::StatusCode::kAborted), "ABORTED");
  EXPECT_EQ(fmt::format("after={}", absl::Milliseconds(1500)), "after=1.5s");
  EXPECT_EQ(fmt::format("{}", absl::FromUnixSeconds(0)),
            "1970-01-01T00:00:00+00:00");
}

TEST(AppendJsonString, EscapesWhatJsonNeedsAndKeepsValidUtf8) {
  std::string out;
  AppendJsonString(&out,
                   std::string_view("a\"b\\c\n\t\x01\x7f\xc3\xa9\xff", 12));
  EXPECT_EQ(out, "\"a\\\"b\\\\c\\n\\t\\u0001\\u007f\xc3\xa9\\ufffd\"");
}

}  // namespace
}  // namespace setpoint
