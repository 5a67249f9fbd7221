#include "setpoint/controller/pod_sources.h"

#include <algorithm>

#include "setpoint/base/status.h"

namespace setpoint {

PodSources::PodSources(PodSourcesOptions options)
    : options_(std::move(options)) {}

PodSources::~PodSources() {
  std::unique_ptr<SourceExecutor> executor;
  {
    MutexLock l(&mu_);
    executor = std::move(executor_);
  }
  if (executor != nullptr) executor->Stop();
}

absl::StatusOr<SourceExecutor*> PodSources::Executor() {
  MutexLock l(&mu_);
  if (executor_ == nullptr && executor_status_.ok()) {
    executor_ = std::make_unique<SourceExecutor>(
        SourceExecutorOptions{.name = options_.name,
                              .max_threads = options_.max_threads,
                              .clock = options_.clock,
                              .logger = options_.logger});
    executor_status_ = Annotate(executor_->Start(), "pod sources");
  }
  if (!executor_status_.ok()) return executor_status_;
  return executor_.get();
}

std::vector<std::string> PodSources::SharedNames() const {
  MutexLock l(&mu_);
  std::vector<std::string> names;
  for (const auto& [name, entry] : shared_) {
    if (!entry.hold.expired()) names.push_back(name);
  }
  return names;
}

}  // namespace setpoint
