// PodSources: what the nodes of one controller kind in one pod share — the
// shared sources they declare (ControllerBuilder::SharedPoll, SharedWatch:
// one list or watch per pod, whatever the node count) and the executor every
// source of those nodes runs on (a list in progress or an open stream holds
// one of its threads; an idle pod holds one).
//
//   // Nothing to write for a pod: ControllerKind::ToNodeKind makes one per
//   // pod. Two harnesses that play two nodes of one pod share one:
//   auto pod = std::make_shared<setpoint::PodSources>();
//   ControllerHarness a(build, {.clock = &clock, .node = n0,
//                               .pod_sources = pod});
//   ControllerHarness b(build, {.clock = &clock, .node = n1,
//                               .pod_sources = pod});
//
// A shared source is made by the first node that declares it (its list
// function and options are used; later declarations attach to it), starts
// when that node's pieces start, and stops when the last node using it has
// stopped. Declaring one name with other key or value types fails the
// build with kInvalidArgument.
//
// Thread safety: thread-safe. Destroy it after every controller using it.
#ifndef SETPOINT_CONTROLLER_POD_SOURCES_H_
#define SETPOINT_CONTROLLER_POD_SOURCES_H_

#include <map>
#include <memory>
#include <string>
#include <typeindex>
#include <typeinfo>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/mutex.h"
#include "setpoint/processor/shared_source.h"
#include "setpoint/processor/source_executor.h"
#include "spdlog/logger.h"

namespace setpoint {

struct PodSourcesOptions {
  // Names the pod (and kind) in logs.
  // Default: "sources".
  std::string name = "sources";
  // The executor's clock: the controllers' (ControllerOptions::clock).
  // Default: Clock::Real().
  Clock* clock = nullptr;
  // SourceExecutorOptions::max_threads.
  // Default: 256.
  int max_threads = 256;
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

namespace internal {

// One shared source and whether it started; kept alive by the nodes that
// use it, stopped when the last one lets go.
template <class K, class V>
class SharedHold {
 public:
  explicit SharedHold(std::unique_ptr<SharedSource<K, V>> source)
      : source_(std::move(source)) {}
  ~SharedHold() { source_->Stop(); }
  SharedSource<K, V>* source() { return source_.get(); }
  // Starts the source the first time; later calls return that result.
  absl::Status StartOnce() {
    MutexLock l(&mu_);
    if (!started_) {
      started_ = true;
      start_ = source_->Start();
    }
    return start_;
  }

 private:
  const std::unique_ptr<SharedSource<K, V>> source_;
  Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status start_ ABSL_GUARDED_BY(mu_);
};

}  // namespace internal

class PodSources {
 public:
  explicit PodSources(PodSourcesOptions options = {});
  PodSources(const PodSources&) = delete;
  PodSources& operator=(const PodSources&) = delete;
  // Stops the executor.
  ~PodSources();

  // The executor the pod's sources run on, started on first use. Its
  // Start error (kInvalidArgument for bad options) if it could not start.
  absl::StatusOr<SourceExecutor*> Executor();
  // The names of the shared sources in use now, sorted.
  std::vector<std::string> SharedNames() const;

  // For ControllerBuilder: the shared source `name` of these types, made
  // by `make` if no node uses one now. kInvalidArgument when `name` is in
  // use with other types.
  template <class K, class V>
  absl::StatusOr<std::shared_ptr<internal::SharedHold<K, V>>> Acquire(
      const std::string& name,
      absl::FunctionRef<std::unique_ptr<SharedSource<K, V>>()> make);

 private:
  struct Entry {
    std::type_index type;
    std::weak_ptr<void> hold;
  };

  const PodSourcesOptions options_;
  mutable Mutex mu_;
  std::map<std::string, Entry> shared_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<SourceExecutor> executor_ ABSL_GUARDED_BY(mu_);
  absl::Status executor_status_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------

template <class K, class V>
absl::StatusOr<std::shared_ptr<internal::SharedHold<K, V>>> PodSources::Acquire(
    const std::string& name,
    absl::FunctionRef<std::unique_ptr<SharedSource<K, V>>()> make) {
  using Hold = internal::SharedHold<K, V>;
  const std::type_index type(typeid(Hold));
  MutexLock l(&mu_);
  auto it = shared_.find(name);
  if (it != shared_.end()) {
    std::shared_ptr<void> held = it->second.hold.lock();
    if (held != nullptr) {
      if (it->second.type != type) {
        return absl::InvalidArgumentError(absl::StrCat(
            "shared source ", name,
            ": declared with other key or value types by another node of "
            "this kind"));
      }
      return std::static_pointer_cast<Hold>(held);
    }
    shared_.erase(it);
  }
  auto hold = std::make_shared<Hold>(make());
  shared_.emplace(name, Entry{type, hold});
  return hold;
}

}  // namespace setpoint

#endif  // SETPOINT_CONTROLLER_POD_SOURCES_H_
