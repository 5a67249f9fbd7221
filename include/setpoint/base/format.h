// fmt formatters for the absl types setpoint logs: absl::Status,
// absl::StatusCode, absl::Duration and absl::Time; and HumanDuration, a
// duration rounded for people (probes, status lines).
//
//   SPDLOG_LOGGER_WARN(logger, "retrying op={} err={} after={}",
//                      op, status, delay);
//
// Thread safety: stateless; safe from any thread.
#ifndef SETPOINT_BASE_FORMAT_H_
#define SETPOINT_BASE_FORMAT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "spdlog/fmt/fmt.h"

template <>
struct fmt::formatter<absl::Status> : fmt::formatter<std::string_view> {
  template <typename FormatContext>
  auto format(const absl::Status& s, FormatContext& ctx) const
      -> decltype(ctx.out()) {
    std::string text = s.ToString();
    return fmt::formatter<std::string_view>::format(text, ctx);
  }
};

template <>
struct fmt::formatter<absl::StatusCode> : fmt::formatter<std::string_view> {
  template <typename FormatContext>
  auto format(absl::StatusCode c, FormatContext& ctx) const
      -> decltype(ctx.out()) {
    std::string text = absl::StatusCodeToString(c);
    return fmt::formatter<std::string_view>::format(text, ctx);
  }
};

template <>
struct fmt::formatter<absl::Duration> : fmt::formatter<std::string_view> {
  template <typename FormatContext>
  auto format(absl::Duration d, FormatContext& ctx) const
      -> decltype(ctx.out()) {
    std::string text = absl::FormatDuration(d);
    return fmt::formatter<std::string_view>::format(text, ctx);
  }
};

template <>
struct fmt::formatter<absl::Time> : fmt::formatter<std::string_view> {
  template <typename FormatContext>
  auto format(absl::Time t, FormatContext& ctx) const -> decltype(ctx.out()) {
    std::string text =
        absl::FormatTime(absl::RFC3339_full, t, absl::UTCTimeZone());
    return fmt::formatter<std::string_view>::format(text, ctx);
  }
};

namespace setpoint {

// A duration for a person to read: whole milliseconds under a second,
// tenths of a second above ("250ms", "3.2s", "1m30.5s"); "0s" under a
// millisecond. Negative durations read as their size with a '-'.
inline std::string HumanDuration(absl::Duration d) {
  const absl::Duration size = absl::AbsDuration(d);
  if (size < absl::Milliseconds(1)) return "0s";
  const absl::Duration unit = size >= absl::Seconds(1) ? absl::Milliseconds(100)
                                                       : absl::Milliseconds(1);
  return absl::FormatDuration(absl::Trunc(d, unit));
}

}  // namespace setpoint

#endif  // SETPOINT_BASE_FORMAT_H_
