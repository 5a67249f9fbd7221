#include "setpoint/base/callback.h"

#include <stdexcept>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/base/status.h"

namespace setpoint {
namespace {

using ::testing::HasSubstr;

TEST(CallUserCodeTest, ReturnsWhatTheCallbackReturns) {
  EXPECT_TRUE(CallUserCode("void", [] {}).ok());
  EXPECT_EQ(
      CallUserCode("status", [] { return absl::NotFoundError("x"); }).code(),
      absl::StatusCode::kNotFound);
  absl::StatusOr<int> v = CallUserCode("value", [] { return 7; });
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 7);
  absl::StatusOr<std::string> s = CallUserCode(
      "statusor", []() -> absl::StatusOr<std::string> { return "ok"; });
  EXPECT_EQ(*s, "ok");
  EXPECT_FALSE(ThrewException(absl::NotFoundError("x")));
}

TEST(CallUserCodeTest, WhatItThrowsIsOneCodeNamingTheCallback) {
  absl::Status s = CallUserCode(
      "create", []() -> absl::Status { throw std::runtime_error("boom"); });
  EXPECT_EQ(s.code(), kThrewCode);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("create threw: boom"));
  EXPECT_TRUE(ThrewException(s));
  EXPECT_TRUE(ThrewException(Annotate(s, "sync records")));
  absl::StatusOr<int> v = CallUserCode("list", []() -> int { throw 42; });
  EXPECT_EQ(v.status().code(), kThrewCode);
  EXPECT_THAT(std::string(v.status().message()),
              HasSubstr("list threw a non-standard exception"));
}

}  // namespace
}  // namespace setpoint
