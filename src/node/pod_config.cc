#include "setpoint/node/pod_config.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "setpoint/registry/in_memory_node_registry.h"
#include "yaml-cpp/yaml.h"

namespace setpoint {
namespace {

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("pod config: ", field, field.empty() ? "" : " ", what));
}

// Flattens the YAML into "path" -> scalar, kinds into kinds.<name>.<key>,
// so files and overrides share one setter.
absl::Status Flatten(const YAML::Node& node, const std::string& path,
                     std::map<std::string, std::string>* out,
                     std::vector<std::string>* kind_order) {
  if (node.IsScalar()) {
    (*out)[path] = node.Scalar();
    return absl::OkStatus();
  }
  if (node.IsNull()) return absl::OkStatus();
  if (path == "kinds") {
    if (!node.IsSequence()) return Bad("kinds", "must be a list");
    for (size_t i = 0; i < node.size(); ++i) {
      const YAML::Node& k = node[i];
      std::string at = absl::StrCat("kinds[", i, "]");
      if (!k.IsMap() || !k["kind"] || !k["kind"].IsScalar()) {
        return Bad(at, "must be a map with a \"kind\" name");
      }
      std::string name = k["kind"].Scalar();
      if (std::find(kind_order->begin(), kind_order->end(), name) !=
          kind_order->end()) {
        return Bad(at + ".kind",
                   absl::StrCat("\"", name,
                                "\" appears twice: node ids would repeat"));
      }
      kind_order->push_back(name);
      for (const auto& kv : k) {
        std::string key = kv.first.Scalar();
        if (key == "kind") continue;
        if (!kv.second.IsScalar())
          return Bad(at + "." + key, "must be a value");
        (*out)[absl::StrCat("kinds.", name, ".", key)] = kv.second.Scalar();
      }
    }
    return absl::OkStatus();
  }
  if (!node.IsMap()) {
    return Bad(path.empty() ? "the document" : path, "must be a map");
  }
  for (const auto& kv : node) {
    std::string key = kv.first.Scalar();
    std::string sub = path.empty() ? key : path + "." + key;
    if (absl::Status s = Flatten(kv.second, sub, out, kind_order); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::Duration> Duration(const std::string& field,
                                        const std::string& v) {
  absl::Duration d;
  if (!absl::ParseDuration(v, &d)) {
    return Bad(field,
               absl::StrCat("\"", v, "\" is not a duration (like 500ms, 3s)"));
  }
  return d;
}

template <typename T>
absl::StatusOr<T> Integer(const std::string& field, const std::string& v) {
  T n;
  if (!absl::SimpleAtoi(v, &n)) {
    return Bad(field, absl::StrCat("\"", v, "\" is not a whole number"));
  }
  return n;
}

absl::Status Set(PodConfig& c, const std::string& key, const std::string& v,
                 std::vector<std::string>& kind_order) {
  auto dur = [&](absl::Duration* out) -> absl::Status {
    absl::StatusOr<absl::Duration> d = Duration(key, v);
    if (!d.ok()) return d.status();
    *out = *d;
    return absl::OkStatus();
  };
  NodeManagerOptions& m = c.manager;
  RedisNodeRegistryOptions& r = c.redis;
  if (key == "pod_id") {
    m.pod_id = v;
  } else if (key == "poll_interval") {
    return dur(&m.poll_interval);
  } else if (key == "lease") {
    return dur(&m.lease);
  } else if (key == "fence_margin") {
    return dur(&m.fence_margin);
  } else if (key == "operation_timeout") {
    return dur(&m.operation_timeout);
  } else if (key == "registry.type") {
    if (v != "memory" && v != "redis") {
      return Bad(key, absl::StrCat("must be memory or redis, got \"", v, "\""));
    }
    c.registry_type = v;
  } else if (key == "registry.address") {
    r.address = v;
  } else if (key == "registry.username") {
    r.username = v;
  } else if (key == "registry.password") {
    r.password = v;
  } else if (key == "registry.password_env") {
    const char* value = std::getenv(v.c_str());
    if (value == nullptr) {
      return Bad(key, absl::StrCat("names $", v, ", which is not set"));
    }
    r.password = value;
  } else if (key == "registry.password_file") {
    std::ifstream in(v);
    if (!in) return Bad(key, absl::StrCat("cannot read \"", v, "\""));
    std::getline(in, r.password);
  } else if (key == "registry.db") {
    absl::StatusOr<int> n = Integer<int>(key, v);
    if (!n.ok()) return n.status();
    r.db = *n;
  } else if (key == "registry.namespace") {
    r.ns = v;
  } else if (key == "registry.connect_timeout") {
    return dur(&r.connect_timeout);
  } else if (key == "registry.command_timeout") {
    return dur(&r.command_timeout);
  } else if (absl::StartsWith(key, "kinds.")) {
    std::vector<std::string> parts = absl::StrSplit(key, '.');
    if (parts.size() != 3) {
      return Bad(key, "must look like kinds.<kind>.<count|ring_size>");
    }
    const std::string& name = parts[1];
    auto it = std::find(kind_order.begin(), kind_order.end(), name);
    if (it == kind_order.end()) kind_order.push_back(name);
    NodeKindOptions* kind = nullptr;
    for (auto& k : m.kinds) {
      if (k.kind == name) kind = &k;
    }
    if (kind == nullptr) {
      m.kinds.push_back(NodeKindOptions{.kind = name});
      kind = &m.kinds.back();
    }
    std::string field = absl::StrCat("kinds.", name, ".", parts[2]);
    if (parts[2] == "count") {
      absl::StatusOr<int> n = Integer<int>(field, v);
      if (!n.ok()) return n.status();
      kind->count = *n;
    } else if (parts[2] == "ring_size") {
      absl::StatusOr<int64_t> n = Integer<int64_t>(field, v);
      if (!n.ok()) return n.status();
      if (*n <= 0 || *n > 1'000'000'000) {
        return Bad(field, absl::StrCat("must be in 1..1e9, got ", *n));
      }
      kind->ring_size = static_cast<uint32_t>(*n);
    } else {
      return Bad(field, "is not a known key (count, ring_size)");
    }
  } else {
    return Bad(key, "is not a known key");
  }
  return absl::OkStatus();
}

}  // namespace

std::string PodConfig::ToString() const {
  std::vector<std::string> kinds;
  for (const auto& k : manager.kinds) {
    kinds.push_back(absl::StrCat(k.kind, "x", k.count, "/", k.ring_size));
  }
  std::string out = absl::StrCat(
      "pod_id=", manager.pod_id.empty() ? "<default>" : manager.pod_id,
      " kinds=[", absl::StrJoin(kinds, ","),
      "] poll_interval=", absl::FormatDuration(manager.poll_interval),
      " lease=", absl::FormatDuration(manager.lease),
      " registry=", registry_type);
  if (registry_type == "redis") {
    absl::StrAppend(&out, " address=", redis.address, " db=", redis.db,
                    " namespace=", redis.ns,
                    redis.username.empty() ? "" : " username=", redis.username,
                    redis.password.empty() ? "" : " password=<redacted>");
  }
  return out;
}

absl::StatusOr<PodConfig> ParsePodConfig(
    const std::string& yaml, const std::vector<std::string>& overrides) {
  std::map<std::string, std::string> flat;
  std::vector<std::string> kind_order;
  try {
    YAML::Node root = YAML::Load(yaml);
    if (absl::Status s = Flatten(root, "", &flat, &kind_order); !s.ok()) {
      return s;
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("pod config: not valid YAML at line ", e.mark.line + 1,
                     ", column ", e.mark.column + 1, ": ", e.msg));
  }
  for (const std::string& o : overrides) {
    absl::string_view rest = o;
    if (!absl::ConsumePrefix(&rest, "--")) {
      return Bad(o, "is not an override (--path=value)");
    }
    std::pair<std::string, std::string> kv =
        absl::StrSplit(rest, absl::MaxSplits('=', 1));
    if (kv.first.empty() || rest.find('=') == absl::string_view::npos) {
      return Bad(o, "is not an override (--path=value)");
    }
    if (kv.first == "kinds") return Bad("--kinds", "set kinds.<kind>.count");
    flat[kv.first] = kv.second;
  }
  PodConfig config;
  // Kinds first, in file order, so the order of nodes stays as written.
  for (const std::string& name : kind_order) {
    config.manager.kinds.push_back(NodeKindOptions{.kind = name});
  }
  for (const auto& [key, value] : flat) {
    if (absl::Status s = Set(config, key, value, kind_order); !s.ok()) {
      return s;
    }
  }
  // Check all but the parts code supplies (factories, registry).
  static InMemoryNodeRegistry* placeholder = new InMemoryNodeRegistry();
  NodeManagerOptions check = config.manager;
  check.registry = placeholder;
  for (auto& k : check.kinds) {
    k.factory = [](const NodeInfo&) -> std::unique_ptr<Node> {
      return nullptr;
    };
  }
  if (absl::Status s = ValidateNodeManagerOptions(check); !s.ok()) {
    return Bad("", std::string(s.message()));
  }
  if (config.registry_type == "redis") {
    if (absl::Status s = ValidateRedisNodeRegistryOptions(config.redis);
        !s.ok()) {
      return Bad("", std::string(s.message()));
    }
  }
  return config;
}

absl::StatusOr<PodConfig> LoadPodConfig(
    const std::string& path, const std::vector<std::string>& overrides) {
  if (path.empty()) return ParsePodConfig("", overrides);
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("pod config: cannot read \"", path, "\""));
  }
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<PodConfig> config = ParsePodConfig(text.str(), overrides);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

}  // namespace setpoint
