// Context: cancellation (a std::stop_token) plus an optional deadline, passed
// to every operation that may block or take long, in the manner of Go's
// context.Context.
//
//   std::stop_source stop;
//   Context ctx(stop.get_token());         // cancelled by stop
//   Context step = ctx.WithTimeout(absl::Seconds(5));  // shorter deadline
//   if (step.Done()) return step.Err();    // kCancelled / kDeadlineExceeded
//   step.Wait(absl::Milliseconds(100));    // cancellable sleep
//
// A Context is a cheap value: copy it freely. Children share the parent's stop
// token (and so are cancelled with it) and can only shorten the deadline. To
// cancel a subtree on its own, use CancelScope.
//
// A context can also carry values, one per type, for the code it reaches
// (a controller puts the shard assignment a call runs under there):
//
//   Context call = ctx.WithValue(std::make_shared<const Owner>(owner));
//   if (const Owner* o = call.Value<Owner>()) Send(o->token);
//
// Thread safety: a const Context may be used from many threads at once.
#ifndef SETPOINT_BASE_CONTEXT_H_
#define SETPOINT_BASE_CONTEXT_H_

#include <memory>
#include <optional>
#include <stop_token>
#include <typeinfo>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "setpoint/base/clock.h"

namespace setpoint {

class Context {
 public:
  // A context that is never cancelled and has no deadline, on the real clock.
  Context() = default;
  // A context cancelled when `stop` is requested, timed by `clock`.
  explicit Context(std::stop_token stop, Clock* clock = Clock::Real())
      : stop_(std::move(stop)), clock_(clock) {}

  // Same as Context(): never cancelled, no deadline.
  static Context Background(Clock* clock = Clock::Real()) {
    return Context(std::stop_token(), clock);
  }

  // A child that ends at `deadline` or at this context's deadline, whichever
  // comes first.
  Context WithDeadline(absl::Time deadline) const;
  // A child that ends `timeout` from now (on this context's clock) or earlier.
  Context WithTimeout(absl::Duration timeout) const;

  // True once cancelled or past the deadline.
  bool Done() const {
    return stop_.stop_requested() ||
           (deadline_ != absl::InfiniteFuture() && clock_->Now() >= deadline_);
  }
  // True once the stop token was requested (deadline not considered).
  bool Cancelled() const { return stop_.stop_requested(); }
  // OK while live; kCancelled once cancelled; kDeadlineExceeded once the
  // deadline passed. Cancellation wins when both hold.
  absl::Status Err() const;

  // Blocks until Done() or until `timeout` passes, whichever is first.
  // Returns Err(): OK means the timeout passed with the context still live.
  absl::Status Wait(absl::Duration timeout) const;

  absl::Time deadline() const { return deadline_; }
  const std::stop_token& stop_token() const { return stop_; }
  Clock* clock() const { return clock_; }

  // A child carrying `value` as its value of type T (replacing one
  // inherited from this context). A null `value` removes it.
  template <class T>
  Context WithValue(std::shared_ptr<const T> value) const {
    Context child = *this;
    child.values_ = std::make_shared<const ValueNode>(
        ValueNode{&typeid(T), std::move(value), values_});
    return child;
  }
  // This context's value of type T, or nullptr. Valid while the context
  // (or a copy) lives.
  template <class T>
  const T* Value() const {
    for (const ValueNode* n = values_.get(); n != nullptr; n = n->next.get()) {
      if (*n->type == typeid(T)) return static_cast<const T*>(n->value.get());
    }
    return nullptr;
  }
  // This context (its cancellation and deadline) carrying the values of
  // `other` instead of its own.
  Context WithValuesOf(const Context& other) const {
    Context child = *this;
    child.values_ = other.values_;
    return child;
  }

 private:
  struct ValueNode {
    const std::type_info* type;
    std::shared_ptr<const void> value;
    std::shared_ptr<const ValueNode> next;
  };

  std::stop_token stop_;
  Clock* clock_ = Clock::Real();
  absl::Time deadline_ = absl::InfiniteFuture();
  std::shared_ptr<const ValueNode> values_;
};

// Owns a stop source linked to a parent context: Cancel() cancels
// context() and its children only; cancelling the parent cancels them too.
//
//   CancelScope scope(ctx);
//   worker.Run(scope.context());
//   scope.Cancel();
//
// Thread safety: Cancel() and context() may be called from any thread.
// Not movable: it must outlive every copy of context() that is still used.
class CancelScope {
 public:
  explicit CancelScope(const Context& parent);
  CancelScope(const CancelScope&) = delete;
  CancelScope& operator=(const CancelScope&) = delete;

  const Context& context() const { return context_; }
  void Cancel() { source_.request_stop(); }

 private:
  struct Forward {
    std::stop_source* source;
    void operator()() const { source->request_stop(); }
  };

  std::stop_source source_;
  Context context_;
  std::optional<std::stop_callback<Forward>> link_;
};

}  // namespace setpoint

#endif  // SETPOINT_BASE_CONTEXT_H_
