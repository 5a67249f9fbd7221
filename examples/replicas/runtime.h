// FakeRuntime: an in-memory container runtime for the replicas example. It
// behaves a little like a real one: every call takes some time, and a few
// writes fail with kUnavailable so the Syncer's retries show.
//
//   FakeRuntime runtime({.latency = absl::Milliseconds(20)});
//   absl::Status s = runtime.Create(ctx, "web-0", "nginx:1.25");
//   auto all = runtime.List(ctx);  // name -> Container
//
// Thread safety: every method may be called from any thread.
#ifndef SETPOINT_EXAMPLES_REPLICAS_RUNTIME_H_
#define SETPOINT_EXAMPLES_REPLICAS_RUNTIME_H_

#include <cstdint>
#include <random>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"

namespace replicas {

// What the runtime reports for one container (the observed state).
struct Container {
  std::string image;
  int64_t id = 0;  // Assigned by the runtime; a new container gets a new id.
  bool operator==(const Container&) const = default;
};

struct FakeRuntimeOptions {
  // Every call waits this long (on the caller's context, so it is
  // cancellable).
  absl::Duration latency = absl::Milliseconds(20);
  // Fraction of writes that fail with an injected kUnavailable, in [0, 1].
  double failure_rate = 0.2;
  uint64_t seed = 1;
};

class FakeRuntime {
 public:
  using Containers = absl::flat_hash_map<std::string, Container>;

  explicit FakeRuntime(FakeRuntimeOptions options)
      : options_(options), rng_(options.seed) {}

  absl::StatusOr<Containers> List(const setpoint::Context& ctx) {
    if (absl::Status s = Wait(ctx); !s.ok()) return s;
    setpoint::MutexLock l(&mu_);
    return containers_;
  }

  absl::Status Create(const setpoint::Context& ctx, const std::string& name,
                      const std::string& image) {
    if (absl::Status s = BeforeWrite(ctx); !s.ok()) return s;
    setpoint::MutexLock l(&mu_);
    if (containers_.contains(name)) {
      return absl::AlreadyExistsError("create " + name + ": already exists");
    }
    containers_[name] = Container{.image = image, .id = ++next_id_};
    return absl::OkStatus();
  }

  // Replaces the container with one running `image` (a new id).
  absl::Status Update(const setpoint::Context& ctx, const std::string& name,
                      const std::string& image) {
    if (absl::Status s = BeforeWrite(ctx); !s.ok()) return s;
    setpoint::MutexLock l(&mu_);
    auto it = containers_.find(name);
    if (it == containers_.end()) {
      return absl::NotFoundError("update " + name + ": no such container");
    }
    it->second = Container{.image = image, .id = ++next_id_};
    return absl::OkStatus();
  }

  absl::Status Delete(const setpoint::Context& ctx, const std::string& name) {
    if (absl::Status s = BeforeWrite(ctx); !s.ok()) return s;
    setpoint::MutexLock l(&mu_);
    containers_.erase(name);  // Deleting a missing container is fine.
    return absl::OkStatus();
  }

  // Puts a container in place at once, with no latency or failure: the
  // world as the controller finds it when it starts.
  void Preload(const std::string& name, const std::string& image) {
    setpoint::MutexLock l(&mu_);
    containers_[name] = Container{.image = image, .id = ++next_id_};
  }

  // Exact view for the demo's convergence check: name -> image.
  absl::flat_hash_map<std::string, std::string> Images() {
    setpoint::MutexLock l(&mu_);
    absl::flat_hash_map<std::string, std::string> out;
    for (const auto& [name, c] : containers_) out[name] = c.image;
    return out;
  }

 private:
  absl::Status Wait(const setpoint::Context& ctx) {
    // Context::Wait returns OK when the latency passed, an error when the
    // context ended first (the Syncer stopping cancels it).
    return ctx.Wait(options_.latency);
  }
  // The latency, then maybe an injected failure, before anything changes:
  // a failed write changed nothing, so retrying it is safe.
  absl::Status BeforeWrite(const setpoint::Context& ctx) {
    if (absl::Status s = Wait(ctx); !s.ok()) return s;
    setpoint::MutexLock l(&mu_);
    if (std::bernoulli_distribution(options_.failure_rate)(rng_)) {
      return absl::UnavailableError("runtime busy (injected)");
    }
    return absl::OkStatus();
  }

  const FakeRuntimeOptions options_;
  setpoint::Mutex mu_;
  Containers containers_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
};

}  // namespace replicas

#endif  // SETPOINT_EXAMPLES_REPLICAS_RUNTIME_H_
