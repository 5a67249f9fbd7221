// gMock matchers for absl::Status and absl::StatusOr, in the shape of
// Abseil's (which Debian's abseil 20220623 lacks).
//
//   EXPECT_THAT(DoThing(), setpoint::testing::IsOk());
//   EXPECT_THAT(Parse("x"), StatusIs(absl::StatusCode::kInvalidArgument,
//                                    HasSubstr("port")));
//   SETPOINT_ASSERT_OK_AND_ASSIGN(auto value, Parse("80"));
//
// Thread safety: stateless.
#ifndef SETPOINT_TESTING_STATUS_MATCHERS_H_
#define SETPOINT_TESTING_STATUS_MATCHERS_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace setpoint::testing {
namespace internal {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

}  // namespace internal

// Matches an OK absl::Status or absl::StatusOr.
MATCHER(IsOk, negation ? "is not OK" : "is OK") {
  const absl::Status& s = internal::GetStatus(arg);
  if (!s.ok()) *result_listener << "status is " << s.ToString();
  return s.ok();
}

// Matches a Status/StatusOr whose code is `code`.
MATCHER_P(StatusIs, code,
          std::string(negation ? "has a code other than " : "has code ") +
              absl::StatusCodeToString(code)) {
  const absl::Status& s = internal::GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code;
}

// Matches a Status/StatusOr whose code is `code` and whose message matches
// `message_matcher` (a string or a matcher such as HasSubstr("x")).
MATCHER_P2(StatusIs, code, message_matcher,
           std::string(negation ? "does not have code " : "has code ") +
               absl::StatusCodeToString(code) + " and a message that " +
               ::testing::DescribeMatcher<std::string>(message_matcher,
                                                       negation)) {
  const absl::Status& s = internal::GetStatus(arg);
  *result_listener << "status is " << s.ToString();
  return s.code() == code && ::testing::Matches(::testing::Matcher<std::string>(
                                 message_matcher))(std::string(s.message()));
}

}  // namespace setpoint::testing

#define SETPOINT_EXPECT_OK(expr) \
  EXPECT_THAT((expr), ::setpoint::testing::IsOk())
#define SETPOINT_ASSERT_OK(expr) \
  ASSERT_THAT((expr), ::setpoint::testing::IsOk())

// Asserts that `rexpr` (a StatusOr) is OK and moves its value into `lhs`.
#define SETPOINT_ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  SETPOINT_INTERNAL_ASSERT_OK_AND_ASSIGN(         \
      SETPOINT_TESTING_CONCAT(setpoint_statusor_, __LINE__), lhs, rexpr)
#define SETPOINT_TESTING_CONCAT_IMPL(a, b) a##b
#define SETPOINT_TESTING_CONCAT(a, b) SETPOINT_TESTING_CONCAT_IMPL(a, b)
#define SETPOINT_INTERNAL_ASSERT_OK_AND_ASSIGN(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                           \
  ASSERT_THAT(tmp, ::setpoint::testing::IsOk());                \
  lhs = std::move(tmp).value()

#endif  // SETPOINT_TESTING_STATUS_MATCHERS_H_
