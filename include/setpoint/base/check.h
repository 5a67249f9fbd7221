// Check macros for broken invariants (bugs, never bad input).
//
// A failed check writes file, line and the condition to stderr, logs the same
// at critical level through spdlog's default logger, and aborts. Bad input must
// be refused with an absl::Status instead.
//
//   SETPOINT_CHECK(stack.empty());
//   SETPOINT_CHECK_MSG(n >= 0, "negative count n={}", n);
//
// Thread safety: safe from any thread.
#ifndef SETPOINT_BASE_CHECK_H_
#define SETPOINT_BASE_CHECK_H_

#include <string>
#include <string_view>

#include "absl/base/optimization.h"
#include "spdlog/fmt/fmt.h"

namespace setpoint::internal {
[[noreturn]] void CheckFailed(const char* file, int line, const char* condition,
                              std::string_view message);
}  // namespace setpoint::internal

// Aborts with a critical log line when `cond` is false.
#define SETPOINT_CHECK(cond)                                            \
  do {                                                                  \
    if (ABSL_PREDICT_FALSE(!(cond)))                                    \
      ::setpoint::internal::CheckFailed(__FILE__, __LINE__, #cond, ""); \
  } while (false)

// Like SETPOINT_CHECK, with a fmt-style message formatted only on failure.
#define SETPOINT_CHECK_MSG(cond, ...)                                \
  do {                                                               \
    if (ABSL_PREDICT_FALSE(!(cond)))                                 \
      ::setpoint::internal::CheckFailed(__FILE__, __LINE__, #cond,   \
                                        ::fmt::format(__VA_ARGS__)); \
  } while (false)

#endif  // SETPOINT_BASE_CHECK_H_
