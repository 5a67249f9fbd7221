// The C++ snippets of docs/processor.md, compiled by doc_snippets_test,
// which also checks that the doc shows them as they are here. Between
// "clang-format off" and "on" the text is the doc's, layout included; edit
// both together. The types come from the examples/replicas controller.

#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "replicas/runtime.h"
#include "setpoint/base/context.h"
#include "setpoint/base/status.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/source.h"
#include "setpoint/processor/store.h"
#include "setpoint/processor/syncer.h"
#include "setpoint/processor/transformer.h"

namespace processor_snippets {

using replicas::Container;

struct ContainerSpec {
  std::string image;
  bool operator==(const ContainerSpec&) const = default;
};
using DesiredContainers = absl::flat_hash_map<std::string, ContainerSpec>;
struct ReplicaSet {
  std::string image;
  int replicas = 0;
  bool operator==(const ReplicaSet&) const = default;
};
DesiredContainers Expand(
    const absl::flat_hash_map<std::string, ReplicaSet>& sets) {
  DesiredContainers want;
  for (const auto& [name, set] : sets) {
    for (int i = 0; i < set.replicas; ++i) {
      want[name + "-" + std::to_string(i)] = ContainerSpec{set.image};
    }
  }
  return want;
}

void Resync() {}

// ## The Runner
absl::Status RunnerSnippet(setpoint::Store<std::string, Container>& store,
                           const Container& c) {
  // clang-format off
setpoint::Runner runner({.name = "replicas"});
SETPOINT_RETURN_IF_ERROR(runner.Start());  // thread "sp-runner"
// From any thread; kFailedPrecondition once the runner stopped:
SETPOINT_RETURN_IF_ERROR(runner.Post([&] { store.Set("web-0", c); }, "apply"));
auto timer = runner.PostAfter(absl::Seconds(5), [&] { Resync(); });
if (timer.ok()) timer->Cancel();
runner.Stop();
  // clang-format on
  return absl::OkStatus();
}

// ## Stores
void Log(const std::string&, const Container&) {}

void StoreSnippet() {
  // clang-format off
setpoint::Store<std::string, Container> containers({.name = "containers"});
containers.Subscribe([](const setpoint::Change<std::string, Container>& c) {
  // c.kind is kSet, kDelete or kForget; c.old_value / c.new_value point to
  // the values (nullptr when there is none) and are valid during the call.
  if (c.kind == setpoint::ChangeKind::kSet) Log(c.key, *c.new_value);
});
  // clang-format on
}

// ## Sources
absl::Status PollingSourceSnippet(
    setpoint::Runner& runner,
    setpoint::Store<std::string, Container>& containers,
    replicas::FakeRuntime& runtime) {
  // clang-format off
setpoint::PollingSource<std::string, Container> poller(
    &runner, &containers,
    [&runtime](const setpoint::Context& ctx) { return runtime.List(ctx); },
    {.name = "runtime", .interval = absl::Milliseconds(100)});
SETPOINT_RETURN_IF_ERROR(poller.Start());  // thread "sp-source"; lists at once
  // clang-format on
  return absl::OkStatus();
}

// ## Key filters: re-scoping to a shard range
absl::Status RangeChangeSnippet(
    const setpoint::Context& ctx, const setpoint::Context& values,
    setpoint::Runner& runner,
    setpoint::Syncer<std::string, ContainerSpec, Container>& syncer,
    setpoint::PollingSource<std::string, Container>& poller,
    const setpoint::KeyFilter<std::string>& filter) {
  // clang-format off
SETPOINT_RETURN_IF_ERROR(runner.PostAndWait(ctx, [&] {
  syncer.Rescope(filter);          // forgets keys outside, cancels their calls
  syncer.SetCallValues(values);  // calls from now on carry the new assignment
  poller.Rescope(filter);      // the store forgets them too, and re-lists
}, "shard range change"));
// Off the runner: wait until no call for a key that left still runs.
SETPOINT_RETURN_IF_ERROR(syncer.AwaitCallsWithin(filter, ctx));
  // clang-format on
  return absl::OkStatus();
}

// ## Transformers
void SnapshotSnippet(
    setpoint::Runner& runner,
    setpoint::Syncer<std::string, ContainerSpec, Container>& syncer,
    setpoint::Store<std::string, ReplicaSet>& sets_store) {
  // clang-format off
setpoint::Transformer<std::string, ContainerSpec> expand(
    &runner, &syncer, [&] { return Expand(sets_store.items()); },
    {.name = "expand", .accumulation_window = absl::Milliseconds(50)});
expand.Watch(&sets_store);
  // clang-format on
}

struct Name {
  std::string address;
};
struct Record {
  std::string address;
  bool operator==(const Record&) const = default;
};
Record ToRecord(const Name& name) { return Record{name.address}; }

void HookSnippet(setpoint::Transformer<std::string, Record>& t,
                 setpoint::Store<std::string, Name>& names) {
  // clang-format off
t.Watch(&names, [](const setpoint::Change<std::string, Name>& c) {
  setpoint::DesiredDiff<std::string, Record> diff;
  if (c.kind == setpoint::ChangeKind::kSet) {
    diff.set.emplace_back(c.key, ToRecord(*c.new_value));
  } else {
    diff.remove.push_back(c.key);  // kDelete or kForget
  }
  return diff;
});
  // clang-format on
}

}  // namespace processor_snippets
