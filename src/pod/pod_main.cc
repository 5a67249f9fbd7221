#include "setpoint/pod/pod_main.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "process_metrics.h"
#include "setpoint/base/callback.h"
#include "setpoint/base/context.h"
#include "setpoint/base/format.h"
#include "setpoint/base/json.h"
#include "setpoint/base/mutex.h"
#include "setpoint/planner/loop_pool.h"
#include "setpoint/pod/ops_server.h"
#include "setpoint/processor/runner_pool.h"
#include "setpoint/processor/updater_pool.h"
#include "setpoint/registry/in_memory_node_registry.h"
#include "setpoint/registry/redis_node_registry.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace setpoint {
namespace {

// Flags PodMain handles itself, with their help.
struct BuiltinFlag {
  absl::string_view name;
  absl::string_view value;
  absl::string_view help;
};
constexpr BuiltinFlag kBuiltinFlags[] = {
    {"config", "<path>", "read this YAML pod config; flags win over it"},
    {"duration", "<duration>",
     "stop after this long; 0 runs until SIGINT/SIGTERM (default 0)"},
    {"log_level", "<level>",
     "trace, debug, info, warn, error or off (default info)"},
    {"log_format", "text|json",
     "text lines, or one JSON object per line (default text)"},
    {"help", "", "print this and exit"},
};

std::string ProgramName(const PodMainOptions& options, int argc,
                        const char* const* argv) {
  if (!options.program.empty()) return options.program;
  if (argc > 0 && argv[0] != nullptr && argv[0][0] != '\0') {
    absl::string_view path = argv[0];
    size_t slash = path.rfind('/');
    return std::string(
        slash == absl::string_view::npos ? path : path.substr(slash + 1));
  }
  return "pod";
}

// Debian's abseil has its own string_view.
absl::string_view Abseil(std::string_view s) { return {s.data(), s.size()}; }

bool IsBuiltinFlag(absl::string_view name) {
  return std::any_of(std::begin(kBuiltinFlags), std::end(kBuiltinFlags),
                     [&](const BuiltinFlag& f) { return f.name == name; });
}

// A PodConfig key: one of the listed paths, or any kinds.<...> path (the
// parser names what is wrong with it).
bool IsPodConfigKey(absl::string_view name) {
  if (absl::StartsWith(name, "kinds.")) return true;
  for (const PodConfigKey& key : PodConfigKeys()) {
    if (Abseil(key.path) == name) return true;
  }
  return false;
}

// User text in messages: control bytes and quotes escaped.
std::string Escape(absl::string_view s) { return absl::CHexEscape(s); }

std::string KindNames(const std::vector<NodeKindOptions>& kinds) {
  return absl::StrJoin(
      kinds, ", ",
      [](std::string* out, const NodeKindOptions& k) { out->append(k.kind); });
}

// Checks what the program gave; an error here is the program's bug.
absl::Status CheckProgramOptions(const PodMainOptions& options) {
  if (options.kinds.empty()) {
    return absl::InvalidArgumentError(
        "the program runs no kinds (PodMainOptions::kinds is empty)");
  }
  for (size_t i = 0; i < options.kinds.size(); ++i) {
    const NodeKindOptions& kind = options.kinds[i];
    if (kind.factory == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("kind \"", Escape(kind.kind), "\" has no factory"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (options.kinds[j].kind == kind.kind) {
        return absl::InvalidArgumentError(
            absl::StrCat("kind \"", Escape(kind.kind), "\" is given twice"));
      }
    }
  }
  for (size_t i = 0; i < options.flags.size(); ++i) {
    const PodFlag& flag = options.flags[i];
    const std::string shown =
        absl::StrCat("program flag --", Escape(flag.name));
    if (flag.name.empty() || flag.name[0] == '-' ||
        flag.name.find_first_of("= ") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          shown, " has a bad name: non-empty, no leading '-', no '=' or ' '"));
    }
    if (IsBuiltinFlag(flag.name) || IsPodConfigKey(flag.name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          shown, " clashes with a built-in flag or a pod config key"));
    }
    if (flag.set == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(shown, " has no setter"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (options.flags[j].name == flag.name) {
        return absl::InvalidArgumentError(
            absl::StrCat(shown, " is given twice"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CallSetter(const PodFlag& flag, absl::string_view value) {
  return CallUserCode("setter", [&] {
    return flag.set(std::string(value.data(), value.size()));
  });
}

// ---- JSON logs ------------------------------------------------------------

const char* JsonLevel(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace:
      return "trace";
    case spdlog::level::debug:
      return "debug";
    case spdlog::level::info:
      return "info";
    case spdlog::level::warn:
      return "warn";
    case spdlog::level::err:
      return "error";
    case spdlog::level::critical:
      return "critical";
    default:
      return "off";
  }
}

// The value of `key=` in a house-style message ("event phrase key=value
// key=\"quoted value\" ..."): the first occurrence that starts a word, up to
// the next space, or the quoted string without its quotes.
std::optional<absl::string_view> MessageValue(absl::string_view msg,
                                              absl::string_view key) {
  size_t pos = 0;
  while ((pos = msg.find(key, pos)) != absl::string_view::npos) {
    const size_t eq = pos + key.size();
    const bool word_start = pos == 0 || msg[pos - 1] == ' ';
    if (!word_start || eq >= msg.size() || msg[eq] != '=') {
      pos = eq;
      continue;
    }
    absl::string_view rest = msg.substr(eq + 1);
    if (!rest.empty() && rest[0] == '"') {
      size_t end = 1;
      while (end < rest.size() && rest[end] != '"') {
        end += rest[end] == '\\' ? 2 : 1;
      }
      return rest.substr(1, std::min(end, rest.size()) - 1);
    }
    return rest.substr(0, rest.find(' '));
  }
  return std::nullopt;
}

class JsonLogFormatter final : public spdlog::formatter {
 public:
  explicit JsonLogFormatter(std::string pod) : pod_(std::move(pod)) {}

  void format(const spdlog::details::log_msg& msg,
              spdlog::memory_buf_t& dest) override {
    const absl::string_view text(msg.payload.data(), msg.payload.size());
    const absl::string_view logger(msg.logger_name.data(),
                                   msg.logger_name.size());
    std::string line = "{\"time\":\"";
    line.append(absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ",
                                 absl::FromChrono(msg.time),
                                 absl::UTCTimeZone()));
    line.append("\",\"level\":\"");
    line.append(JsonLevel(msg.level));
    line.append("\",\"logger\":");
    AppendJsonString(&line, std::string_view(logger.data(), logger.size()));
    for (const auto& [name, value] : LogFields(text, logger, pod_)) {
      line.append(",\"");
      line.append(name);
      line.append("\":");
      AppendJsonString(&line, std::string_view(value.data(), value.size()));
    }
    line.append(",\"msg\":");
    AppendJsonString(&line, std::string_view(text.data(), text.size()));
    line.append("}\n");
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonLogFormatter>(pod_);
  }

 private:
  const std::string pod_;
};

// ---- Signals --------------------------------------------------------------

// Waits for a signal on `signal_fd` (returns its number), for `wake_fd` to
// become readable or for `deadline` to pass (returns 0). -1 on an error.
int WaitForSignal(
    int signal_fd, int wake_fd,
    std::optional<std::chrono::steady_clock::time_point> deadline) {
  for (;;) {
    int timeout_ms = -1;
    if (deadline.has_value()) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(
          *deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return 0;
      timeout_ms = static_cast<int>(
          std::min<int64_t>(left.count(), std::numeric_limits<int>::max()));
    }
    pollfd fds[2] = {{.fd = signal_fd, .events = POLLIN, .revents = 0},
                     {.fd = wake_fd, .events = POLLIN, .revents = 0}};
    int n = poll(fds, wake_fd >= 0 ? 2 : 1, timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if ((fds[0].revents & POLLIN) != 0) {
      signalfd_siginfo info;
      ssize_t got = read(signal_fd, &info, sizeof(info));
      if (got == static_cast<ssize_t>(sizeof(info))) {
        return static_cast<int>(info.ssi_signo);
      }
      if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      return -1;
    }
    if (wake_fd >= 0 && fds[1].revents != 0) return 0;
  }
}

const char* SignalName(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "signal";
}

void WriteAll(int fd, absl::string_view text) {
  while (!text.empty()) {
    ssize_t n = write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text.remove_prefix(static_cast<size_t>(n));
  }
}

// ---- Start-up checks and the pod's own series ----------------------------

// Reads the registry once (one round trip, changing nothing): an error of
// its settings is returned, anything else (reachable or not) is OK.
absl::Status CheckRegistrySettings(NodeRegistry& registry,
                                   const PodConfig& config) {
  if (config.registry_type != "redis") return absl::OkStatus();
  Context ctx =
      Context::Background().WithTimeout(config.manager.operation_timeout);
  absl::StatusOr<RegistryDescription> d = registry.Describe(ctx);
  if (d.ok()) return absl::OkStatus();
  const absl::StatusCode code = d.status().code();
  // AUTH (WRONGPASS, NOAUTH, NOPERM: a wrong password, no such user) and
  // SELECT (a database the server does not have).
  if (code == absl::StatusCode::kPermissionDenied ||
      code == absl::StatusCode::kUnauthenticated ||
      code == absl::StatusCode::kInvalidArgument) {
    return d.status();
  }
  return absl::OkStatus();
}

// What the parts do not publish themselves: readiness, ring sizes, the
// listener, the process, and every registry error counter at 0.
class PodSeries {
 public:
  PodSeries(MetricsRegistry& metrics, const PodConfig& config)
      : ready_(metrics.GetGauge(
            "setpoint_pod_ready",
            "1 while the pod is ready (/readyz answers 200), else 0.",
            {{"pod", config.manager.pod_id}})),
        process_(AddProcessMetrics(metrics)) {
    const std::string& pod = config.manager.pod_id;
    for (const NodeKindOptions& kind : config.manager.kinds) {
      metrics
          .GetGauge("setpoint_kind_ring_size",
                    "Shards in the kind's ring (the same in every pod).",
                    {{"pod", pod}, {"kind", kind.kind}})
          .Set(static_cast<double>(kind.ring_size));
    }
    // The node manager makes these on a first error; made here they are
    // there from the start, so increase() and rate() see the first one.
    for (const char* op :
         {"poll", "handoff", "grant", "release", "deregister"}) {
      for (const char* code : {"unavailable", "deadline_exceeded", "data_loss",
                               "failed_precondition", "aborted", "cancelled",
                               "invalid_argument", "other"}) {
        metrics.GetCounter("setpoint_registry_errors_total",
                           "Registry calls that failed, by operation and "
                           "code.",
                           {{"pod", pod}, {"op", op}, {"code", code}});
      }
    }
    listener_ = metrics.AddCollector([this, pod](MetricWriter& w) {
      MutexLock l(&mu_);
      if (ops_ == nullptr) return;
      const OpsServerStats s = ops_->stats();
      const MetricLabels labels = {{"pod", pod}};
      w.Gauge("setpoint_ops_http_connections",
              "Connections open on the ops listener.", labels,
              static_cast<double>(s.connections_open));
      w.Counter("setpoint_ops_http_connections_accepted_total",
                "Connections the ops listener accepted.", labels,
                static_cast<double>(s.connections_accepted));
      const std::pair<const char*, int64_t> closed[] = {
          {"connection_limit", s.closed_for_limit},
          {"request_timeout", s.closed_request_timeout},
          {"idle_timeout", s.closed_idle},
          {"write_timeout", s.closed_write_timeout},
          {"busy", s.refused_busy},
      };
      for (const auto& [reason, n] : closed) {
        w.Counter("setpoint_ops_http_connections_closed_total",
                  "Connections the ops listener closed before the client "
                  "was done, by reason.",
                  WithLabels(labels, {{"reason", reason}}),
                  static_cast<double>(n));
      }
      w.Counter("setpoint_ops_http_requests_total",
                "Requests the ops listener answered, by result (served by "
                "a path, or refused as malformed or too large).",
                WithLabels(labels, {{"result", "served"}}),
                static_cast<double>(s.requests));
      w.Counter("setpoint_ops_http_requests_total",
                "Requests the ops listener answered, by result (served by "
                "a path, or refused as malformed or too large).",
                WithLabels(labels, {{"result", "refused"}}),
                static_cast<double>(s.requests_refused));
    });
  }

  void SetReady(bool ready) { ready_.Set(ready ? 1 : 0); }
  // The listener whose counts are published; nullptr before it starts and
  // once it is about to stop.
  void Listen(const OpsServer* ops) {
    MutexLock l(&mu_);
    ops_ = ops;
  }

 private:
  Gauge& ready_;
  Mutex mu_;
  const OpsServer* ops_ ABSL_GUARDED_BY(mu_) = nullptr;
  MetricsCollectorHandle process_;
  MetricsCollectorHandle listener_;
};

std::string Usage(const PodMainOptions& options, const std::string& program) {
  std::string out = absl::StrCat("usage: ", program, " [--flag=value ...]\n");
  if (!options.description.empty()) {
    absl::StrAppend(&out, "\n", options.description, "\n");
  }
  if (!options.kinds.empty()) {
    absl::StrAppend(&out, "\nKinds: ",
                    absl::StrJoin(options.kinds, ", ",
                                  [](std::string* o, const NodeKindOptions& k) {
                                    absl::StrAppend(o, k.kind, " (count ",
                                                    k.count, ", ring_size ",
                                                    k.ring_size, ")");
                                  }),
                    "\n");
  }
  auto line = [&out](absl::string_view name, absl::string_view value,
                     absl::string_view help) {
    std::string left =
        absl::StrCat("  --", name, value.empty() ? "" : "=", value);
    constexpr size_t kColumn = 40;
    left.append(left.size() + 2 <= kColumn ? kColumn - left.size() : 2, ' ');
    absl::StrAppend(&out, left, help, "\n");
  };
  out.append("\nFlags:\n");
  for (const BuiltinFlag& f : kBuiltinFlags) {
    if (f.name == "config" && !options.default_config_path.empty()) {
      line(f.name, f.value,
           absl::StrCat(f.help, " (default ", options.default_config_path,
                        "; --config= reads none)"));
    } else {
      line(f.name, f.value, f.help);
    }
  }
  out.append("\nPod config (the YAML keys; a flag wins over the file):\n");
  for (const PodConfigKey& key : PodConfigKeys()) {
    line(Abseil(key.path), Abseil(key.value),
         key.default_value.empty()
             ? std::string(Abseil(key.help))
             : absl::StrCat(Abseil(key.help), " (default ", key.default_value,
                            ")"));
  }
  if (!options.flags.empty()) {
    absl::StrAppend(&out, "\n", program, "'s flags:\n");
    for (const PodFlag& flag : options.flags) {
      line(flag.name, "<value>", flag.help);
    }
  }
  out.append(
      "\nExit codes: 0 stopped (SIGINT/SIGTERM or --duration), 1 failed, "
      "2 bad configuration.\nA second SIGINT/SIGTERM during the graceful "
      "stop exits at once with 1.\n");
  return out;
}

}  // namespace

std::string PodUsage(const PodMainOptions& options) {
  return Usage(options, options.program.empty() ? "pod" : options.program);
}

PodArgsResult ParsePodArgs(int argc, const char* const* argv,
                           const PodMainOptions& options) {
  const std::string program = ProgramName(options, argc, argv);
  auto exit_with = [&](int code, absl::string_view message) {
    return PodArgsResult{.args = std::nullopt,
                         .exit_code = code,
                         .text = absl::StrCat(program, ": ", message, "\n")};
  };
  if (absl::Status s = CheckProgramOptions(options); !s.ok()) {
    return exit_with(kPodExitFailed, s.message());
  }
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      return PodArgsResult{.args = std::nullopt,
                           .exit_code = kPodExitOk,
                           .text = Usage(options, program)};
    }
  }
  PodArgs args;
  std::optional<std::string> config_path;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    // Never echo what is not a flag: it may be the value of one, a password
    // given as "--registry.password hunter2".
    if (!absl::ConsumePrefix(&arg, "--") || arg.empty() || arg[0] == '=') {
      return exit_with(kPodExitBadConfig,
                       absl::StrCat("argument ", i,
                                    " is not a flag; flags are --name=value "
                                    "(see --help)"));
    }
    const size_t eq = arg.find('=');
    const std::string name(arg.substr(0, eq));
    if (eq == absl::string_view::npos) {
      return exit_with(
          kPodExitBadConfig,
          absl::StrCat("flag --", Escape(name), " needs a value: --",
                       Escape(name), "=<value> (see --help)"));
    }
    const absl::string_view value = arg.substr(eq + 1);
    const PodFlag* program_flag = nullptr;
    for (const PodFlag& flag : options.flags) {
      if (flag.name == name) program_flag = &flag;
    }
    if (name == "config") {
      config_path = std::string(value);
    } else if (name == "duration") {
      absl::Duration d;
      if (!absl::ParseDuration(value, &d)) {
        return exit_with(kPodExitBadConfig,
                         absl::StrCat("--duration: \"", Escape(value),
                                      "\" is not a duration (like 30s or 5m; "
                                      "0 runs until a signal)"));
      }
      if (d < absl::ZeroDuration()) {
        return exit_with(kPodExitBadConfig,
                         absl::StrCat("--duration must not be negative, got ",
                                      absl::FormatDuration(d)));
      }
      args.duration = d;
    } else if (name == "log_level") {
      std::optional<spdlog::level::level_enum> level =
          ParsePodLogLevel(std::string_view(value.data(), value.size()));
      if (!level.has_value()) {
        return exit_with(kPodExitBadConfig,
                         absl::StrCat("--log_level must be trace, debug, info, "
                                      "warn, error or off, got \"",
                                      Escape(value), "\""));
      }
      args.log_level = *level;
    } else if (name == "log_format") {
      if (value == "text") {
        args.log_format = PodLogFormat::kText;
      } else if (value == "json") {
        args.log_format = PodLogFormat::kJson;
      } else {
        return exit_with(kPodExitBadConfig,
                         absl::StrCat("--log_format must be text or json, "
                                      "got \"",
                                      Escape(value), "\""));
      }
    } else if (program_flag != nullptr) {
      if (absl::Status s = CallSetter(*program_flag, value); !s.ok()) {
        return exit_with(kPodExitBadConfig,
                         absl::StrCat("--", name, ": ", s.message()));
      }
    } else if (IsPodConfigKey(name)) {
      overrides.push_back(std::string(argv[i]));
    } else {
      return exit_with(
          kPodExitBadConfig,
          absl::StrCat("unknown flag --", Escape(name), " (see --help)"));
    }
  }
  args.config_path = config_path.value_or(options.default_config_path);
  absl::StatusOr<PodConfig> config =
      LoadPodConfig(args.config_path, overrides, options.kinds);
  if (!config.ok()) {
    return exit_with(kPodExitBadConfig, config.status().message());
  }
  for (const NodeKindOptions& kind : config->manager.kinds) {
    bool known = std::any_of(
        options.kinds.begin(), options.kinds.end(),
        [&](const NodeKindOptions& k) { return k.kind == kind.kind; });
    if (!known) {
      return exit_with(
          kPodExitBadConfig,
          absl::StrCat("pod config: kind \"", Escape(kind.kind),
                       "\" is not one this program runs (it runs: ",
                       KindNames(options.kinds), ")"));
    }
  }
  args.config = *std::move(config);
  return PodArgsResult{
      .args = std::move(args), .exit_code = kPodExitOk, .text = ""};
}

absl::StatusOr<std::unique_ptr<NodeRegistry>> MakeNodeRegistry(
    const PodConfig& config, std::shared_ptr<spdlog::logger> logger) {
  if (config.registry_type == "memory") {
    return std::make_unique<InMemoryNodeRegistry>();
  }
  if (config.registry_type == "redis") {
    RedisNodeRegistryOptions options = config.redis;
    if (options.logger == nullptr) options.logger = std::move(logger);
    absl::StatusOr<std::unique_ptr<RedisNodeRegistry>> redis =
        RedisNodeRegistry::Create(std::move(options));
    if (!redis.ok()) {
      return absl::Status(
          redis.status().code(),
          absl::StrCat("make node registry: ", redis.status().message()));
    }
    return std::unique_ptr<NodeRegistry>(std::move(*redis));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("make node registry: registry.type must be memory or "
                   "redis, got \"",
                   Escape(config.registry_type), "\""));
}

std::vector<std::pair<std::string, std::string>> LogFields(
    absl::string_view msg, absl::string_view logger, absl::string_view pod) {
  std::optional<absl::string_view> node = MessageValue(msg, "node");
  // A controller's parts log through a logger named after the node id.
  if (!node.has_value() && std::count(logger.begin(), logger.end(), '/') == 2) {
    node = logger;
  }
  std::optional<absl::string_view> pod_field = MessageValue(msg, "pod");
  std::optional<absl::string_view> kind = MessageValue(msg, "kind");
  if (node.has_value()) {
    // "<pod>/<kind>/<index>".
    std::vector<absl::string_view> parts = absl::StrSplit(*node, '/');
    if (parts.size() == 3) {
      if (!pod_field.has_value()) pod_field = parts[0];
      if (!kind.has_value()) kind = parts[1];
    }
  }
  if (!pod_field.has_value() && !pod.empty()) pod_field = pod;
  std::optional<std::string> component;
  if (std::optional<absl::string_view> c = MessageValue(msg, "component")) {
    component = std::string(*c);
  } else {
    for (absl::string_view part : {"syncer", "source", "plan", "runner"}) {
      if (std::optional<absl::string_view> name = MessageValue(msg, part)) {
        component = absl::StrCat(part, "/", *name);
        break;
      }
    }
  }
  std::vector<std::pair<std::string, std::string>> fields;
  auto add = [&](const char* name, std::optional<absl::string_view> v) {
    if (v.has_value() && !v->empty())
      fields.emplace_back(name, std::string(*v));
  };
  add("pod", pod_field);
  add("node", node);
  add("kind", kind);
  if (component.has_value()) add("component", absl::string_view(*component));
  add("key", MessageValue(msg, "key"));
  return fields;
}

std::unique_ptr<spdlog::formatter> MakeJsonLogFormatter(std::string pod) {
  return std::make_unique<JsonLogFormatter>(std::move(pod));
}

std::shared_ptr<spdlog::logger> MakePodLogger(const std::string& name,
                                              const PodArgs& args,
                                              spdlog::sink_ptr sink) {
  const bool json = args.log_format == PodLogFormat::kJson;
  if (sink == nullptr) {
    if (json) {
      sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    } else {
      sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    }
  }
  auto logger = std::make_shared<spdlog::logger>(name, std::move(sink));
  if (json) {
    logger->set_formatter(MakeJsonLogFormatter(args.config.manager.pod_id));
  } else {
    logger->set_formatter(std::make_unique<spdlog::pattern_formatter>(
        "%Y-%m-%dT%H:%M:%S.%fZ %^%l%$ %n: %v", spdlog::pattern_time_type::utc));
  }
  logger->set_level(args.log_level);
  return logger;
}

std::optional<spdlog::level::level_enum> ParsePodLogLevel(std::string_view v) {
  if (v == "trace") return spdlog::level::trace;
  if (v == "debug") return spdlog::level::debug;
  if (v == "info") return spdlog::level::info;
  if (v == "warn") return spdlog::level::warn;
  if (v == "error") return spdlog::level::err;
  if (v == "off") return spdlog::level::off;
  return std::nullopt;
}

int PodMain(int argc, char** argv, PodMainOptions options) {
  // First of all, so every thread started from here on inherits the mask
  // and the signals reach only the signalfd.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  PodArgsResult parsed = ParsePodArgs(argc, argv, options);
  if (!parsed.args.has_value()) {
    WriteAll(parsed.exit_code == kPodExitOk ? STDOUT_FILENO : STDERR_FILENO,
             parsed.text);
    return parsed.exit_code;
  }
  PodArgs& args = *parsed.args;
  const std::string program = ProgramName(options, argc, argv);
  // The pod id names every line of the pod's log (the logger, and the pod
  // field of JSON lines), so it is settled here rather than in the manager.
  if (args.config.manager.pod_id.empty()) {
    args.config.manager.pod_id = DefaultPodId();
  }
  const std::string& pod = args.config.manager.pod_id;
  std::shared_ptr<spdlog::logger> logger = MakePodLogger(pod, args);
  spdlog::set_default_logger(logger);
  SPDLOG_LOGGER_INFO(logger, "pod starting pod={} program={} config_file={} {}",
                     pod, program,
                     args.config_path.empty() ? "<none>" : args.config_path,
                     args.config.ToString());

  absl::StatusOr<std::unique_ptr<NodeRegistry>> registry =
      MakeNodeRegistry(args.config, logger);
  if (!registry.ok()) {
    SPDLOG_LOGGER_ERROR(logger, "pod not started pod={}: {}", pod,
                        std::string(registry.status().message()));
    return kPodExitBadConfig;
  }
  // A registry that refuses the pod's settings (a wrong password, no such
  // user, a database it does not have) will not start working by itself:
  // fail now, before any shard, rather than run idle and look like an
  // outage. An unreachable one is retried by the manager.
  if (absl::Status s = CheckRegistrySettings(**registry, args.config);
      !s.ok()) {
    SPDLOG_LOGGER_ERROR(logger,
                        "pod not started pod={}: the registry refuses its "
                        "settings (check registry.* in the pod config): {}",
                        pod, s);
    return kPodExitBadConfig;
  }
  const int signal_fd = signalfd(-1, &signals, SFD_CLOEXEC);
  if (signal_fd < 0) {
    SPDLOG_LOGGER_ERROR(logger, "pod not started pod={}: signalfd: {}", pod,
                        strerror(errno));
    return kPodExitFailed;
  }
  MetricsRegistry own_metrics;
  MetricsRegistry* metrics =
      options.metrics != nullptr ? options.metrics : &own_metrics;
  PodSeries series(*metrics, args.config);
  // The pod's updater pool, shared by every node's syncers. Declared before
  // the manager: it outlives the nodes (the manager stops them first).
  std::unique_ptr<UpdaterPool> updaters;
  if (args.config.updater_threads > 0) {
    updaters = std::make_unique<UpdaterPool>(
        UpdaterPoolOptions{.name = absl::StrCat(pod, "/updaters"),
                           .threads = args.config.updater_threads,
                           .logger = logger});
    if (absl::Status s = updaters->Start(); !s.ok()) {
      SPDLOG_LOGGER_ERROR(logger, "pod not started pod={}: updaters: {}", pod,
                          s);
      close(signal_fd);
      return kPodExitFailed;
    }
  }
  // The pod's loop pool, shared by every node's reconcile loops; declared
  // before the manager for the same reason.
  std::unique_ptr<LoopPool> loops;
  if (args.config.loop_threads > 0) {
    loops = std::make_unique<LoopPool>(
        LoopPoolOptions{.name = absl::StrCat(pod, "/loops"),
                        .max_threads = args.config.loop_threads,
                        .logger = logger});
    if (absl::Status s = loops->Start(); !s.ok()) {
      SPDLOG_LOGGER_ERROR(logger, "pod not started pod={}: loops: {}", pod, s);
      close(signal_fd);
      return kPodExitFailed;
    }
  }
  // The pod's runner pool, on which every node's runner runs; declared
  // before the manager for the same reason.
  std::unique_ptr<RunnerPool> runners;
  if (args.config.runner_threads > 0) {
    runners = std::make_unique<RunnerPool>(
        RunnerPoolOptions{.name = absl::StrCat(pod, "/runners"),
                          .threads = args.config.runner_threads,
                          .logger = logger});
    if (absl::Status s = runners->Start(); !s.ok()) {
      SPDLOG_LOGGER_ERROR(logger, "pod not started pod={}: runners: {}", pod,
                          s);
      close(signal_fd);
      return kPodExitFailed;
    }
  }
  NodeManagerOptions manager_options = args.config.manager;
  manager_options.runners = runners.get();
  manager_options.updaters = updaters.get();
  manager_options.loops = loops.get();
  manager_options.registry = registry->get();
  manager_options.logger = logger;
  manager_options.metrics = metrics;
  NodeManager manager(std::move(manager_options));
  // The listener first: a port in use fails the pod before it takes shards.
  std::unique_ptr<OpsServer> ops;
  if (!args.config.http_address.empty()) {
    const absl::Duration stuck_after = args.config.stuck_after;
    absl::StatusOr<std::unique_ptr<OpsServer>> server = OpsServer::Start({
        .address = args.config.http_address,
        .metrics = metrics,
        .liveness = [&manager,
                     stuck_after] { return manager.Liveness(stuck_after); },
        .readiness = [&manager,
                      stuck_after] { return manager.Readiness(stuck_after); },
        .before_metrics =
            [&manager, &series, stuck_after] {
              series.SetReady(manager.Readiness(stuck_after).empty());
            },
        .status =
            [&manager, stuck_after, config = args.config.ToString()] {
              // The config first (its password redacted), then the pod's.
              std::string json = "{\"config\":";
              AppendJsonString(&json, config);
              json += ",";
              json += manager.StatusJson(stuck_after).substr(1);
              return json;
            },
        .logger = logger,
    });
    if (!server.ok()) {
      SPDLOG_LOGGER_ERROR(logger, "pod not started pod={}: http.address: {}",
                          pod, std::string(server.status().message()));
      close(signal_fd);
      return kPodExitFailed;
    }
    ops = *std::move(server);
    series.Listen(ops.get());
  }
  if (absl::Status s = manager.Start(); !s.ok()) {
    SPDLOG_LOGGER_ERROR(logger, "pod not started pod={}: {}", pod, s);
    close(signal_fd);
    return absl::IsInvalidArgument(s) ? kPodExitBadConfig : kPodExitFailed;
  }
  if (options.on_started != nullptr) {
    const absl::Status started =
        CallUserCode("on_started", [&] { options.on_started(manager); });
    if (!started.ok()) {
      SPDLOG_LOGGER_ERROR(logger, "pod stopping pod={}: {}", pod,
                          started.ToString());
      manager.Stop();
      close(signal_fd);
      return kPodExitFailed;
    }
  }

  std::optional<std::chrono::steady_clock::time_point> deadline;
  if (args.duration > absl::ZeroDuration() &&
      args.duration < absl::InfiniteDuration()) {
    deadline = std::chrono::steady_clock::now() +
               absl::ToChronoNanoseconds(args.duration);
  }
  int exit_code = kPodExitOk;
  const int sig = WaitForSignal(signal_fd, -1, deadline);
  if (sig > 0) {
    SPDLOG_LOGGER_INFO(logger,
                       "pod stopping pod={} signal={}: handing the shards "
                       "over; another signal exits at once",
                       pod, SignalName(sig));
  } else if (sig == 0) {
    SPDLOG_LOGGER_INFO(logger,
                       "pod stopping pod={} duration={}: handing the shards "
                       "over",
                       pod, args.duration);
  } else {
    SPDLOG_LOGGER_ERROR(logger,
                        "pod stopping pod={}: waiting for signals failed: {}",
                        pod, strerror(errno));
    exit_code = kPodExitFailed;
  }

  // A second signal during the graceful stop ends the process at once.
  const int wake_fd = eventfd(0, EFD_CLOEXEC);
  std::jthread watcher;
  if (wake_fd >= 0) {
    watcher = std::jthread([&] {
      pthread_setname_np(pthread_self(), "sp-signals");
      int again = WaitForSignal(signal_fd, wake_fd, std::nullopt);
      if (again > 0) {
        WriteAll(STDERR_FILENO,
                 absl::StrCat(program, ": second ", SignalName(again),
                              " during the graceful stop; exiting at once\n"));
        _exit(kPodExitFailed);
      }
    });
  } else {
    SPDLOG_LOGGER_WARN(logger,
                       "pod stopping pod={} without a watch for a second "
                       "signal: eventfd: {}",
                       pod, strerror(errno));
  }
  manager.Stop();
  // Every node's Run has returned, and with it its syncers stopped.
  if (updaters != nullptr) updaters->Stop();
  if (loops != nullptr) loops->Stop();
  if (runners != nullptr) runners->Stop();
  series.Listen(nullptr);
  if (ops != nullptr) ops->Stop();  // Served /readyz "not ready" meanwhile.
  if (wake_fd >= 0) {
    uint64_t one = 1;
    ssize_t n = write(wake_fd, &one, sizeof(one));
    (void)n;
    watcher.join();
    close(wake_fd);
  }
  close(signal_fd);
  SPDLOG_LOGGER_INFO(logger, "pod stopped pod={} exit_code={}", pod, exit_code);
  return exit_code;
}

}  // namespace setpoint
