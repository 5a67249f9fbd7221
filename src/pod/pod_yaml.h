// The YAML reader of the pod config: one document into a small tree of
// maps, lists and values with their lines, refusing what a config never
// needs (aliases, a second document, deep nesting, huge node counts).
// pod_config.cc turns the tree into settings.
//
//   absl::StatusOr<Yaml> root = ParseYaml(text);
//
// Thread safety: pure functions and value types.
#ifndef SETPOINT_SRC_POD_POD_YAML_H_
#define SETPOINT_SRC_POD_POD_YAML_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace setpoint {

// One node of the tree.
struct Yaml {
  enum class Type { kNull, kScalar, kSequence, kMap };
  Type type = Type::kNull;
  int line = 0;             // 1-based; 0 when yaml-cpp gives no mark.
  std::string scalar;       // kScalar only.
  std::vector<Yaml> items;  // kSequence: items; kMap: key, value, key, ...
};

// "empty", "a value", "a list", "a map": for messages.
const char* TypeName(Yaml::Type t);

// Returns the document's tree, or kInvalidArgument naming the line and
// what was refused (messages have no prefix; the caller adds one).
absl::StatusOr<Yaml> ParseYaml(const std::string& text);

}  // namespace setpoint

#endif  // SETPOINT_SRC_POD_POD_YAML_H_
