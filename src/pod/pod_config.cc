#include "setpoint/pod/pod_config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <map>
#include <sstream>
#include <system_error>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "pod_yaml.h"
#include "setpoint/base/status.h"
#include "setpoint/pod/ops_server.h"

namespace setpoint {
namespace {

// A password file holds one line.
constexpr size_t kMaxPasswordFileBytes = 64 << 10;
constexpr absl::Duration kMaxDuration = absl::Hours(24);

// The keys (the table below Set's helpers): a path's entry, or nullptr.
// "kinds.<name>.count" finds the kinds entry of "count".
struct KeySpec;
const KeySpec* FindKey(absl::string_view path);

// The three sources of one password: they exclude each other.
bool IsPasswordKey(absl::string_view path) {
  return path == "registry.password" || path == "registry.password_env" ||
         path == "registry.password_file";
}
// The same for the sentinels' password.
bool IsSentinelPasswordKey(absl::string_view path) {
  return path == "registry.sentinel_password" ||
         path == "registry.sentinel_password_env" ||
         path == "registry.sentinel_password_file";
}

// Messages here have no prefix: ParsePodConfig adds "pod config: ",
// LoadPodConfig "pod config <path>: ".
absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      field.empty() ? std::string(what) : absl::StrCat(field, " ", what));
}

absl::Status Prefixed(absl::string_view prefix, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

// User text in messages: control bytes and quotes escaped.
std::string Escape(absl::string_view s) { return absl::CHexEscape(s); }

// The field, and the line it came from (0: an override).
std::string Where(absl::string_view field, int line) {
  return line > 0 ? absl::StrCat(field, " (line ", line, ")")
                  : std::string(field);
}

// ---- Flattening: "path" -> value, so files and overrides share Set --------

struct Value {
  std::string text;
  int line = 0;  // 0: from an override.
};
using Flat = std::map<std::string, Value>;

// Keys of a map must be non-empty names, each given once (else one value
// would silently win).
absl::Status CheckKeys(const Yaml& map, absl::string_view path) {
  std::map<std::string, int> seen;
  for (size_t i = 0; i + 1 < map.items.size(); i += 2) {
    const Yaml& key = map.items[i];
    if (key.type != Yaml::Type::kScalar || key.scalar.empty()) {
      return Bad(
          Where(path.empty() ? "the document" : path, key.line),
          absl::StrCat(
              "has a key that is ",
              key.type == Yaml::Type::kScalar ? "empty" : TypeName(key.type),
              "; keys must be names"));
    }
    auto [it, inserted] = seen.emplace(key.scalar, key.line);
    if (!inserted) {
      std::string field = path.empty()
                              ? Escape(key.scalar)
                              : absl::StrCat(path, ".", Escape(key.scalar));
      return Bad(field,
                 absl::StrCat("appears twice in one map (lines ", it->second,
                              " and ", key.line, "): one would silently win"));
    }
  }
  return absl::OkStatus();
}

// A setting: a value, or empty (Set refuses that for the field).
absl::Status Leaf(const std::string& field, const Yaml& key, const Yaml& value,
                  Flat* flat) {
  if (value.type == Yaml::Type::kMap || value.type == Yaml::Type::kSequence) {
    return Bad(
        Where(field, key.line),
        absl::StrCat("must be a single value, not ", TypeName(value.type)));
  }
  (*flat)[field] = Value{.text = value.scalar, .line = key.line};
  return absl::OkStatus();
}

// A section (registry, kinds) that is present must not be empty.
absl::Status Section(const std::string& field, const Yaml& key,
                     const Yaml& value, Yaml::Type want) {
  if (value.type == Yaml::Type::kNull) {
    return Bad(Where(field, key.line), "must not be empty");
  }
  if (value.type != want) {
    return Bad(Where(field, key.line),
               absl::StrCat("must be ", TypeName(want), ", not ",
                            TypeName(value.type)));
  }
  return absl::OkStatus();
}

absl::Status CheckKindName(const std::string& field, const std::string& name);

absl::Status FlattenKinds(const Yaml& list, Flat* flat,
                          std::vector<std::string>* kind_order) {
  if (list.items.size() > kPodConfigMaxKinds) {
    return Bad(Where("kinds", list.line),
               absl::StrCat("must name at most ", kPodConfigMaxKinds,
                            " kinds, got ", list.items.size()));
  }
  for (size_t i = 0; i < list.items.size(); ++i) {
    const Yaml& entry = list.items[i];
    std::string at = absl::StrCat("kinds[", i, "]");
    if (entry.type != Yaml::Type::kMap) {
      return Bad(Where(at, entry.line), "must be a map with a \"kind\" name");
    }
    SETPOINT_RETURN_IF_ERROR(CheckKeys(entry, at));
    const Yaml* name = nullptr;
    for (size_t j = 0; j + 1 < entry.items.size(); j += 2) {
      if (entry.items[j].scalar == "kind") name = &entry.items[j + 1];
    }
    if (name == nullptr) {
      return Bad(Where(at, entry.line), "must be a map with a \"kind\" name");
    }
    std::string field = Where(at + ".kind", name->line);
    if (name->type == Yaml::Type::kMap || name->type == Yaml::Type::kSequence) {
      return Bad(field,
                 absl::StrCat("must be a name, not ", TypeName(name->type)));
    }
    SETPOINT_RETURN_IF_ERROR(CheckKindName(field, name->scalar));
    if (std::find(kind_order->begin(), kind_order->end(), name->scalar) !=
        kind_order->end()) {
      return Bad(field,
                 absl::StrCat("\"", name->scalar,
                              "\" appears twice: node ids would repeat"));
    }
    kind_order->push_back(name->scalar);
    for (size_t j = 0; j + 1 < entry.items.size(); j += 2) {
      const Yaml& key = entry.items[j];
      if (key.scalar == "kind") continue;
      if (key.scalar != "count" && key.scalar != "ring_size") {
        return Bad(Where(absl::StrCat(at, ".", Escape(key.scalar)), key.line),
                   "is not a known key (kind, count, ring_size)");
      }
      SETPOINT_RETURN_IF_ERROR(
          Leaf(absl::StrCat("kinds.", name->scalar, ".", key.scalar), key,
               entry.items[j + 1], flat));
    }
  }
  return absl::OkStatus();
}

absl::Status Flatten(const Yaml& root, Flat* flat,
                     std::vector<std::string>* kind_order) {
  if (root.type == Yaml::Type::kNull) return absl::OkStatus();
  if (root.type != Yaml::Type::kMap) {
    return Bad(
        Where("the document", root.line),
        absl::StrCat("must be a map of settings, not ", TypeName(root.type)));
  }
  SETPOINT_RETURN_IF_ERROR(CheckKeys(root, ""));
  for (size_t i = 0; i + 1 < root.items.size(); i += 2) {
    const Yaml& key = root.items[i];
    const Yaml& value = root.items[i + 1];
    if (key.scalar != "kinds" && FindKey(key.scalar) != nullptr) {
      SETPOINT_RETURN_IF_ERROR(Leaf(key.scalar, key, value, flat));
    } else if (key.scalar == "registry") {
      SETPOINT_RETURN_IF_ERROR(
          Section("registry", key, value, Yaml::Type::kMap));
      SETPOINT_RETURN_IF_ERROR(CheckKeys(value, "registry"));
      for (size_t j = 0; j + 1 < value.items.size(); j += 2) {
        const Yaml& k = value.items[j];
        std::string field = absl::StrCat("registry.", Escape(k.scalar));
        if (FindKey(absl::StrCat("registry.", k.scalar)) == nullptr) {
          return Bad(Where(field, k.line), "is not a known key");
        }
        SETPOINT_RETURN_IF_ERROR(Leaf(field, k, value.items[j + 1], flat));
      }
    } else if (key.scalar == "http") {
      SETPOINT_RETURN_IF_ERROR(Section("http", key, value, Yaml::Type::kMap));
      SETPOINT_RETURN_IF_ERROR(CheckKeys(value, "http"));
      for (size_t j = 0; j + 1 < value.items.size(); j += 2) {
        const Yaml& k = value.items[j];
        std::string field = absl::StrCat("http.", Escape(k.scalar));
        if (FindKey(absl::StrCat("http.", k.scalar)) == nullptr) {
          return Bad(Where(field, k.line), "is not a known key");
        }
        SETPOINT_RETURN_IF_ERROR(Leaf(field, k, value.items[j + 1], flat));
      }
    } else if (key.scalar == "kinds") {
      SETPOINT_RETURN_IF_ERROR(
          Section("kinds", key, value, Yaml::Type::kSequence));
      SETPOINT_RETURN_IF_ERROR(FlattenKinds(value, flat, kind_order));
    } else {
      return Bad(Where(Escape(key.scalar), key.line), "is not a known key");
    }
  }
  return absl::OkStatus();
}

// ---- Values ---------------------------------------------------------------

absl::Status CheckNoControl(const std::string& field, const std::string& v) {
  for (size_t i = 0; i < v.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(v[i]);
    if (c < 0x20 || c == 0x7f) {
      return Bad(field, absl::StrFormat(
                            "must not contain control characters, got \\x%02x "
                            "at byte %d",
                            c, i));
    }
  }
  return absl::OkStatus();
}

// Ids end up in node ids, Redis keys and log lines.
absl::Status CheckId(const std::string& field, const std::string& v) {
  if (v.empty()) return Bad(field, "must not be empty");
  for (size_t i = 0; i < v.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(v[i]);
    if (c <= 0x20 || c >= 0x7f) {
      return Bad(field, absl::StrFormat("must be printable ASCII without "
                                        "spaces, got \\x%02x at byte %d",
                                        c, i));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckKindName(const std::string& field, const std::string& name) {
  SETPOINT_RETURN_IF_ERROR(CheckId(field, name));
  if (name.find_first_of("./") != std::string::npos) {
    return Bad(field, absl::StrCat("must not contain '.' (overrides name "
                                   "kinds.<kind>.<key>) or '/' (node ids are "
                                   "<pod>/<kind>/<index>), got \"",
                                   Escape(name), "\""));
  }
  return absl::OkStatus();
}

// Durations the registry can carry: finite whole milliseconds, 1ms..24h (or
// 0 when `zero_ok`).
absl::StatusOr<absl::Duration> Millis(const std::string& field,
                                      const std::string& v, bool zero_ok) {
  absl::Duration d;
  if (!absl::ParseDuration(v, &d)) {
    return Bad(field, absl::StrCat("\"", Escape(v),
                                   "\" is not a duration (like 500ms, 3s)"));
  }
  if (d == absl::InfiniteDuration() || d == -absl::InfiniteDuration()) {
    return Bad(field, absl::StrCat("must be finite, got \"", Escape(v), "\""));
  }
  if (zero_ok && d == absl::ZeroDuration()) return d;
  if (d < absl::Milliseconds(1)) {
    return Bad(field, absl::StrCat("must be >= 1ms",
                                   zero_ok ? " (or 0 for the default)" : "",
                                   ", got ", absl::FormatDuration(d)));
  }
  if (d > kMaxDuration) {
    return Bad(field,
               absl::StrCat("must be <= ", absl::FormatDuration(kMaxDuration),
                            ", got ", absl::FormatDuration(d)));
  }
  if (d % absl::Milliseconds(1) != absl::ZeroDuration()) {
    return Bad(field, absl::StrCat("must be a whole number of milliseconds "
                                   "(the registry counts ms), got ",
                                   absl::FormatDuration(d)));
  }
  return d;
}

absl::StatusOr<int64_t> Integer(const std::string& field, const std::string& v,
                                int64_t lo, int64_t hi,
                                absl::string_view why = "") {
  int64_t n;
  if (!absl::SimpleAtoi(v, &n)) {
    return Bad(field,
               absl::StrCat("\"", Escape(v), "\" is not a whole number"));
  }
  if (n < lo || n > hi) {
    return Bad(field,
               absl::StrCat("must be in ", lo, "..", hi,
                            why.empty() ? "" : absl::StrCat(" (", why, ")"),
                            ", got ", n));
  }
  return n;
}

absl::StatusOr<bool> Boolean(const std::string& field, const std::string& v) {
  if (v == "true") return true;
  if (v == "false") return false;
  return Bad(field,
             absl::StrCat("must be true or false, got \"", Escape(v), "\""));
}

// Reads a regular file of at most `limit` bytes. Anything else is refused
// before it is opened (a FIFO would block, /dev/zero never ends). Messages
// start with what is wrong ("is a directory"), for the caller to prefix
// with the path.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path,
                                            size_t limit) {
  auto type_error = [](const struct stat& st) {
    if (S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError("is a directory, not a file");
    }
    const char* what = S_ISFIFO(st.st_mode)   ? "a FIFO"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "not a file";
    return absl::InvalidArgumentError(absl::StrCat(
        "is not a regular file (", what, "); refusing to read it"));
  };
  auto errno_error = [](int err, absl::string_view what) {
    std::string msg =
        absl::StrCat(what, ": ", std::generic_category().message(err));
    if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(msg);
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
    return absl::InvalidArgumentError(msg);
  };
  auto too_big = [limit](uint64_t size) {
    return absl::InvalidArgumentError(
        absl::StrCat("is ", size, " bytes or more; the limit is ", limit));
  };
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return errno_error(errno, "cannot read");
  if (!S_ISREG(st.st_mode)) return type_error(st);
  if (static_cast<uint64_t>(st.st_size) > limit) return too_big(st.st_size);
  // O_NONBLOCK: should the path have become a FIFO since, opening it does
  // not wait for a writer.
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return errno_error(errno, "cannot open");
  std::string text;
  absl::Status status;
  if (fstat(fd, &st) != 0) {
    status = errno_error(errno, "cannot stat");
  } else if (!S_ISREG(st.st_mode)) {
    status = type_error(st);
  } else {
    // Read one byte past the limit: a file that grows (or a /proc file that
    // reports size 0) is still bounded.
    char buf[16 << 10];
    while (status.ok()) {
      ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        status = errno_error(errno, "cannot read");
      } else if (n == 0) {
        break;
      } else if (text.size() + static_cast<size_t>(n) > limit) {
        status = too_big(text.size() + n);
      } else {
        text.append(buf, static_cast<size_t>(n));
      }
    }
  }
  close(fd);
  if (!status.ok()) return status;
  return text;
}

// ---- The keys: one table drives parsing, --help and ToString ------------

// One value on its way into a PodConfig.
struct Setting {
  std::string field;  // For messages: the path, and the line.
  std::string text;
  std::string kind;  // kinds.<kind>.* only.
};

// One key of the pod config. Every key is here once: its path, what its
// value looks like, what it does, how it is set, and how it is shown (by
// ToString, and as the default in --help, from PodConfig's own defaults).
struct KeySpec {
  absl::string_view path;
  absl::string_view value;
  absl::string_view help;
  absl::Status (*set)(PodConfig& c, const Setting& s);
  // The value as ToString shows it; nullptr: not shown (a password's
  // sources: the password itself is, redacted).
  std::string (*show)(const PodConfig& c, const NodeKindOptions* kind);
  // --help's default when `show` of a default PodConfig cannot say it.
  absl::string_view default_text = "";
};

std::string Show(absl::Duration d) { return absl::FormatDuration(d); }

absl::Status SetMillis(const Setting& s, absl::Duration* out, bool zero_ok) {
  SETPOINT_ASSIGN_OR_RETURN(*out, Millis(s.field, s.text, zero_ok));
  return absl::OkStatus();
}

NodeKindOptions& KindOf(PodConfig& c, const std::string& name) {
  for (auto& k : c.manager.kinds) {
    if (k.kind == name) return k;
  }
  c.manager.kinds.push_back(NodeKindOptions{.kind = name});
  return c.manager.kinds.back();
}

// A password from the environment variable `s.text` names.
absl::StatusOr<std::string> PasswordFromEnv(const Setting& s) {
  const char* env = std::getenv(s.text.c_str());
  if (env == nullptr) {
    return Bad(s.field,
               absl::StrCat("names $", Escape(s.text), ", which is not set"));
  }
  if (*env == '\0') {
    return Bad(s.field,
               absl::StrCat("names $", Escape(s.text),
                            ", which is empty: AUTH would be skipped"));
  }
  return std::string(env);
}

// A password from the first line of the file `s.text` names.
absl::StatusOr<std::string> PasswordFromFile(const Setting& s) {
  absl::StatusOr<std::string> text =
      ReadRegularFile(s.text, kMaxPasswordFileBytes);
  if (!text.ok()) {
    return Bad(s.field, absl::StrCat("\"", Escape(s.text), "\" ",
                                     text.status().message()));
  }
  std::string line = text->substr(0, text->find('\n'));
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line.empty()) {
    return Bad(s.field, absl::StrCat("\"", Escape(s.text),
                                     "\" has no password on its first "
                                     "line: AUTH would be skipped"));
  }
  return line;
}

constexpr KeySpec kKeys[] = {
    {"pod_id", "<id>", "names this process in node ids",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       SETPOINT_RETURN_IF_ERROR(CheckId(s.field, s.text));
       if (s.text.find('/') != std::string::npos) {
         return Bad(s.field, absl::StrCat("must not contain '/' (node ids are "
                                          "<pod>/<kind>/<index>), got \"",
                                          Escape(s.text), "\""));
       }
       c.manager.pod_id = s.text;
       return absl::OkStatus();
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return c.manager.pod_id.empty() ? std::string("<hostname>-<pid>")
                                       : c.manager.pod_id;
     }},
    {"poll_interval", "<duration>",
     "renew the leases and read the registry this often",
     [](PodConfig& c, const Setting& s) {
       return SetMillis(s, &c.manager.poll_interval, false);
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return Show(c.manager.poll_interval);
     }},
    {"nudge_burst", "<n>",
     "polls a burst of change announcements may cause at once, 1..1000",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       SETPOINT_ASSIGN_OR_RETURN(int64_t n, Integer(s.field, s.text, 1, 1000));
       c.manager.nudge_burst = static_cast<int>(n);
       return absl::OkStatus();
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return absl::StrCat(c.manager.nudge_burst);
     }},
    {"static_membership", "true|false",
     "a graceful stop keeps this pod's places for one lease, for a "
     "successor with the same pod_id (needs an explicit pod_id)",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       SETPOINT_ASSIGN_OR_RETURN(c.manager.static_membership,
                                 Boolean(s.field, s.text));
       return absl::OkStatus();
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return std::string(c.manager.static_membership ? "true" : "false");
     }},
    {"lease", "<duration>",
     "how long a renewal keeps the nodes alive for other pods; >= 2 * "
     "poll_interval",
     [](PodConfig& c, const Setting& s) {
       return SetMillis(s, &c.manager.lease, false);
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return Show(c.manager.lease);
     }},
    {"fence_margin", "<duration>",
     "stop working this long before the lease could expire; 0: max(20% of "
     "lease, poll_interval)",
     [](PodConfig& c, const Setting& s) {
       return SetMillis(s, &c.manager.fence_margin, true);
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return Show(c.manager.fence_margin);
     }},
    {"operation_timeout", "<duration>",
     "registry calls and the graceful stop give up after this",
     [](PodConfig& c, const Setting& s) {
       return SetMillis(s, &c.manager.operation_timeout, false);
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return Show(c.manager.operation_timeout);
     }},
    {"updater_threads", "<n>",
     "threads of the pod's updater pool, shared by every node's syncers, "
     "0..1024; 0: each syncer owns its threads",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       SETPOINT_ASSIGN_OR_RETURN(int64_t n, Integer(s.field, s.text, 0, 1024));
       c.updater_threads = static_cast<int>(n);
       return absl::OkStatus();
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return absl::StrCat(c.updater_threads);
     }},
    {"runner_threads", "<n>",
     "threads of the pod's runner pool, on which every node's runner runs "
     "its events, 0..1024; 0: each runner owns a thread",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       SETPOINT_ASSIGN_OR_RETURN(int64_t n, Integer(s.field, s.text, 0, 1024));
       c.runner_threads = static_cast<int>(n);
       return absl::OkStatus();
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return absl::StrCat(c.runner_threads);
     }},
    {"loop_threads", "<n>",
     "most threads of the pod's loop pool, which every node's reconcile "
     "loops share (the plan executions it runs at once), 0..1024; 0: each "
     "loop owns a thread",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       SETPOINT_ASSIGN_OR_RETURN(int64_t n, Integer(s.field, s.text, 0, 1024));
       c.loop_threads = static_cast<int>(n);
       return absl::OkStatus();
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return absl::StrCat(c.loop_threads);
     }},
    {"kinds.<kind>.count", "<n>", "nodes of the kind in this pod, 1..1024",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       SETPOINT_ASSIGN_OR_RETURN(int64_t n,
                                 Integer(s.field, s.text, 1, kPodConfigMaxCount,
                                         "nodes of one kind in one pod"));
       KindOf(c, s.kind).count = static_cast<int>(n);
       return absl::OkStatus();
     },
     [](const PodConfig&, const NodeKindOptions* k) {
       return absl::StrCat(k->count);
     },
     "the program's, else 1"},
    {"kinds.<kind>.ring_size", "<n>",
     "shards in the kind's ring, the same in every pod",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       SETPOINT_ASSIGN_OR_RETURN(
           int64_t n, Integer(s.field, s.text, 1, kPodConfigMaxRingSize));
       KindOf(c, s.kind).ring_size = static_cast<uint32_t>(n);
       return absl::OkStatus();
     },
     [](const PodConfig&, const NodeKindOptions* k) {
       return absl::StrCat(k->ring_size);
     },
     "the program's, else 4096"},
    {"http.address", "<host:port>",
     "serve /metrics, /healthz, /readyz and /statusz here; empty: off; port "
     "0 picks a free one",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       std::string host;
       int port = 0;
       if (absl::Status st = ParseHostPort(s.text, &host, &port); !st.ok()) {
         return Bad(s.field, st.message());
       }
       c.http_address = s.text;
       return absl::OkStatus();
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return c.http_address.empty() ? std::string("off") : c.http_address;
     }},
    {"http.stuck_after", "<duration>",
     "/healthz fails when a runner or the protocol thread made no progress "
     "for this long",
     [](PodConfig& c, const Setting& s) {
       return SetMillis(s, &c.stuck_after, false);
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return Show(c.stuck_after);
     }},
    {"registry.type", "memory|redis",
     "memory: this process only; redis: pods share a ring",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       if (s.text != "memory" && s.text != "redis") {
         return Bad(s.field, absl::StrCat("must be memory or redis, got \"",
                                          Escape(s.text), "\""));
       }
       c.registry_type = s.text;
       return absl::OkStatus();
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return c.registry_type;
     }},
    {"registry.address", "<address>", "host:port, [::1]:port or unix:///path",
     [](PodConfig& c, const Setting& s) {
       c.redis.address = s.text;
       return absl::OkStatus();
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return c.redis.address;
     }},
    {"registry.username", "<user>", "ACL user for AUTH",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       SETPOINT_RETURN_IF_ERROR(CheckId(s.field, s.text));
       c.redis.username = s.text;
       return absl::OkStatus();
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return c.redis.username.empty() ? std::string("none") : c.redis.username;
     }},
    {"registry.password", "<password>",
     "AUTH password; prefer password_env or password_file",
     [](PodConfig& c, const Setting& s) {
       c.redis.password = s.text;
       return absl::OkStatus();
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return std::string(c.redis.password.empty() ? "none" : "<redacted>");
     }},
    {"registry.password_env", "<variable>",
     "read the password from this environment variable",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       SETPOINT_ASSIGN_OR_RETURN(c.redis.password, PasswordFromEnv(s));
       return absl::OkStatus();
     },
     nullptr},
    {"registry.password_file", "<path>",
     "read the password from the first line of this file",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       SETPOINT_ASSIGN_OR_RETURN(c.redis.password, PasswordFromFile(s));
       return absl::OkStatus();
     },
     nullptr},
    {"registry.db", "<n>", "SELECT this database",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       SETPOINT_ASSIGN_OR_RETURN(
           int64_t n,
           Integer(s.field, s.text, 0, std::numeric_limits<int>::max()));
       c.redis.db = static_cast<int>(n);
       return absl::OkStatus();
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return absl::StrCat(c.redis.db);
     }},
    {"registry.sentinels", "<host:port,...>",
     "ask these Redis Sentinels for the master instead of using address",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       c.redis.sentinels.clear();
       for (absl::string_view a : absl::StrSplit(s.text, ',')) {
         a = absl::StripAsciiWhitespace(a);
         if (a.empty()) return Bad(s.field, "has an empty address in its list");
         c.redis.sentinels.emplace_back(a);
       }
       return absl::OkStatus();
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return c.redis.sentinels.empty() ? std::string("none")
                                        : absl::StrJoin(c.redis.sentinels, ",");
     }},
    {"registry.master_name", "<name>",
     "the name the sentinels monitor the master under",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       c.redis.master_name = s.text;
       return absl::OkStatus();
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return c.redis.master_name.empty() ? std::string("none")
                                          : c.redis.master_name;
     }},
    {"registry.sentinel_username", "<user>", "ACL user for AUTH on sentinels",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       SETPOINT_RETURN_IF_ERROR(CheckId(s.field, s.text));
       c.redis.sentinel_username = s.text;
       return absl::OkStatus();
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return c.redis.sentinel_username.empty() ? std::string("none")
                                                : c.redis.sentinel_username;
     }},
    {"registry.sentinel_password", "<password>",
     "AUTH password on sentinels; prefer sentinel_password_env or _file",
     [](PodConfig& c, const Setting& s) {
       c.redis.sentinel_password = s.text;
       return absl::OkStatus();
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return std::string(c.redis.sentinel_password.empty() ? "none"
                                                            : "<redacted>");
     }},
    {"registry.sentinel_password_env", "<variable>",
     "read the sentinels' password from this environment variable",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       SETPOINT_ASSIGN_OR_RETURN(c.redis.sentinel_password, PasswordFromEnv(s));
       return absl::OkStatus();
     },
     nullptr},
    {"registry.sentinel_password_file", "<path>",
     "read the sentinels' password from the first line of this file",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       SETPOINT_ASSIGN_OR_RETURN(c.redis.sentinel_password,
                                 PasswordFromFile(s));
       return absl::OkStatus();
     },
     nullptr},
    {"registry.grant_wait_replicas", "<n>",
     "acknowledge a grant only once WAIT saw it on n replicas (0: off)",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       SETPOINT_ASSIGN_OR_RETURN(int64_t n, Integer(s.field, s.text, 0, 64));
       c.redis.grant_wait_replicas = static_cast<int>(n);
       return absl::OkStatus();
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return absl::StrCat(c.redis.grant_wait_replicas);
     }},
    {"registry.grant_wait_timeout", "<duration>",
     "how long WAIT waits for the replicas (< command_timeout)",
     [](PodConfig& c, const Setting& s) {
       return SetMillis(s, &c.redis.grant_wait_timeout, false);
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return Show(c.redis.grant_wait_timeout);
     }},
    {"registry.namespace", "<name>", "separates deployments on one Redis",
     [](PodConfig& c, const Setting& s) -> absl::Status {
       SETPOINT_RETURN_IF_ERROR(CheckId(s.field, s.text));
       c.redis.ns = s.text;
       return absl::OkStatus();
     },
     [](const PodConfig& c, const NodeKindOptions*) { return c.redis.ns; }},
    {"registry.connect_timeout", "<duration>", "give up a connect after this",
     [](PodConfig& c, const Setting& s) {
       return SetMillis(s, &c.redis.connect_timeout, false);
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return Show(c.redis.connect_timeout);
     }},
    {"registry.command_timeout", "<duration>",
     "give up a round trip after this",
     [](PodConfig& c, const Setting& s) {
       return SetMillis(s, &c.redis.command_timeout, false);
     },
     [](const PodConfig& c, const NodeKindOptions*) {
       return Show(c.redis.command_timeout);
     }},
};

bool IsKindKey(const KeySpec& k) { return absl::StartsWith(k.path, "kinds."); }

const KeySpec* FindKey(absl::string_view path) {
  std::string kind_path;
  if (absl::ConsumePrefix(&path, "kinds.")) {
    const size_t dot = path.rfind('.');
    if (dot == absl::string_view::npos) return nullptr;
    kind_path = absl::StrCat("kinds.<kind>.", path.substr(dot + 1));
    path = kind_path;
  }
  for (const KeySpec& k : kKeys) {
    if (k.path == path) return &k;
  }
  return nullptr;
}

absl::Status Set(PodConfig& c, const std::string& key, const Value& value) {
  Setting s{
      .field = Where(Escape(key), value.line), .text = value.text, .kind = ""};
  absl::string_view rest = key;
  if (absl::ConsumePrefix(&rest, "kinds.")) {
    std::vector<std::string> parts = absl::StrSplit(rest, '.');
    if (parts.size() != 2) {
      return Bad(s.field, "must look like kinds.<kind>.<count|ring_size>");
    }
    if (FindKey(key) == nullptr) {
      return Bad(s.field, "is not a known key (count, ring_size)");
    }
    SETPOINT_RETURN_IF_ERROR(CheckKindName(s.field + " kind", parts[0]));
    s.kind = parts[0];
  }
  const KeySpec* spec = FindKey(key);
  if (spec == nullptr) return Bad(s.field, "is not a known key");
  // An empty http.address turns the listener off; nothing else may be empty.
  if (key == "http.address" && s.text.empty()) {
    c.http_address.clear();
    return absl::OkStatus();
  }
  if (s.text.empty()) return Bad(s.field, "must not be empty");
  // Passwords are opaque (and never echoed).
  if (key != "registry.password" && key != "registry.sentinel_password") {
    SETPOINT_RETURN_IF_ERROR(CheckNoControl(s.field, s.text));
  }
  return spec->set(c, s);
}

// Settings that make sense alone but not together.
absl::Status CheckTogether(const PodConfig& c, const Flat& flat) {
  std::vector<std::string> passwords, sentinel_passwords;
  bool registry_settings = false;
  for (const auto& [key, value] : flat) {
    if (IsPasswordKey(key)) passwords.push_back(key);
    if (IsSentinelPasswordKey(key)) sentinel_passwords.push_back(key);
    if (absl::StartsWith(key, "registry.") && key != "registry.type") {
      registry_settings = true;
    }
  }
  for (const auto* keys : {&passwords, &sentinel_passwords}) {
    if (keys->size() > 1) {
      return Bad(absl::StrJoin(*keys, " and "), "exclude each other: give one");
    }
  }
  if (flat.count("registry.address") != 0 &&
      flat.count("registry.sentinels") != 0) {
    return Bad("registry.address and registry.sentinels",
               "exclude each other: with sentinels the master's address "
               "comes from them");
  }
  if (registry_settings && flat.count("registry.type") == 0) {
    return Bad("registry.type",
               "must be given (memory or redis) with other registry "
               "settings: without it every pod would use its own in-memory "
               "registry and own the whole ring");
  }
  if (c.manager.kinds.size() > kPodConfigMaxKinds) {
    return Bad("kinds", absl::StrCat("must name at most ", kPodConfigMaxKinds,
                                     " kinds, got ", c.manager.kinds.size()));
  }
  // The lease and fence margin rules are the node manager's own
  // (ValidateNodeManagerSettings, called after this): not written twice.
  return absl::OkStatus();
}

absl::StatusOr<PodConfig> Parse(const std::string& yaml,
                                const std::vector<std::string>& overrides,
                                const std::vector<NodeKindOptions>& kinds) {
  if (yaml.size() > kPodConfigMaxBytes) {
    return Bad("", absl::StrCat("is ", yaml.size(), " bytes; the limit is ",
                                kPodConfigMaxBytes));
  }
  Flat flat;
  std::vector<std::string> kind_order;
  SETPOINT_ASSIGN_OR_RETURN(Yaml root, ParseYaml(yaml));
  SETPOINT_RETURN_IF_ERROR(Flatten(root, &flat, &kind_order));
  for (const std::string& o : overrides) {
    absl::string_view rest = o;
    const bool dashes = absl::ConsumePrefix(&rest, "--");
    const size_t eq = rest.find('=');
    if (!dashes || eq == absl::string_view::npos || eq == 0) {
      // Never echo a value: it may be a password.
      const size_t end = o.find('=');
      absl::string_view shown = absl::string_view(o).substr(
          0, end == std::string::npos ? end : end + 1);
      return Bad(absl::StrCat("override \"", Escape(shown), "\""),
                 "must look like --path=value");
    }
    std::string path(rest.substr(0, eq));
    if (path == "kinds") return Bad("--kinds", "set kinds.<kind>.count");
    // An override of one password source replaces the file's.
    for (bool (*same)(absl::string_view) :
         {&IsPasswordKey, &IsSentinelPasswordKey}) {
      if (!same(path)) continue;
      for (auto it = flat.begin(); it != flat.end();) {
        it = same(it->first) && it->second.line > 0 ? flat.erase(it)
                                                    : std::next(it);
      }
    }
    flat[path] = Value{.text = std::string(rest.substr(eq + 1)), .line = 0};
  }
  PodConfig config;
  // Kinds first: the program's, then the file's others in file order, so the
  // order of nodes stays as written.
  config.manager.kinds = kinds;
  for (const std::string& name : kind_order) {
    bool known = std::any_of(kinds.begin(), kinds.end(),
                             [&](const auto& k) { return k.kind == name; });
    if (!known) config.manager.kinds.push_back(NodeKindOptions{.kind = name});
  }
  for (const auto& [key, value] : flat) {
    SETPOINT_RETURN_IF_ERROR(Set(config, key, value));
  }
  SETPOINT_RETURN_IF_ERROR(CheckTogether(config, flat));
  // The checks of the options' owners, but for the parts code supplies
  // (factories, registry).
  SETPOINT_RETURN_IF_ERROR(ValidateNodeManagerSettings(config.manager));
  if (config.registry_type == "redis") {
    SETPOINT_RETURN_IF_ERROR(ValidateRedisNodeRegistryOptions(config.redis));
  }
  return config;
}

}  // namespace

std::string PodConfig::ToString() const {
  // Every key that has a value to show, in the table's order; the
  // registry's only for Redis (an in-memory registry has no settings).
  std::vector<std::string> parts;
  for (const KeySpec& k : kKeys) {
    if (k.show == nullptr) continue;
    if (absl::StartsWith(k.path, "registry.") && k.path != "registry.type" &&
        registry_type != "redis") {
      continue;
    }
    // One way to find the master: the address, or the sentinels with
    // their settings.
    const bool sentinel_key = absl::StartsWith(k.path, "registry.sentinel") ||
                              k.path == "registry.master_name";
    if (redis.sentinels.empty() ? sentinel_key : k.path == "registry.address") {
      continue;
    }
    if (!IsKindKey(k)) {
      parts.push_back(absl::StrCat(k.path, "=", k.show(*this, nullptr)));
      continue;
    }
    for (const NodeKindOptions& kind : manager.kinds) {
      parts.push_back(
          absl::StrCat(absl::StrReplaceAll(k.path, {{"<kind>", kind.kind}}),
                       "=", k.show(*this, &kind)));
    }
  }
  return absl::StrJoin(parts, " ");
}

std::span<const PodConfigKey> PodConfigKeys() {
  static const std::vector<PodConfigKey>* keys = [] {
    const PodConfig defaults;
    const NodeKindOptions kind;
    auto* out = new std::vector<PodConfigKey>();
    for (const KeySpec& k : kKeys) {
      std::string d(k.default_text);
      if (d.empty() && k.show != nullptr) d = k.show(defaults, &kind);
      out->push_back({.path = std::string_view(k.path.data(), k.path.size()),
                      .value = std::string_view(k.value.data(), k.value.size()),
                      .help = std::string_view(k.help.data(), k.help.size()),
                      .default_value = std::move(d)});
    }
    return out;
  }();
  return *keys;
}

absl::StatusOr<PodConfig> ParsePodConfig(
    const std::string& yaml, const std::vector<std::string>& overrides,
    const std::vector<NodeKindOptions>& kinds) {
  absl::StatusOr<PodConfig> config = Parse(yaml, overrides, kinds);
  if (!config.ok()) return Prefixed("pod config: ", config.status());
  return config;
}

absl::StatusOr<PodConfig> LoadPodConfig(
    const std::string& path, const std::vector<std::string>& overrides,
    const std::vector<NodeKindOptions>& kinds) {
  if (path.empty()) return ParsePodConfig("", overrides, kinds);
  const std::string prefix = absl::StrCat("pod config ", Escape(path), ": ");
  absl::StatusOr<std::string> text = ReadRegularFile(path, kPodConfigMaxBytes);
  if (!text.ok()) return Prefixed(prefix, text.status());
  absl::StatusOr<PodConfig> config = Parse(*text, overrides, kinds);
  if (!config.ok()) return Prefixed(prefix, config.status());
  return config;
}

}  // namespace setpoint
