// setpointctl: the operator's view of a shared registry (docs/setpointctl.md).
//
//   setpointctl --registry.type=redis --registry.address=h:6379
//       --registry.namespace=prod status [--json]
//   setpointctl --registry.type=redis --registry.master_name=setpoint
//       --registry.sentinels=s1:26379,s2:26379,s3:26379 status
//   setpointctl --config=pod.yaml drain pod-b
//   setpointctl --config=pod.yaml watch --interval=1s
//
// Reads the registry settings from the same flags, YAML (--config) and
// environment (registry.password_env) as a pod. Exit codes: 0 done, 1 the
// registry failed or could not be reached, 2 usage or bad configuration.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "setpoint/base/context.h"
#include "setpoint/node/node_registry.h"
#include "setpoint/pod/pod_config.h"
#include "setpoint/pod/pod_main.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"
#include "status.h"

namespace setpoint::ctl {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitRegistry = 1;
constexpr int kExitUsage = 2;

constexpr char kUsage[] = R"(usage: setpointctl [flags] <command> [args]

Shows and steers the shard ownership a shared registry records, read with
the same registry settings a pod uses (flags, --config YAML, environment).

Commands:
  status              every pod and node of every kind: range, share of the
                      ring, token, lease, epoch, when grants open, unowned
                      shards; --json for one JSON object
  drain <pod>         mark the pod drained: every pod's nodes share the ring
                      without it, so its nodes hand their shards over and stay
                      idle (still renewing their leases)
  undrain <pod>       remove the mark: the pod takes its share again
  watch               status, redrawn whenever ownership changes, until
                      SIGINT/SIGTERM

Flags:
  --config=<path>               a pod's YAML config; its registry settings are used
  --registry.type=redis         the registry to read (memory is one process's own)
  --registry.address=<address>  host:port, [::1]:port or unix:///path
  --registry.namespace=<name>   the deployment's namespace (default default)
  --registry.sentinels=<h:p,..> ask these Redis Sentinels for the master instead
                                of --registry.address (with --registry.master_name)
  --registry.<key>=<value>      username, password, password_env, password_file,
                                db, connect_timeout, command_timeout, master_name,
                                sentinel_username, sentinel_password(_env, _file):
                                as for a pod
  --json                        status and watch: print JSON instead of a table
  --interval=<duration>         watch: look this often (default 1s)
  --count=<n>                   watch: stop after n redraws (default 0: until a signal)
  --timeout=<duration>          give up one command after this (default 5s)
  --log_level=<level>           registry client logs on stderr: trace, debug, info,
                                warn, error or off (default off)
  --help                        print this and exit

Any other pod config key (--lease=..., --kinds.<kind>.ring_size=...) is
accepted and checked as a pod would, and otherwise unused.

Exit codes: 0 done (watch: stopped by a signal or --count), 1 the registry
failed or could not be reached, 2 usage or bad configuration.
)";

struct Args {
  std::string command;
  std::vector<std::string> operands;
  std::string config_path;
  std::vector<std::string> overrides;
  bool json = false;
  absl::Duration interval = absl::Seconds(1);
  int64_t count = 0;
  absl::Duration timeout = absl::Seconds(5);
  spdlog::level::level_enum log_level = spdlog::level::off;
};

// What parsing decided: run with `args`, or exit with `code` after `text`.
struct Parsed {
  std::optional<Args> args;
  int code = kExitOk;
  std::string text;
};

std::string Escape(absl::string_view s) { return absl::CHexEscape(s); }

Parsed Usage(std::string message) {
  return Parsed{.args = std::nullopt,
                .code = kExitUsage,
                .text = absl::StrCat("setpointctl: ", message, "\n")};
}

bool IsPodConfigKey(absl::string_view name) {
  if (absl::StartsWith(name, "kinds.")) return true;
  for (const PodConfigKey& key : PodConfigKeys()) {
    if (absl::string_view(key.path.data(), key.path.size()) == name) {
      return true;
    }
  }
  return false;
}

Parsed Parse(int argc, char** argv) {
  Args args;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "help") {
      return Parsed{.args = std::nullopt, .code = kExitOk, .text = kUsage};
    }
    if (!absl::ConsumePrefix(&arg, "--")) {
      positional.emplace_back(arg);
      continue;
    }
    const size_t eq = arg.find('=');
    const std::string name(arg.substr(0, eq));
    if (name.empty()) {
      return Usage(absl::StrCat("argument ", i,
                                " is not a flag; flags are --name=value"));
    }
    if (name == "json" && eq == absl::string_view::npos) {
      args.json = true;
      continue;
    }
    if (eq == absl::string_view::npos) {
      // Never echo what follows: it may be a password given as a separate
      // argument.
      return Usage(absl::StrCat("flag --", Escape(name), " needs a value: --",
                                Escape(name), "=<value> (see --help)"));
    }
    const absl::string_view value = arg.substr(eq + 1);
    if (name == "config") {
      args.config_path = std::string(value);
    } else if (name == "json") {
      if (value != "true" && value != "false") {
        return Usage(absl::StrCat("--json must be true or false, got \"",
                                  Escape(value), "\""));
      }
      args.json = value == "true";
    } else if (name == "interval" || name == "timeout") {
      absl::Duration d;
      if (!absl::ParseDuration(value, &d) || d <= absl::ZeroDuration() ||
          d == absl::InfiniteDuration()) {
        return Usage(absl::StrCat("--", name, ": \"", Escape(value),
                                  "\" is not a positive duration (like "
                                  "500ms or 2s)"));
      }
      (name == "interval" ? args.interval : args.timeout) = d;
    } else if (name == "count") {
      if (!absl::SimpleAtoi(value, &args.count) || args.count < 0) {
        return Usage(absl::StrCat("--count: \"", Escape(value),
                                  "\" is not a whole number >= 0"));
      }
    } else if (name == "log_level") {
      std::optional<spdlog::level::level_enum> level =
          ParsePodLogLevel(std::string_view(value.data(), value.size()));
      if (!level.has_value()) {
        return Usage(absl::StrCat(
            "--log_level must be trace, debug, info, warn, error or off, "
            "got \"",
            Escape(value), "\""));
      }
      args.log_level = *level;
    } else if (IsPodConfigKey(name)) {
      args.overrides.emplace_back(argv[i]);
    } else {
      return Usage(
          absl::StrCat("unknown flag --", Escape(name), " (see --help)"));
    }
  }
  if (positional.empty()) {
    return Usage(
        "no command: status, drain <pod>, undrain <pod> or watch "
        "(see --help)");
  }
  args.command = positional[0];
  args.operands.assign(positional.begin() + 1, positional.end());
  const bool takes_pod = args.command == "drain" || args.command == "undrain";
  if (args.command != "status" && args.command != "watch" && !takes_pod) {
    return Usage(absl::StrCat("unknown command \"", Escape(args.command),
                              "\": status, drain, undrain or watch"));
  }
  if (takes_pod && args.operands.size() != 1) {
    return Usage(absl::StrCat(args.command, " takes one pod id, got ",
                              args.operands.size(), " arguments"));
  }
  if (!takes_pod && !args.operands.empty()) {
    return Usage(absl::StrCat(args.command, " takes no arguments, got \"",
                              Escape(args.operands[0]), "\""));
  }
  if (takes_pod) {
    if (absl::Status s = ValidatePodId(args.operands[0]); !s.ok()) {
      return Usage(absl::StrCat(args.command, ": ", s.message()));
    }
  }
  return Parsed{.args = std::move(args), .code = kExitOk, .text = ""};
}

// Where the registry is, for messages and the status header: the address,
// or the master's name and the sentinels asked for it.
std::string SourceAddress(const PodConfig& config) {
  if (config.redis.sentinels.empty()) return config.redis.address;
  return absl::StrCat("master ", config.redis.master_name, " via sentinels ",
                      absl::StrJoin(config.redis.sentinels, ","));
}

class Ctl {
 public:
  Ctl(Args args, const PodConfig& config,
      std::unique_ptr<NodeRegistry> registry)
      : args_(std::move(args)),
        registry_(std::move(registry)),
        source_{.address = SourceAddress(config), .ns = config.redis.ns} {}

  int Run() {
    if (args_.command == "status") return RunStatus();
    if (args_.command == "watch") return RunWatch();
    return RunDrain(args_.command == "drain", args_.operands[0]);
  }

 private:
  Context Call() const {
    return Context::Background().WithTimeout(args_.timeout);
  }

  int Fail(const absl::Status& s) const {
    std::fprintf(stderr, "setpointctl: registry %s (namespace %s): %s\n",
                 source_.address.c_str(), source_.ns.c_str(),
                 std::string(s.message()).c_str());
    return kExitRegistry;
  }

  std::string Render(const Status& status) const {
    return args_.json ? StatusJson(status, source_)
                      : StatusText(status, source_);
  }

  void Print(const std::string& text) const {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }

  int RunStatus() {
    absl::StatusOr<RegistryDescription> d = registry_->Describe(Call());
    if (!d.ok()) return Fail(d.status());
    Print(Render(BuildStatus(*d)));
    return kExitOk;
  }

  int RunDrain(bool drain, const std::string& pod) {
    if (absl::Status s = registry_->SetDrained(Call(), pod, drain); !s.ok()) {
      return Fail(s);
    }
    std::string out =
        drain ? absl::StrCat("pod ", pod,
                             " drained: its nodes hand their shards over and "
                             "stay idle until `setpointctl undrain ",
                             pod, "`\n")
              : absl::StrCat("pod ", pod,
                             " undrained: it takes its share "
                             "again\n");
    // What the registry shows now, as a hint; the drain itself is done.
    absl::StatusOr<RegistryDescription> d = registry_->Describe(Call());
    if (d.ok()) {
      Status status = BuildStatus(*d);
      bool member = false;
      for (const PodRow& p : status.pods) {
        if (p.pod == pod && p.nodes > 0) member = true;
      }
      if (!member) {
        absl::StrAppend(&out, "note: pod ", pod,
                        " has no live node in the registry now; the flag "
                        "applies when it joins\n");
      }
      if (status.all_drained) {
        absl::StrAppend(&out,
                        "warning: every pod is drained now: nobody owns "
                        "anything until one is undrained\n");
      }
    }
    Print(out);
    return kExitOk;
  }

  int RunWatch() {
    // SIGINT/SIGTERM end the watch; they are taken by sigtimedwait between
    // looks.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    const bool tty = isatty(STDOUT_FILENO) == 1;
    std::string last;
    int64_t redraws = 0;
    while (true) {
      absl::StatusOr<RegistryDescription> d = registry_->Describe(Call());
      std::string fingerprint;
      std::string text;
      if (d.ok()) {
        Status status = BuildStatus(*d);
        fingerprint = StatusFingerprint(status);
        text = Render(status);
      } else {
        fingerprint = ErrorFingerprint(d.status());
        text = absl::StrCat("registry ", source_.address, " (namespace ",
                            source_.ns, "): ", d.status().message(), "\n");
      }
      if (fingerprint != last) {
        last = fingerprint;
        if (tty && !args_.json) {
          text = "\x1b[H\x1b[2J" + text;
        } else if (redraws > 0 && !args_.json) {
          text = "\n" + text;
        }
        Print(text);
        ++redraws;
        if (args_.count > 0 && redraws >= args_.count) return kExitOk;
      }
      timespec wait = absl::ToTimespec(args_.interval);
      int sig;
      do {
        sig = sigtimedwait(&signals, nullptr, &wait);
      } while (sig < 0 && errno == EINTR);
      if (sig > 0) return kExitOk;
    }
  }

  Args args_;
  std::unique_ptr<NodeRegistry> registry_;
  StatusSource source_;
};

int Main(int argc, char** argv) {
  Parsed parsed = Parse(argc, argv);
  if (!parsed.args.has_value()) {
    std::fputs(parsed.text.c_str(), parsed.code == kExitOk ? stdout : stderr);
    return parsed.code;
  }
  Args& args = *parsed.args;
  // LoadPodConfig checks a pod's whole config, which names at least one
  // kind; setpointctl runs none, so it lends one that nothing uses.
  NodeKindOptions lent{.kind = "setpointctl",
                       .count = 1,
                       .ring_size = kDefaultRingSize,
                       .factory = [](const NodeInfo&) -> std::unique_ptr<Node> {
                         return nullptr;
                       }};
  absl::StatusOr<PodConfig> config =
      LoadPodConfig(args.config_path, args.overrides, {lent});
  if (!config.ok()) {
    std::fprintf(stderr, "setpointctl: %s\n",
                 std::string(config.status().message()).c_str());
    return kExitUsage;
  }
  if (config->registry_type != "redis") {
    std::fprintf(stderr,
                 "setpointctl: registry.type is %s: an in-memory registry is "
                 "one process's own; give --registry.type=redis with "
                 "--registry.address (or --registry.sentinels and "
                 "--registry.master_name) and --registry.namespace, or a "
                 "pod's --config\n",
                 config->registry_type.c_str());
    return kExitUsage;
  }
  auto logger = std::make_shared<spdlog::logger>(
      "setpointctl", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_level(args.log_level);
  absl::StatusOr<std::unique_ptr<NodeRegistry>> registry =
      MakeNodeRegistry(*config, logger);
  if (!registry.ok()) {
    std::fprintf(stderr, "setpointctl: %s\n",
                 std::string(registry.status().message()).c_str());
    return kExitUsage;
  }
  Ctl ctl(std::move(args), *config, *std::move(registry));
  return ctl.Run();
}

}  // namespace
}  // namespace setpoint::ctl

int main(int argc, char** argv) { return setpoint::ctl::Main(argc, argv); }
