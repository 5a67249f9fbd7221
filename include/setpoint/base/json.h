// JSON string literals, for the log formatter and execution reports.
//
//   std::string out;
//   setpoint::AppendJsonString(&out, "say \"hi\"\n");  // "say \"hi\"\n"
//
// Thread safety: a pure function.
#ifndef SETPOINT_BASE_JSON_H_
#define SETPOINT_BASE_JSON_H_

#include <string>
#include <string_view>

namespace setpoint {

// Appends `s` as a JSON string literal: quotes, backslashes and control
// bytes escaped (\n, \t, ... or \u00XX), well-formed UTF-8 kept, any other
// byte replaced by \ufffd, so the output is always valid JSON.
void AppendJsonString(std::string* out, std::string_view s);

}  // namespace setpoint

#endif  // SETPOINT_BASE_JSON_H_
