// NullLogger: a spdlog logger that formats at the level it is given but
// writes nowhere, for tests and benchmarks that pass loggers in options.
//
//   Scheduler scheduler({.logger = setpoint::testing::NullLogger()});
//   // Exercise the debug lines too, still without output:
//   Runner runner({.logger = NullLogger(spdlog::level::trace)});
//
// Thread safety: the logger is as thread-safe as any spdlog logger.
#ifndef SETPOINT_TESTING_NULL_LOGGER_H_
#define SETPOINT_TESTING_NULL_LOGGER_H_

#include <memory>

#include "spdlog/logger.h"

namespace setpoint::testing {

// Returns a new logger named "null" with no sinks, at `level`.
inline std::shared_ptr<spdlog::logger> NullLogger(
    spdlog::level::level_enum level = spdlog::level::info) {
  auto logger = std::make_shared<spdlog::logger>("null");
  logger->set_level(level);
  return logger;
}

}  // namespace setpoint::testing

#endif  // SETPOINT_TESTING_NULL_LOGGER_H_
