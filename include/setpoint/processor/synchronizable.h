// Synchronizable: the in-sync / lost-sync state every processor module has
// (source, store, transformer, syncer), and its propagation downstream.
//
//   Store<std::string, Vm> observed({.name = "vms"});  // a Synchronizable
//   Syncer<std::string, Spec, Vm> syncer(...);
//   syncer.ObserveFrom(&observed);                     // depends on observed
//   syncer.AddSyncObserver([](bool in_sync) { ... });
//
// A module is in sync when its own condition holds (a source listed once, a
// transformer delivered its first snapshot) *and* every input is in sync.
// When that changes, OnSynced() / OnLostSync() run on the module, then the
// observers, then the same evaluation runs on every module downstream, in the
// order they were connected, inside the same runner event. A Syncer therefore
// never acts on an observed view that a source has declared incomplete.
//
// A hook, observer or downstream module may change this module's condition
// while its transition is being announced; the new state is worked out once
// that announcement is complete, so everyone hears the transitions in order.
//
// docs/processor.md draws the state machine.
//
// Thread safety: runner thread only (or before the runner starts). Modules
// must outlive the modules that depend on them, or be destroyed first: a
// destroyed module unlinks itself from both sides.
#ifndef SETPOINT_PROCESSOR_SYNCHRONIZABLE_H_
#define SETPOINT_PROCESSOR_SYNCHRONIZABLE_H_

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "setpoint/base/check.h"

namespace setpoint {

class Synchronizable {
 public:
  explicit Synchronizable(std::string name) : name_(std::move(name)) {}
  virtual ~Synchronizable();
  Synchronizable(const Synchronizable&) = delete;
  Synchronizable& operator=(const Synchronizable&) = delete;

  // True when this module's own condition holds and all inputs are in sync.
  bool InSync() const { return in_sync_; }
  // This module's own condition alone, ignoring the inputs.
  bool SelfSynced() const { return self_synced_; }
  const std::string& name() const { return name_; }

  // Makes this module in sync only while `input` is too. Re-evaluates at
  // once (and propagates a change). Adding the same input twice is a no-op.
  // A cycle is a bug and aborts.
  void DependOn(Synchronizable* input);
  // Removes `input` from the inputs and re-evaluates.
  void StopDependingOn(Synchronizable* input);

  // Calls `observer(in_sync)` after every transition of this module. Not from
  // inside an observer of the same module.
  void AddSyncObserver(absl::AnyInvocable<void(bool in_sync)> observer) {
    observers_.push_back(std::move(observer));
  }

 protected:
  // Sets this module's own condition and propagates the result.
  void SetSelfSynced(bool synced) {
    self_synced_ = synced;
    Evaluate();
  }
  // Hooks for subclasses, run on transitions before observers and before
  // downstream modules are evaluated.
  virtual void OnSynced() {}
  virtual void OnLostSync() {}
  // Runs when the inputs' combined state changes (all in sync or not),
  // before this module's own state is worked out, so a module may change
  // its own condition here (a transformer re-snapshots after its inputs
  // come back).
  virtual void OnInputsSyncChanged(bool /*inputs_in_sync*/) {}
  bool InputsInSync() const { return inputs_in_sync_; }

 private:
  void Evaluate();
  bool Reaches(const Synchronizable* target) const;

  const std::string name_;
  bool self_synced_ = false;
  bool in_sync_ = false;
  bool inputs_in_sync_ = true;  // No inputs: vacuously in sync.
  // A transition is being announced (hooks, observers, downstream): an
  // Evaluate() arriving meanwhile only sets `reevaluate_`, so that a state
  // change made from inside the announcement is heard after it, not before
  // the observers that have yet to hear the first one.
  bool announcing_ = false;
  bool reevaluate_ = false;
  std::vector<Synchronizable*> inputs_;
  std::vector<Synchronizable*> outputs_;
  std::vector<absl::AnyInvocable<void(bool)>> observers_;
};

// ---------------------------------------------------------------------------

inline Synchronizable::~Synchronizable() {
  for (Synchronizable* in : inputs_) {
    auto& outs = in->outputs_;
    outs.erase(std::remove(outs.begin(), outs.end(), this), outs.end());
  }
  for (Synchronizable* out : outputs_) {
    auto& ins = out->inputs_;
    ins.erase(std::remove(ins.begin(), ins.end(), this), ins.end());
    // No re-evaluation here: shutdown must not wake a syncer up.
  }
}

inline bool Synchronizable::Reaches(const Synchronizable* target) const {
  if (this == target) return true;
  for (const Synchronizable* out : outputs_) {
    if (out->Reaches(target)) return true;
  }
  return false;
}

inline void Synchronizable::DependOn(Synchronizable* input) {
  SETPOINT_CHECK(input != nullptr);
  if (std::find(inputs_.begin(), inputs_.end(), input) != inputs_.end()) {
    return;
  }
  SETPOINT_CHECK_MSG(!Reaches(input), "sync dependency cycle: {} -> {}", name_,
                     input->name_);
  inputs_.push_back(input);
  input->outputs_.push_back(this);
  Evaluate();
}

inline void Synchronizable::StopDependingOn(Synchronizable* input) {
  auto it = std::find(inputs_.begin(), inputs_.end(), input);
  if (it == inputs_.end()) return;
  inputs_.erase(it);
  auto& outs = input->outputs_;
  outs.erase(std::remove(outs.begin(), outs.end(), this), outs.end());
  Evaluate();
}

inline void Synchronizable::Evaluate() {
  if (announcing_) {
    reevaluate_ = true;
    return;
  }
  bool inputs = true;
  for (const Synchronizable* in : inputs_) inputs = inputs && in->in_sync_;
  if (inputs != inputs_in_sync_) {
    inputs_in_sync_ = inputs;
    // May call SetSelfSynced, which evaluates (and announces) at once.
    OnInputsSyncChanged(inputs);
  }
  bool now = self_synced_ && inputs_in_sync_;
  if (now == in_sync_) return;
  in_sync_ = now;
  {
    // Cleared on the way out even if a hook throws (the runner catches it),
    // so that the module is not left deaf to later changes.
    struct Announcing {
      bool& flag;
      ~Announcing() { flag = false; }
    } announcing{announcing_};
    announcing_ = true;
    if (now) {
      OnSynced();
    } else {
      OnLostSync();
    }
    for (auto& observer : observers_) observer(now);
    // Copy: a hook may connect or disconnect modules.
    std::vector<Synchronizable*> outs = outputs_;
    for (Synchronizable* out : outs) out->Evaluate();
  }
  if (reevaluate_) {
    reevaluate_ = false;
    Evaluate();
  }
}

}  // namespace setpoint

#endif  // SETPOINT_PROCESSOR_SYNCHRONIZABLE_H_
