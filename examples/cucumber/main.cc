// cucumber: a controller that keeps a cluster of N instances and a DNS record
// listing exactly their addresses, on a simulated flaky cloud.
//
//   cucumber                                  # the demo scenario (default)
//   cucumber --mode=once --request=cluster.yaml --report=dot | dot -Tsvg
//   cucumber --mode=reconcile --nodes_num=4 --duration=20s --chaos_every=5s
//
// Exit codes: 0 converged, 1 did not converge (or interrupted), 2 bad input.

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cucumber/cloud.h"
#include "cucumber/console.h"
#include "cucumber/cucumber_plan.h"
#include "cucumber/request.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/context.h"
#include "setpoint/base/format.h"
#include "setpoint/base/mutex.h"
#include "setpoint/planner/execution_report.h"
#include "setpoint/planner/reconcile_loop.h"
#include "setpoint/planner/scheduler.h"
#include "spdlog/fmt/fmt.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, request, "",
          "YAML file with the request (keys name, nodes_num, dns_name); "
          "replaces --name/--nodes_num/--dns_name");
ABSL_FLAG(std::string, name, "demo", "cluster name");
ABSL_FLAG(int32_t, nodes_num, 3, "running instances wanted (0-1000)");
ABSL_FLAG(std::string, dns_name, "demo.example.com",
          "A record that must list exactly the instances' addresses");
ABSL_FLAG(std::string, mode, "demo",
          "once: run the plan until it converges, once; reconcile: run it "
          "every --interval for --duration; demo: the guided scenario");
ABSL_FLAG(absl::Duration, latency, absl::Milliseconds(10),
          "simulated time each cloud API call takes");
ABSL_FLAG(double, error_rate, 0.15,
          "fraction of cloud API calls failing with an injected 503 (0-1)");
ABSL_FLAG(absl::Duration, dns_propagation, absl::Milliseconds(300),
          "time a DNS change takes to become visible to reads");
ABSL_FLAG(uint64_t, seed, 1,
          "seed of the injected errors and the demo's faults");
ABSL_FLAG(absl::Duration, interval, absl::Seconds(2),
          "reconcile mode: time between executions");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(10),
          "reconcile mode: how long to run before stopping");
ABSL_FLAG(absl::Duration, chaos_every, absl::ZeroDuration(),
          "reconcile mode: lose one instance this often (0: never)");
ABSL_FLAG(std::string, report, "summary",
          "how to print each execution: summary (a step table), json or dot "
          "(Graphviz)");
ABSL_FLAG(std::string, log_level, "error",
          "spdlog level on stderr: trace, debug, info, warn, error, off");

namespace cucumber {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitNotConverged = 1;
constexpr int kExitBadInput = 2;

// The flags this program accepts, in the order --help lists them.
constexpr std::string_view kFlags[] = {
    "request",  "name",        "nodes_num",       "dns_name", "mode",
    "latency",  "error_rate",  "dns_propagation", "seed",     "interval",
    "duration", "chaos_every", "report",          "log_level"};

// Executions a demo phase may take before it counts as not converged.
constexpr int kMaxExecutionsPerPhase = 3;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// ---- Command line ---------------------------------------------------------

struct CommandLine {
  std::set<std::string> given;  // Flags set on the command line.
  bool help = false;
};

bool KnownFlag(std::string_view name) {
  for (std::string_view f : kFlags) {
    if (f == name) return true;
  }
  return false;
}

// Parses argv into the flags above. Unlike absl::ParseCommandLine (which
// exits with status 1 on a bad flag) it returns kInvalidArgument, so bad
// input exits with status 2 and one clear line.
absl::StatusOr<CommandLine> ParseFlags(int argc, char** argv) {
  CommandLine cl;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "-h" || arg == "-help" || arg == "--help") {
      cl.help = true;
      continue;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      return absl::InvalidArgumentError(fmt::format(
          "unexpected argument \"{}\" (flags look like --nodes_num=3)", arg));
    }
    arg.remove_prefix(arg.substr(0, 2) == "--" ? 2 : 1);
    std::string name(arg.substr(0, arg.find('=')));
    std::string value;
    if (arg.find('=') != std::string_view::npos) {
      value = std::string(arg.substr(arg.find('=') + 1));
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(
          fmt::format("flag --{} needs a value (--{}=...)", name, name));
    }
    absl::CommandLineFlag* flag =
        KnownFlag(name) ? absl::FindCommandLineFlag(name) : nullptr;
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          fmt::format("unknown flag --{} (see --help)", name));
    }
    if (!cl.given.insert(name).second) {
      return absl::InvalidArgumentError(
          fmt::format("flag --{} is given twice", name));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(
          fmt::format("bad value for --{}: {}{}", name, error,
                      flag->IsOfType<absl::Duration>()
                          ? " (durations look like 10ms, 1.5s or 2m)"
                          : ""));
    }
  }
  return cl;
}

void PrintUsage() {
  fmt::print(
      "cucumber: keeps a cluster of N instances and a DNS record listing "
      "exactly\ntheir addresses, on a simulated flaky cloud (setpoint's "
      "example controller).\n\nusage: cucumber [--mode=demo|once|reconcile] "
      "[--request=FILE | --name=.. --nodes_num=.. --dns_name=..] [flags]\n\n");
  for (std::string_view name : kFlags) {
    absl::CommandLineFlag* flag =
        absl::FindCommandLineFlag(absl::string_view(name.data(), name.size()));
    if (flag == nullptr) continue;
    fmt::print("  --{:<16} {}\n  {:<18} (default: {})\n", name, flag->Help(),
               "",
               flag->DefaultValue().empty() ? std::string("none")
                                            : flag->DefaultValue());
  }
  fmt::print("\nexit codes: 0 converged, 1 did not converge, 2 bad input\n");
}

enum class Mode { kOnce, kReconcile, kDemo };
enum class ReportFormat { kSummary, kJson, kDot };

struct Config {
  Mode mode = Mode::kDemo;
  ReportFormat report = ReportFormat::kSummary;
  ClusterRequest request;
  std::string request_source;  // "flags" or the file path.
  CloudOptions cloud;
  absl::Duration interval;
  absl::Duration duration;
  absl::Duration chaos_every;
  spdlog::level::level_enum log_level = spdlog::level::err;
  uint64_t seed = 1;
};

absl::StatusOr<Config> MakeConfig(const CommandLine& cl) {
  Config c;
  std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "once") {
    c.mode = Mode::kOnce;
  } else if (mode == "reconcile") {
    c.mode = Mode::kReconcile;
  } else if (mode == "demo") {
    c.mode = Mode::kDemo;
  } else {
    return absl::InvalidArgumentError(fmt::format(
        "bad value for --mode: \"{}\"; want once, reconcile or demo", mode));
  }
  std::string report = absl::GetFlag(FLAGS_report);
  if (report == "summary") {
    c.report = ReportFormat::kSummary;
  } else if (report == "json") {
    c.report = ReportFormat::kJson;
  } else if (report == "dot") {
    c.report = ReportFormat::kDot;
  } else {
    return absl::InvalidArgumentError(fmt::format(
        "bad value for --report: \"{}\"; want summary, json or dot", report));
  }
  std::string level = absl::GetFlag(FLAGS_log_level);
  static constexpr std::pair<std::string_view, spdlog::level::level_enum>
      kLevels[] = {
          {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
          {"info", spdlog::level::info},   {"warn", spdlog::level::warn},
          {"error", spdlog::level::err},   {"off", spdlog::level::off}};
  bool level_ok = false;
  for (const auto& [text, value] : kLevels) {
    if (level == text) {
      c.log_level = value;
      level_ok = true;
    }
  }
  if (!level_ok) {
    return absl::InvalidArgumentError(fmt::format(
        "bad value for --log_level: \"{}\"; want trace, debug, info, warn, "
        "error or off",
        level));
  }

  c.seed = absl::GetFlag(FLAGS_seed);
  c.cloud.latency = absl::GetFlag(FLAGS_latency);
  c.cloud.dns_propagation = absl::GetFlag(FLAGS_dns_propagation);
  c.cloud.error_rate = absl::GetFlag(FLAGS_error_rate);
  c.cloud.seed = c.seed;
  if (!(c.cloud.error_rate >= 0.0 && c.cloud.error_rate <= 1.0)) {
    return absl::InvalidArgumentError(
        fmt::format("bad value for --error_rate: must be in [0, 1], got {}",
                    c.cloud.error_rate));
  }
  if (c.cloud.latency < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(fmt::format(
        "bad value for --latency: must be >= 0, got {}", c.cloud.latency));
  }
  if (c.cloud.dns_propagation < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        fmt::format("bad value for --dns_propagation: must be >= 0, got {}",
                    c.cloud.dns_propagation));
  }
  c.interval = absl::GetFlag(FLAGS_interval);
  c.duration = absl::GetFlag(FLAGS_duration);
  c.chaos_every = absl::GetFlag(FLAGS_chaos_every);
  if (c.interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(fmt::format(
        "bad value for --interval: must be > 0, got {}", c.interval));
  }
  if (c.duration <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(fmt::format(
        "bad value for --duration: must be > 0, got {}", c.duration));
  }
  if (c.chaos_every < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(fmt::format(
        "bad value for --chaos_every: must be >= 0, got {}", c.chaos_every));
  }

  if (cl.given.count("request") != 0) {
    for (const char* f : {"name", "nodes_num", "dns_name"}) {
      if (cl.given.count(f) != 0) {
        return absl::InvalidArgumentError(fmt::format(
            "--request cannot be combined with --{}: put it in the file", f));
      }
    }
    c.request_source = absl::GetFlag(FLAGS_request);
    absl::StatusOr<ClusterRequest> request =
        LoadClusterRequest(c.request_source);
    if (!request.ok())
      return absl::InvalidArgumentError(Message(request.status()));
    c.request = *std::move(request);
  } else {
    c.request_source = "flags";
    absl::StatusOr<ClusterRequest> request =
        NormalizeClusterRequest(ClusterRequest{
            .name = absl::GetFlag(FLAGS_name),
            .nodes_num = absl::GetFlag(FLAGS_nodes_num),
            .dns_name = absl::GetFlag(FLAGS_dns_name),
        });
    if (!request.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("{} (from --name/--nodes_num/--dns_name)",
                      Message(request.status())));
    }
    c.request = *std::move(request);
  }
  return c;
}

// ---- Interrupts ------------------------------------------------------------

// Turns SIGINT/SIGTERM into a stop request. The signals are blocked in every
// thread (call before starting any) and taken by this watcher with
// sigtimedwait, so no code runs in a signal handler.
class InterruptWatcher {
 public:
  InterruptWatcher() {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGINT);
    sigaddset(&signals_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
    thread_ = std::jthread([this](std::stop_token st) {
      const timespec slice = {0, 100'000'000};  // 100 ms.
      while (!st.stop_requested()) {
        if (sigtimedwait(&signals_, nullptr, &slice) > 0) {
          interrupted_.store(true);
          source_.request_stop();
          return;
        }
      }
    });
  }

  std::stop_token token() const { return source_.get_token(); }
  bool interrupted() const { return interrupted_.load(); }

 private:
  sigset_t signals_;
  std::stop_source source_;
  std::atomic<bool> interrupted_{false};
  std::jthread thread_;  // Last: stopped and joined first.
};

// ---- Output ----------------------------------------------------------------

// Serializes whole lines to stdout (the reconcile loop prints from its own
// thread).
class Printer {
 public:
  explicit Printer(std::FILE* out) : out_(out) {}
  void Print(const std::string& text) {
    setpoint::MutexLock l(&mu_);
    std::fputs(text.c_str(), out_);
    std::fflush(out_);
  }

 private:
  setpoint::Mutex mu_;
  std::FILE* const out_;
};

std::string Rule(const std::string& title) {
  std::string line = "== " + title + " ";
  if (line.size() < 78) line.append(78 - line.size(), '=');
  return line + "\n";
}

std::string DescribeCloud(const CloudOptions& o) {
  return fmt::format(
      "simulated cloud: {} per API call, {:.0f}% of calls fail with an "
      "injected 503,\n  DNS changes take {} to become visible",
      ShortDuration(o.latency), o.error_rate * 100,
      ShortDuration(o.dns_propagation));
}

std::string DescribeRequest(const ClusterRequest& r) {
  return fmt::format(
      "cluster {} with {} running instance{}; {} lists exactly "
      "their addresses",
      r.name, r.nodes_num, r.nodes_num == 1 ? "" : "s", r.dns_name);
}

std::string FormatReport(const setpoint::ExecutionReport& report,
                         ReportFormat format) {
  switch (format) {
    case ReportFormat::kJson:
      return report.ToJson() + "\n";
    case ReportFormat::kDot:
      return report.ToDot() + "\n";
    case ReportFormat::kSummary:
      break;
  }
  return "  " + report.Summary() + "\n" + FormatSteps(report, "  ");
}

std::string CallsSince(const CloudStats& before, const CloudStats& after) {
  return fmt::format("{} cloud API calls, {} failed with an injected 503",
                     after.calls() - before.calls(),
                     after.injected_errors - before.injected_errors);
}

struct App {
  Config config;
  setpoint::Context ctx;
  std::shared_ptr<spdlog::logger> logger;
  Printer out{stdout};
};

// Backoff for retried cloud calls, scaled to the simulated latencies so the
// demo stays quick.
constexpr setpoint::BackoffOptions kCloudBackoff = {
    .initial = absl::Milliseconds(25), .max = absl::Milliseconds(500)};

CucumberPlanOptions PlanOptions(const App& app) {
  CucumberPlanOptions o;
  o.step_retry.backoff = kCloudBackoff;
  o.observe_retry.backoff = kCloudBackoff;
  o.seed = app.config.seed;
  o.logger = app.logger;
  return o;
}

setpoint::SchedulerOptions SchedulerOpts(const App& app) {
  setpoint::SchedulerOptions o;
  o.max_rounds = 20;
  o.seed = app.config.seed;  // Reproducible retry jitter.
  o.logger = app.logger;
  return o;
}

// ---- Modes -----------------------------------------------------------------

int RunOnce(App& app) {
  const Config& c = app.config;
  CloudOptions cloud_options = c.cloud;
  cloud_options.logger = app.logger;
  SimulatedCloud cloud(cloud_options);
  CucumberPlan plan(&cloud, c.request, PlanOptions(app));
  setpoint::Scheduler scheduler(SchedulerOpts(app));

  // With --report=json|dot stdout carries only the document (pipe it to jq
  // or dot); the narration goes to stderr.
  Printer err(stderr);
  Printer& talk = c.report == ReportFormat::kSummary ? app.out : err;
  talk.Print(fmt::format("cucumber once: {}\n  (request from {})\n  {}\n\n",
                         DescribeRequest(c.request), c.request_source,
                         DescribeCloud(cloud_options)));
  absl::StatusOr<std::vector<setpoint::PreviewItem>> preview =
      scheduler.Preview(app.ctx, plan);
  if (preview.ok()) {
    talk.Print("preview (the first round; nothing changed yet):\n" +
               setpoint::FormatPreview(*preview) + "\n");
  } else {
    talk.Print(
        fmt::format("preview failed: {}\n\n", Message(preview.status())));
  }
  setpoint::ExecutionReport report = scheduler.Execute(app.ctx, plan);
  if (c.report == ReportFormat::kSummary) {
    app.out.Print("execution:\n" + FormatReport(report, c.report) + "\n");
  } else {
    app.out.Print(FormatReport(report, c.report));
  }
  CloudSnapshot snapshot = cloud.Inspect();
  talk.Print("observed state:\n" + FormatObservedState(snapshot, c.request) +
             fmt::format("  {:<10} {}\n", "cloud",
                         CallsSince(CloudStats{}, cloud.stats())));
  return report.status.ok() && CheckConverged(snapshot, c.request).ok()
             ? kExitOk
             : kExitNotConverged;
}

int RunReconcile(App& app, const InterruptWatcher& interrupts) {
  const Config& c = app.config;
  CloudOptions cloud_options = c.cloud;
  cloud_options.logger = app.logger;
  SimulatedCloud cloud(cloud_options);
  CucumberPlan plan(&cloud, c.request, PlanOptions(app));
  const absl::Time start = absl::Now();

  app.out.Print(fmt::format(
      "cucumber reconcile: {}\n  {}\n  the loop runs the plan every {}, for "
      "{}{}\n\n",
      DescribeRequest(c.request), DescribeCloud(cloud_options),
      ShortDuration(c.interval), ShortDuration(c.duration),
      c.chaos_every > absl::ZeroDuration()
          ? fmt::format("; the cloud loses an instance every {}",
                        ShortDuration(c.chaos_every))
          : std::string()));

  setpoint::ReconcileLoopOptions loop_options;
  loop_options.interval = c.interval;
  loop_options.failure_backoff = {.initial = absl::Milliseconds(200),
                                  .max = c.interval};
  loop_options.scheduler = SchedulerOpts(app);
  loop_options.logger = app.logger;
  loop_options.seed = c.seed;
  // Whether the last execution that ran to its end converged (one cut short
  // by Stop() at the end of --duration does not count). Loop thread only
  // until loop.Stop() returns.
  std::optional<bool> last_converged;
  loop_options.on_report = [&](const setpoint::ExecutionReport& report) {
    std::string when =
        fmt::format("[{:>6}]", ShortDuration(absl::Now() - start));
    bool stopped = absl::IsCancelled(report.status);
    if (!stopped) last_converged = report.status.ok();
    if (c.report != ReportFormat::kSummary) {
      app.out.Print(FormatReport(report, c.report));
      return;
    }
    if (stopped) {
      app.out.Print(fmt::format(
          "{} execution {:<3} cut short by the shutdown (not counted)\n", when,
          report.execution_id));
      return;
    }
    absl::Status state = CheckConverged(cloud.Inspect(), c.request);
    app.out.Print(fmt::format(
        "{} execution {:<3} {:<18} rounds={} steps={} retries={} took {:<6}  "
        "{}\n",
        when, report.execution_id,
        report.status.ok() ? std::string("ok")
                           : absl::StatusCodeToString(report.status.code()),
        report.rounds, report.steps_run, report.retries,
        ShortDuration(report.duration),
        state.ok() ? std::string("world matches the request")
                   : Message(state)));
  };
  setpoint::ReconcileLoop loop(plan, loop_options);
  if (absl::Status s = loop.Start(); !s.ok()) {
    app.out.Print(fmt::format("cannot start the loop: {}\n", Message(s)));
    return kExitNotConverged;
  }

  // Wait out --duration (or an interrupt), losing an instance now and then.
  setpoint::Clock* clock = setpoint::Clock::Real();
  std::mt19937_64 rng(c.seed);
  const absl::Time end = clock->Now() + c.duration;
  absl::Time next_chaos = c.chaos_every > absl::ZeroDuration()
                              ? clock->Now() + c.chaos_every
                              : absl::InfiniteFuture();
  while (clock->SleepUntil(std::min(end, next_chaos), interrupts.token()) &&
         clock->Now() < end) {
    std::vector<Instance> running =
        RunningInstances(cloud.Inspect(), c.request.name);
    if (!running.empty()) {
      const Instance& victim = running[rng() % running.size()];
      if (cloud.InjectLoseInstance(victim.id).ok()) {
        app.out.Print(fmt::format(
            "[{:>6}] chaos: instance {} ({}) died behind the controller's "
            "back\n",
            ShortDuration(absl::Now() - start), victim.id, victim.private_ip));
      }
    }
    next_chaos += c.chaos_every;
  }
  loop.Stop();

  setpoint::ReconcileLoopStats stats = loop.stats();
  const bool last_ok = last_converged.value_or(false);
  CloudSnapshot snapshot = cloud.Inspect();
  const bool matches = CheckConverged(snapshot, c.request).ok();
  app.out.Print(fmt::format(
      "\nstopped after {}{}: {} executions, {} failed; the last one {}\n{}"
      "  {:<10} {}\n",
      ShortDuration(absl::Now() - start),
      interrupts.interrupted() ? " (interrupted)" : "", stats.executions,
      stats.failures, last_ok ? "converged" : "did NOT converge",
      FormatObservedState(snapshot, c.request), "cloud",
      CallsSince(CloudStats{}, cloud.stats())));
  if (last_ok && !matches) {
    app.out.Print(
        "  (the world drifted after the last execution; the next one would "
        "repair it)\n");
  }
  // The loop did its job when its last execution converged.
  return last_ok && !interrupts.interrupted() ? kExitOk : kExitNotConverged;
}

struct Phase {
  std::string title;
  std::string story;
  int nodes_num;
  // Plays the world behind the controller's back; returns what happened.
  std::function<std::string(SimulatedCloud&)> perturb;
};

int RunDemo(App& app) {
  const Config& c = app.config;
  const absl::Time start = absl::Now();
  CloudOptions cloud_options = c.cloud;
  cloud_options.logger = app.logger;
  SimulatedCloud cloud(cloud_options);
  CucumberPlan plan(&cloud, c.request, PlanOptions(app));
  setpoint::Scheduler scheduler(SchedulerOpts(app));
  std::mt19937_64 rng(c.seed);
  const std::string& dns = c.request.dns_name;

  std::vector<Phase> phases = {
      {fmt::format("create a {}-node cluster", c.request.nodes_num),
       "The cloud is empty. The plan sees no instances and no record.",
       c.request.nodes_num, nullptr},
      {"repair: an instance dies, the DNS record is deleted",
       "Behind the controller's back the cloud loses an instance and someone "
       "deletes\nthe record. The plan only looks at the world, so it notices "
       "both and\nrepairs them.",
       c.request.nodes_num,
       [&](SimulatedCloud& cl) {
         std::string what;
         std::vector<Instance> running =
             RunningInstances(cl.Inspect(), c.request.name);
         if (!running.empty()) {
           const Instance& victim = running[rng() % running.size()];
           if (cl.InjectLoseInstance(victim.id).ok()) {
             what += fmt::format("instance {} ({}) died; ", victim.id,
                                 victim.private_ip);
           }
         }
         what += cl.InjectDeleteRecord(dns).ok()
                     ? fmt::format("record {} deleted", dns)
                     : fmt::format("record {} was already gone", dns);
         return what;
       }},
      {"scale up to 5",
       "The request now asks for 5 instances: new ones run first, then the "
       "record\nlists all of them.",
       5, nullptr},
      {"scale down to 2",
       "The request now asks for 2: the record first drops the leaving "
       "instances\n(newest first), then they are terminated.",
       2, nullptr},
  };

  app.out.Print(fmt::format(
      "cucumber demo: reactive planning with setpoint\n\n"
      "  want   {}\n  cloud  {}\n\n"
      "Each phase changes the request or the world, previews the plan's "
      "next round\n(Plan::Create only observes), executes the plan until "
      "Create returns nothing,\nand checks the cloud. Steps that call the "
      "flaky API retry a 503 up to {} times,\nwaiting {} doubling to {} in "
      "between (see \"tries\").\n\n",
      DescribeRequest(c.request), DescribeCloud(cloud_options),
      DefaultCloudRetryPolicy().max_attempts,
      ShortDuration(kCloudBackoff.initial), ShortDuration(kCloudBackoff.max)));

  struct Outcome {
    bool converged;
    int executions;
    absl::Duration took;
    CloudStats calls;
  };
  std::vector<Outcome> outcomes;
  for (size_t i = 0; i < phases.size() && !app.ctx.Done(); ++i) {
    const Phase& phase = phases[i];
    const absl::Time phase_start = absl::Now();
    const CloudStats calls_before = cloud.stats();
    app.out.Print(Rule(fmt::format("phase {}/{}: {}", i + 1, phases.size(),
                                   phase.title)) +
                  phase.story + "\n");
    if (phase.perturb) {
      app.out.Print(fmt::format("  the cloud: {}\n", phase.perturb(cloud)));
    }
    ClusterRequest request = plan.request();
    if (request.nodes_num != phase.nodes_num) {
      app.out.Print(fmt::format("  request: nodes_num {} -> {}\n",
                                request.nodes_num, phase.nodes_num));
      request.nodes_num = phase.nodes_num;
      plan.SetRequest(request);
    }

    absl::StatusOr<std::vector<setpoint::PreviewItem>> preview =
        scheduler.Preview(app.ctx, plan);
    app.out.Print(
        "\npreview of the next round (Scheduler::Preview; nothing changes):\n" +
        (preview.ok() ? setpoint::FormatPreview(*preview)
                      : fmt::format("  preview failed: {}\n",
                                    Message(preview.status()))));

    int executions = 0;
    bool ok = false;
    while (executions < kMaxExecutionsPerPhase && !app.ctx.Done()) {
      ++executions;
      setpoint::ExecutionReport report = scheduler.Execute(app.ctx, plan);
      app.out.Print(fmt::format("\nexecution {} (rounds of Create -> steps "
                                "until Create returns nothing):\n",
                                executions) +
                    FormatReport(report, c.report));
      if (report.status.ok()) {
        ok = true;
        break;
      }
      if (!app.ctx.Done())
        app.out.Print("  not converged yet: running the plan again\n");
    }
    CloudSnapshot snapshot = cloud.Inspect();
    bool converged = ok && CheckConverged(snapshot, request).ok();
    absl::Duration took = absl::Now() - phase_start;
    CloudStats calls_after = cloud.stats();
    app.out.Print(
        "\nobserved state (read directly from the simulated cloud):\n" +
        FormatObservedState(snapshot, request) +
        fmt::format("  {:<10} {} in {}\n\n", "cost",
                    CallsSince(calls_before, calls_after),
                    ShortDuration(took)));
    outcomes.push_back({converged, executions, took, calls_after});
  }

  bool all = outcomes.size() == phases.size();
  std::string summary = Rule("summary");
  for (size_t i = 0; i < outcomes.size(); ++i) {
    all = all && outcomes[i].converged;
    summary += fmt::format(
        "  phase {}  {:<52} {:<13} {} execution{}, {}\n", i + 1,
        phases[i].title, outcomes[i].converged ? "converged" : "NOT converged",
        outcomes[i].executions, outcomes[i].executions == 1 ? "" : "s",
        ShortDuration(outcomes[i].took));
  }
  CloudStats total = cloud.stats();
  std::string verdict;
  if (app.ctx.Done()) {
    verdict = " (interrupted)";
  } else if (all && total.injected_errors > 0) {
    verdict = ", all retried away";
  }
  summary += fmt::format(
      "\ndemo {} in {}: {} cloud API calls, {} injected "
      "503s{}.\n",
      all ? "finished" : "FAILED", ShortDuration(absl::Now() - start),
      total.calls(), total.injected_errors, verdict);
  app.out.Print(summary);
  return all ? kExitOk : kExitNotConverged;
}

int Main(int argc, char** argv) {
  absl::StatusOr<CommandLine> cl = ParseFlags(argc, argv);
  if (!cl.ok()) {
    fmt::print(stderr, "cucumber: {}\n", Message(cl.status()));
    return kExitBadInput;
  }
  if (cl->help) {
    PrintUsage();
    return kExitOk;
  }
  absl::StatusOr<Config> config = MakeConfig(*cl);
  if (!config.ok()) {
    fmt::print(stderr, "cucumber: {}\n", Message(config.status()));
    return kExitBadInput;
  }

  // The application owns the global spdlog settings; the library and the
  // plan only log through the logger they are given.
  auto logger = std::make_shared<spdlog::logger>(
      "cucumber", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  logger->set_pattern("%H:%M:%S.%e %^%l%$ %v");
  logger->set_level(config->log_level);
  spdlog::set_default_logger(logger);

  InterruptWatcher interrupts;  // Before any other thread starts.
  App app{.config = *std::move(config),
          .ctx = setpoint::Context(interrupts.token()),
          .logger = logger};
  switch (app.config.mode) {
    case Mode::kOnce:
      return RunOnce(app);
    case Mode::kReconcile:
      return RunReconcile(app, interrupts);
    case Mode::kDemo:
      return RunDemo(app);
  }
  return kExitBadInput;
}

}  // namespace
}  // namespace cucumber

int main(int argc, char** argv) { return cucumber::Main(argc, argv); }
