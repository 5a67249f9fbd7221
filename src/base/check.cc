#include "setpoint/base/check.h"

#include <cstdlib>

#include "spdlog/spdlog.h"

namespace setpoint::internal {

void CheckFailed(const char* file, int line, const char* condition,
                 std::string_view message) {
  if (auto logger = spdlog::default_logger(); logger != nullptr) {
    logger->critical("check failed file={}:{} condition=({}) {}", file, line,
                     condition, message);
    logger->flush();
  }
  std::abort();
}

}  // namespace setpoint::internal
