#include "setpoint/base/callback.h"

#include <exception>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace setpoint {
namespace {

// The payload that marks a status as made from an exception.
constexpr absl::string_view kThrewUrl = "type.setpoint.dev/threw";

}  // namespace

bool ThrewException(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kThrewUrl).has_value();
}

namespace internal {

absl::Status CatchAll(absl::string_view what, absl::FunctionRef<void()> fn) {
  std::string message;
  try {
    fn();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    message = absl::StrCat(what, " threw: ", e.what());
  } catch (...) {
    message = absl::StrCat(what, " threw a non-standard exception");
  }
  absl::Status status(kThrewCode, message);
  status.SetPayload(kThrewUrl, absl::Cord("1"));
  return status;
}

}  // namespace internal
}  // namespace setpoint
