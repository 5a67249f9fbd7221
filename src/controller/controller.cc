#include "setpoint/controller/controller.h"

#include <algorithm>
#include <exception>
#include <map>

#include "absl/strings/str_cat.h"
#include "setpoint/base/callback.h"
#include "setpoint/base/format.h"
#include "setpoint/base/status.h"
#include "spdlog/spdlog.h"

namespace setpoint {

ReconcileLoop* ControllerBuilder::Reconcile(std::unique_ptr<Plan> plan,
                                            ReconcileLoopOptions options) {
  auto piece = std::make_unique<internal::PlanPiece>(run_, std::move(plan),
                                                     std::move(options));
  ReconcileLoop* loop = piece->loop();
  run_->pieces.push_back(std::move(piece));
  return loop;
}

namespace {

ControllerOptions Defaults(const NodeInfo& info, ControllerOptions o) {
  if (o.clock == nullptr) o.clock = Clock::Real();
  if (o.metrics == nullptr) o.metrics = info.metrics;
  if (o.updaters == nullptr) o.updaters = info.updaters;
  if (o.loops == nullptr) o.loops = info.loops;
  if (o.runners == nullptr) o.runners = info.runners;
  if (o.logger == nullptr) o.logger = spdlog::default_logger();
  if (o.logger == nullptr)
    o.logger = std::make_shared<spdlog::logger>("setpoint");
  // Every line names the node: the logger is the node's clone.
  o.logger = o.logger->clone(info.id);
  if (o.pod_sources == nullptr) {
    o.pod_sources = std::make_shared<PodSources>(PodSourcesOptions{
        .name = info.id, .clock = o.clock, .logger = o.logger});
  }
  return o;
}

// The PodSources of one kind, one per pod, for the nodes a kind's factory
// makes (a program may run several pods: the demo does).
class PodSourcesByPod {
 public:
  PodSourcesByPod(std::string kind, ControllerOptions options)
      : kind_(std::move(kind)), options_(std::move(options)) {}
  std::shared_ptr<PodSources> For(const std::string& pod) {
    MutexLock l(&mu_);
    std::shared_ptr<PodSources> sources = pods_[pod].lock();
    if (sources == nullptr) {
      sources = std::make_shared<PodSources>(
          PodSourcesOptions{.name = absl::StrCat(pod, "/", kind_),
                            .clock = options_.clock,
                            .logger = options_.logger});
      pods_[pod] = sources;
    }
    return sources;
  }

 private:
  const std::string kind_;
  const ControllerOptions options_;
  Mutex mu_;
  std::map<std::string, std::weak_ptr<PodSources>> pods_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

Controller::Controller(NodeInfo info, ControllerBuildFn build,
                       ControllerOptions options)
    : info_(std::move(info)),
      build_(std::move(build)),
      options_(Defaults(info_, std::move(options))),
      assignment_(MakeAssignment(Assignment{})) {}

Controller::~Controller() {
  Stop();
  Halt();
}

std::shared_ptr<const Assignment> Controller::MakeAssignment(
    const Assignment& a) const {
  return std::make_shared<const Assignment>(Assignment{
      .range = a.range,
      .token = a.token,
      .node_id = info_.id,
      .kind = info_.kind,
      .ring_size = info_.ring_size,
  });
}

Assignment Controller::assignment() const {
  MutexLock l(&mu_);
  return *assignment_;
}

ControllerStats Controller::stats() const {
  MutexLock l(&mu_);
  return stats_;
}

absl::StatusOr<std::unique_ptr<internal::ControllerRun>> Controller::Build() {
  auto run =
      std::make_unique<internal::ControllerRun>(info_, options_, &board_);
  ControllerBuilder builder(run.get());
  absl::Status built;
  if (!options_.manual) {
    absl::StatusOr<SourceExecutor*> executor = run->pod->Executor();
    if (executor.ok()) {
      run->executor = *executor;
    } else {
      built = executor.status();
    }
  }
  if (!built.ok()) {
    // No executor for the sources: nothing is declared.
  } else if (!build_) {
    built = absl::InvalidArgumentError("no build function");
  } else {
    built = CallUserCode("build", [&] { return build_(builder); });
    if (built.ok() && !run->errors.empty()) built = run->errors.front();
  }
  if (!built.ok()) {
    StopRun(*run);  // Destroys what was declared, in reverse.
    return Annotate(built, absl::StrCat("build controller ", info_.id));
  }
  return run;
}

absl::Status Controller::StartRun(internal::ControllerRun& run) {
  std::shared_ptr<const Assignment> a;
  {
    MutexLock l(&mu_);
    a = assignment_;
  }
  // Scope every piece before anything runs (the runner has not started,
  // so this thread may touch runner state).
  run.SetCurrent(a);
  const Context values = Context().WithValue(a);
  for (auto& piece : run.pieces) piece->Rescope(*a, values);
  for (auto& hook : run.on_assignment) hook(*a);
  if (!options_.manual) SETPOINT_RETURN_IF_ERROR(run.runner.Start());
  size_t started = 0;
  absl::Status s;
  for (; started < run.pieces.size(); ++started) {
    s = run.pieces[started]->Start();
    if (!s.ok()) break;
  }
  if (!s.ok()) {
    for (size_t i = started; i-- > 0;) run.pieces[i]->Stop();
    run.runner.Stop();
    return Annotate(s, absl::StrCat("start controller ", info_.id));
  }
  for (auto& piece : run.pieces) piece->Resume(*a);
  {
    MutexLock l(&board_.mu);
    board_.running = true;
    board_.beat = options_.clock->Now();
  }
  if (options_.manual) {
    run.Beat();
  } else {
    internal::ControllerRun* r = &run;
    (void)run.runner.Post([r] { r->Beat(); }, "controller status");
  }
  return absl::OkStatus();
}

void Controller::Report(absl::Duration stuck_after, NodeReport& report) const {
  const Assignment a = assignment();
  const ControllerStats st = stats();
  MutexLock l(&board_.mu);
  if (!board_.running) {
    report.not_ready.push_back(
        "not running (starting, or restarting after "
        "a failed build)");
  } else {
    report.not_ready = board_.not_ready;
    const absl::Duration age = options_.clock->Now() - board_.beat;
    if (!options_.manual &&
        age > stuck_after +
                  std::max(options_.status_interval, absl::ZeroDuration())) {
      report.stuck.push_back(absl::StrCat(
          "runner has not run its status event for ", absl::FormatDuration(age),
          " (an event that does not return?)"));
    }
  }
  std::string& j = report.status_json;
  absl::StrAppend(&j, "{\"assignment\":{\"range\":[", a.range.Hull().begin, ",",
                  a.range.Hull().end, "],\"shards\":", a.range.RunsJson(),
                  ",\"token\":", a.token,
                  "},\"running\":", board_.running ? "true" : "false",
                  ",\"runs\":", st.runs,
                  ",\"build_failures\":", st.build_failures,
                  ",\"handoffs\":", st.handoffs,
                  ",\"handoff_failures\":", st.handoff_failures,
                  ",\"pieces\":", board_.pieces_json, "}");
}

void Controller::StopRun(internal::ControllerRun& run) {
  {
    MutexLock l(&run.board->mu);
    run.board->running = false;
  }
  run.StopBeats();
  for (size_t i = run.pieces.size(); i-- > 0;) run.pieces[i]->Stop();
  // Manual mode: what the pieces posted while stopping (a syncer's final
  // account) runs here, as the runner's thread would run it.
  if (run.options.manual) run.runner.RunUntilIdle();
  run.runner.Stop();
  // Destroyed in reverse too, after the runner: events they posted find
  // them gone.
  while (!run.pieces.empty()) run.pieces.pop_back();
  run.on_assignment.clear();
  while (!run.owned.empty()) run.owned.pop_back();
}

absl::Status Controller::Run(const Context& ctx) {
  if (options_.manual) {
    return absl::FailedPreconditionError(absl::StrCat(
        "controller ", info_.id, ": manual mode, use Start/RunUntilIdle"));
  }
  {
    MutexLock l(&update_mu_);
    SETPOINT_RETURN_IF_ERROR(BuildAndStart());
  }
  (void)ctx.Wait(absl::InfiniteDuration());
  MutexLock l(&update_mu_);
  StopRun(*run_);
  run_.reset();
  return absl::OkStatus();
}

absl::Status Controller::Launch(const Context& ctx) {
  (void)ctx;
  if (options_.manual) {
    return absl::FailedPreconditionError(absl::StrCat(
        "controller ", info_.id, ": manual mode, use Start/RunUntilIdle"));
  }
  MutexLock l(&update_mu_);
  if (run_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("controller ", info_.id, ": already launched"));
  }
  return BuildAndStart();
}

void Controller::Halt() {
  MutexLock l(&update_mu_);
  if (run_ == nullptr || options_.manual) return;
  StopRun(*run_);
  run_.reset();
}

absl::Status Controller::UpdateShardRange(const Context& ctx,
                                          const Assignment& assignment) {
  MutexLock l(&update_mu_);
  std::shared_ptr<const Assignment> a = MakeAssignment(assignment);
  {
    MutexLock m(&mu_);
    assignment_ = a;
  }
  if (run_ == nullptr)
    return absl::OkStatus();  // Not running: nothing to stop.
  internal::ControllerRun& run = *run_;
  const Context bound = ctx.WithTimeout(options_.handoff_timeout);
  absl::Status result;
  auto keep = [&result](absl::Status s) {
    if (result.ok() && !s.ok()) result = std::move(s);
  };
  // 1. At once, waiting for nothing: plans pause (their execution is
  //    cancelled), calls for keys outside the range are cancelled and no
  //    new one starts, whatever the runner is busy with.
  for (auto& piece : run.pieces) piece->Fence(*a);
  // 2. One runner event re-scopes every piece, on a budget of its own: not
  //    cut short by a slow plan, nor by a lease that already ended (a
  //    fence after the pod lost Redis must still empty the stores).
  run.SetCurrent(a);
  const Context values = Context().WithValue(a);
  keep(run.runner.PostAndWait(
      Context(ctx.stop_token(), ctx.clock())
          .WithTimeout(options_.handoff_timeout),
      [&] {
        for (auto& piece : run.pieces) piece->Rescope(*a, values);
        for (auto& hook : run.on_assignment) hook(*a);
      },
      "controller re-scope"));
  // 3. Wait until none of those calls and no paused execution still runs.
  for (auto& piece : run.pieces) keep(piece->AwaitOutside(*a, bound));
  if (result.ok()) {
    for (auto& piece : run.pieces) piece->Resume(*a);
  }
  MutexLock m(&mu_);
  if (result.ok()) {
    ++stats_.handoffs;
    return absl::OkStatus();
  }
  ++stats_.handoff_failures;
  SPDLOG_LOGGER_WARN(options_.logger,
                     "controller handoff incomplete node={} range={} "
                     "token={}: {}",
                     info_.id, a->range, a->token, result);
  return Annotate(result, absl::StrCat("controller ", info_.id, " handoff to ",
                                       a->range.ToString()));
}

absl::Status Controller::Start() {
  if (!options_.manual) {
    return absl::FailedPreconditionError(absl::StrCat(
        "controller ", info_.id, ": Start is for manual mode; use Run"));
  }
  MutexLock l(&update_mu_);
  if (run_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("controller ", info_.id, ": already started"));
  }
  return BuildAndStart();
}

absl::Status Controller::BuildAndStart() {
  absl::StatusOr<std::unique_ptr<internal::ControllerRun>> run = Build();
  absl::Status s = run.status();
  if (s.ok()) s = StartRun(**run);
  {
    MutexLock m(&mu_);
    ++stats_.runs;
    if (!s.ok()) ++stats_.build_failures;
  }
  if (!s.ok()) {
    if (run.ok()) StopRun(**run);
    return s;
  }
  run_ = std::move(*run);
  return absl::OkStatus();
}

int64_t Controller::RunUntilIdle() {
  MutexLock l(&update_mu_);
  if (run_ == nullptr || !options_.manual) return 0;
  const Context ctx = Context::Background(options_.clock);
  int64_t total = 0;
  while (true) {
    int64_t ran = run_->runner.RunUntilIdle();
    for (auto& piece : run_->pieces) ran += piece->RunUntilIdle(ctx);
    if (ran == 0) {
      run_->Beat();  // Manual mode: the status is published when quiet.
      return total;
    }
    total += ran;
  }
}

absl::Time Controller::NextWakeTime() const {
  MutexLock l(&update_mu_);
  if (run_ == nullptr) return absl::InfiniteFuture();
  absl::Time next = run_->runner.NextWakeTime();
  for (const auto& piece : run_->pieces)
    next = std::min(next, piece->NextWakeTime());
  return next;
}

void Controller::Stop() {
  MutexLock l(&update_mu_);
  if (run_ == nullptr || !options_.manual) return;
  StopRun(*run_);
  run_.reset();
}

Runner* Controller::runner() {
  MutexLock l(&update_mu_);
  return run_ != nullptr ? &run_->runner : nullptr;
}

NodeKindOptions ControllerKind::ToNodeKind() const {
  auto pods = std::make_shared<PodSourcesByPod>(kind, options);
  return NodeKindOptions{
      .kind = kind,
      .count = count,
      .ring_size = ring_size,
      .factory =
          [build = build, options = options, pods](const NodeInfo& info) {
            ControllerOptions o = options;
            if (o.pod_sources == nullptr) {
              o.pod_sources = pods->For(internal::PodOf(info.id));
            }
            return std::make_unique<Controller>(info, build, std::move(o));
          },
  };
}

ControllerKind LeaderKind(std::string kind, ControllerBuildFn build,
                          ControllerOptions options) {
  return ControllerKind{.kind = std::move(kind),
                        .count = 1,
                        .ring_size = 1,
                        .build = std::move(build),
                        .options = std::move(options)};
}

}  // namespace setpoint
