// Debug and trace logging for code in public headers (templates and inline
// functions) that is compiled in the user's translation units.
//
//   SETPOINT_LOG_DEBUG(logger_, "store filter changed store={} forgot={}",
//                      name(), left.size());
//
// spdlog's SPDLOG_LOGGER_DEBUG and SPDLOG_LOGGER_TRACE are removed at compile
// time unless SPDLOG_ACTIVE_LEVEL allows them, and spdlog's default keeps only
// info and above. The library's .cc files set that level for themselves, but
// a header is compiled with the user's settings, so its debug lines would
// vanish. These macros are always compiled in: the logger's level decides at
// run time, and the arguments are evaluated only when the line is logged (or
// kept for the logger's backtrace). Lines carry file, line and function like
// spdlog's macros. `logger` is a std::shared_ptr<spdlog::logger> (or a
// pointer); it must not be null.
//
// Thread safety: as safe as the logger (spdlog's loggers are thread-safe).
#ifndef SETPOINT_BASE_LOGGING_H_
#define SETPOINT_BASE_LOGGING_H_

#include "spdlog/common.h"
#include "spdlog/logger.h"

// Logs at `level` (a spdlog::level::level_enum) when `logger` would log it.
#define SETPOINT_LOG_AT(logger, level, ...)                                   \
  do {                                                                        \
    auto&& setpoint_log_logger_ = (logger);                                   \
    if (setpoint_log_logger_->should_log(level) ||                            \
        setpoint_log_logger_->should_backtrace()) {                           \
      setpoint_log_logger_->log(                                              \
          ::spdlog::source_loc{__FILE__, __LINE__, SPDLOG_FUNCTION}, (level), \
          __VA_ARGS__);                                                       \
    }                                                                         \
  } while (false)

// Per-decision lines (see the house logging levels): compiled in, filtered by
// the logger's level.
#define SETPOINT_LOG_DEBUG(logger, ...) \
  SETPOINT_LOG_AT(logger, ::spdlog::level::debug, __VA_ARGS__)

// Per-command lines: compiled in, filtered by the logger's level.
#define SETPOINT_LOG_TRACE(logger, ...) \
  SETPOINT_LOG_AT(logger, ::spdlog::level::trace, __VA_ARGS__)

#endif  // SETPOINT_BASE_LOGGING_H_
