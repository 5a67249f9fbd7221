// PodMain: the entry point of a pod program. It turns flags and a YAML file
// into a PodConfig, makes the registry it names, runs a NodeManager with the
// program's kinds until SIGINT/SIGTERM (or --duration), and stops it
// gracefully, so the shards are handed over at once (docs/pod.md).
//
//   int main(int argc, char** argv) {
//     int jobs = 1000;
//     return setpoint::PodMain(argc, argv, {
//         .program = "jobs",
//         .description = "Runs the jobs of the catalogue it owns.",
//         .kinds = {JobsKind(&jobs).ToNodeKind()},  // a ControllerKind
//         .flags = {{.name = "jobs", .help = "jobs in the catalogue",
//                    .set = [&](const std::string& v) {
//                      return absl::SimpleAtoi(v, &jobs)
//                                 ? absl::OkStatus()
//                                 : absl::InvalidArgumentError("not a number");
//                    }}},
//     });
//   }
//
//   jobs --kinds.jobs.count=4 --registry.type=redis --registry.address=h:6379
//   jobs --config=pod.yaml --log_format=json --duration=1m
//
// Flags are "--name=value": --config=<yaml>, every PodConfig key
// (--lease=5s, --kinds.<kind>.count=4, --registry.address=...),
// --duration=<d>, --log_level=<level>, --log_format=text|json, --help, and
// the program's own PodFlags. A later flag wins over an earlier one, and
// flags win over the file.
//
// Exit codes (PodMain's return value):
//   0 (kPodExitOk)        stopped by SIGINT/SIGTERM or at the end of
//                         --duration, or --help;
//   1 (kPodExitFailed)    the manager did not start (a factory failed, an
//                         on_started callback threw), the http.address
//                         listener could not bind, a second SIGINT/SIGTERM
//                         during the graceful stop (the process _exits), or
//                         the program's options are broken (a PodFlag that
//                         clashes with a built-in one, a kind without
//                         factory);
//   2 (kPodExitBadConfig) bad flags, YAML or values, a kind the program
//                         does not run, or a registry that refuses the
//                         pod's settings at start (a wrong password, no
//                         such user, a database it does not have), before
//                         any shard is taken.
// A registry that cannot be reached at start is not a failure: the manager
// keeps retrying, and its nodes stay idle until it answers.
//
// Signals: PodMain blocks SIGINT and SIGTERM in the calling thread first, so
// every thread started after it inherits the mask, and takes them through a
// signalfd. Call it from main() before starting threads of your own (a
// thread started earlier would still take the default action: death). They
// stay blocked when it returns.
//
// Logs: spdlog's default logger becomes a stderr logger named after the
// pod id (pod_id, else DefaultPodId()), and is the logger given to the
// manager and the registry; the pod's own lines name the pod (pod=). Text:
//   2026-12-01T10:28:05.384123Z info a: node manager started pod=a nodes=2
// JSON (--log_format=json), one object per line, with the fields of
// LogFields beside msg:
//   {"time":"2026-12-01T10:28:05.384123Z","level":"info","logger":"a",
//    "pod":"a","msg":"node manager started pod=a nodes=2"}
// /metrics also has the pod's own series: setpoint_pod_ready,
// setpoint_kind_ring_size, setpoint_ops_http_* and process_*
// (docs/operations.md).
//
// Thread safety: PodMain belongs to the main thread and is called once.
// ParsePodArgs, PodUsage, MakeNodeRegistry and MakePodLogger are pure or
// only create objects; they may be called from any thread.
#ifndef SETPOINT_POD_POD_MAIN_H_
#define SETPOINT_POD_POD_MAIN_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "setpoint/base/metrics.h"
#include "setpoint/node/node_manager.h"
#include "setpoint/node/node_registry.h"
#include "setpoint/pod/pod_config.h"
#include "spdlog/common.h"
#include "spdlog/formatter.h"
#include "spdlog/logger.h"

namespace setpoint {

inline constexpr int kPodExitOk = 0;
inline constexpr int kPodExitFailed = 1;
inline constexpr int kPodExitBadConfig = 2;

// An extra flag of the program, given as --<name>=<value>.
struct PodFlag {
  // Without dashes; must not be a built-in flag or a PodConfig key.
  std::string name = "";
  // One line for --help.
  std::string help = "";
  // Called during parsing with the value of each occurrence, in order. An
  // error is a bad value: the pod exits with code 2, printing the flag and
  // the message. Required. The value is a std::string, so a setter may take
  // `const std::string&`, `std::string_view` or `absl::string_view` and hand
  // it to absl::SimpleAtoi or absl::ParseDuration as it is (with Debian's
  // abseil, absl::string_view is not std::string_view).
  std::function<absl::Status(const std::string& value)> set = nullptr;
};

struct PodMainOptions {
  // Names the program in --help, messages and the logger.
  // Default: the last part of argv[0].
  std::string program = "";
  // One paragraph for --help.
  // Default: none.
  std::string description = "";
  // What the program runs: the kind names and factories. count and
  // ring_size are defaults that the config may change
  // (kinds.<kind>.count); a kind the config names that is not here is an
  // error (exit code 2). At least one.
  std::vector<NodeKindOptions> kinds = {};
  // The program's own flags.
  // Default: none.
  std::vector<PodFlag> flags = {};
  // Read when --config is not given (--config= with an empty value reads no
  // file). A file that does not exist is an error like any other.
  // Default: none (no file).
  std::string default_config_path = "";
  // Called on the main thread once the manager started, before PodMain
  // waits for a signal. Default: none.
  std::function<void(NodeManager&)> on_started = nullptr;
  // Where the pod's parts publish their series, served at /metrics; give
  // your own to add series of the program's. Must outlive PodMain.
  // Default: one of PodMain's own.
  MetricsRegistry* metrics = nullptr;
};

enum class PodLogFormat { kText, kJson };

// What the command line asks for.
struct PodArgs {
  // The program's kinds (with their factories) merged with the config's.
  PodConfig config = {};
  // The file read, "" for none.
  std::string config_path = "";
  // How long to run; zero (or infinite) runs until a signal.
  absl::Duration duration = absl::ZeroDuration();
  spdlog::level::level_enum log_level = spdlog::level::info;
  PodLogFormat log_format = PodLogFormat::kText;
};

// The outcome of ParsePodArgs: run with `args`, or exit.
struct PodArgsResult {
  // Set when the pod should run; then exit_code and text are unused.
  std::optional<PodArgs> args;
  // When `args` is empty: the exit code (0 for --help, 1 or 2 as in the
  // header comment)...
  int exit_code = kPodExitOk;
  // ...and what to print, ending in a newline: the usage on stdout for
  // --help, else one message on stderr, starting with the program's name
  // and naming the flag or the field. Never holds a flag's value unless it
  // is needed to explain the error (never a password).
  std::string text = "";
};

// Parses argv[1..argc) as above: checks the program's options, calls the
// PodFlags' setters, reads the config file and validates everything.
// Touches no signal and does not exit.
PodArgsResult ParsePodArgs(int argc, const char* const* argv,
                           const PodMainOptions& options);

// The --help text: the program, its description, its kinds, every flag
// (built-in, PodConfig's keys, the program's) and the exit codes.
std::string PodUsage(const PodMainOptions& options);

// The registry `config` names: "memory" -> InMemoryNodeRegistry, "redis" ->
// RedisNodeRegistry::Create(config.redis), logging to `logger` unless
// config.redis.logger is set. Does not connect: an unreachable Redis is not
// an error here (the manager retries). Returns kInvalidArgument for another
// type or options that do not validate (the message names the field).
absl::StatusOr<std::unique_ptr<NodeRegistry>> MakeNodeRegistry(
    const PodConfig& config, std::shared_ptr<spdlog::logger> logger);

// A formatter that writes each message as one JSON object on one line:
// time (RFC 3339, UTC, microseconds), level (trace, debug, info, warn,
// error, critical), logger, then the fields of LogFields (pod, node, kind,
// component, key: those there are), then msg, unchanged. Strings are
// JSON-escaped; control bytes become \uXXXX, and bytes that are not UTF-8
// become U+FFFD. `pod` is the pod field of lines that name none.
std::unique_ptr<spdlog::formatter> MakeJsonLogFormatter(std::string pod = "");

// The fields a JSON log line carries beside msg, read from the house format
// of messages ("event phrase key=value key=\"quoted\" ..."):
//   node       node=, else the logger's name when it is a node id
//              (<pod>/<kind>/<index>: a controller's parts log through a
//              logger named so);
//   pod, kind  pod= and kind=, else the parts of the node id, else (pod)
//              `pod`;
//   component  component=, else the first of syncer=, source=, plan=,
//              runner= as "<part>/<name>" ("syncer/records");
//   key        key=.
// In that order, each at most once, empty ones left out.
std::vector<std::pair<std::string, std::string>> LogFields(
    absl::string_view msg, absl::string_view logger, absl::string_view pod);

// A logger named `name` at `args.log_level` in `args.log_format`, writing to
// `sink` (Default: a stderr sink, coloured when it is a terminal and the
// format is text). Does not register it with spdlog.
std::shared_ptr<spdlog::logger> MakePodLogger(const std::string& name,
                                              const PodArgs& args,
                                              spdlog::sink_ptr sink = nullptr);

// The level a --log_level value names (trace, debug, info, warn, error,
// off), or nullopt.
std::optional<spdlog::level::level_enum> ParsePodLogLevel(std::string_view v);

// Runs the pod as described above and returns its exit code; main() should
// return it. May not return: a second SIGINT/SIGTERM during the graceful
// stop ends the process with _exit(1) after one line on stderr.
int PodMain(int argc, char** argv, PodMainOptions options);

}  // namespace setpoint

#endif  // SETPOINT_POD_POD_MAIN_H_
