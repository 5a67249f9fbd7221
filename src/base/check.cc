#include "setpoint/base/check.h"

#include <cstdio>
#include <cstdlib>

#include "spdlog/spdlog.h"

namespace setpoint::internal {

void CheckFailed(const char* file, int line, const char* condition,
                 std::string_view message) {
  // Straight to stderr first: the default logger may write elsewhere (spdlog's
  // writes to stdout) or be gone during shutdown.
  std::fprintf(stderr, "check failed file=%s:%d condition=(%s) %.*s\n", file,
               line, condition, static_cast<int>(message.size()),
               message.data());
  std::fflush(stderr);
  if (auto logger = spdlog::default_logger(); logger != nullptr) {
    logger->critical("check failed file={}:{} condition=({}) {}", file, line,
                     condition, message);
    logger->flush();
  }
  std::abort();
}

}  // namespace setpoint::internal
