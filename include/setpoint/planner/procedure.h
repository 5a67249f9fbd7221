// Procedure: one step of a plan. Do() acts on the world and may return
// follow-up procedures, which the Scheduler runs right after it, before its
// next sibling (depth first, in the order returned).
//
//   class RunInstance : public setpoint::Procedure {
//    public:
//     explicit RunInstance(Cloud* c) : Procedure("run instance"), cloud_(c) {}
//     absl::StatusOr<Procedures> Do(const Context& ctx) override {
//       SETPOINT_RETURN_IF_ERROR(cloud_->Run(ctx));
//       return ProcedureList(MakeProcedure("tag instance", [](const Context&) {
//         return Procedures{};
//       }));
//     }
//    private:
//     Cloud* cloud_;
//   };
//
// Thread safety: the Scheduler calls Do() on one thread at a time per
// procedure; with parallelism > 1 different procedures run concurrently, so
// state they share must be synchronized by the user.
#ifndef SETPOINT_PLANNER_PROCEDURE_H_
#define SETPOINT_PLANNER_PROCEDURE_H_

#include <cstddef>
#include <functional>
#include <iterator>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "setpoint/base/context.h"
#include "setpoint/base/retry.h"

namespace setpoint {

class Procedure;

namespace planner_internal {

// Memory for procedures and for the lists that hold them. While a Scheduler
// execution runs on the calling thread (Plan::Create, Procedure::Do and
// whatever they call there), it comes from that execution's arena: a bump
// allocator over 64 KiB chunks that reuses what the same thread frees during
// the execution. Otherwise, and for blocks over 1 KiB, it comes from the heap.
// A block may be freed on any thread at any time, also after its execution
// ended: each arena chunk counts its live blocks and goes back to the heap
// when the last one is freed after the execution. Thread-safe.
void* AllocateProcedureMemory(std::size_t size);
void FreeProcedureMemory(void* p, std::size_t size) noexcept;
// For types aligned beyond 16 bytes: always the heap.
void* AllocateAlignedProcedureMemory(std::size_t size, std::align_val_t align);
void FreeAlignedProcedureMemory(void* p, std::align_val_t align) noexcept;

// The allocator of Procedures: AllocateProcedureMemory for the pointer array.
// Stateless, so lists move and swap freely between executions and threads.
template <typename T>
struct ProcedureAllocator {
  using value_type = T;
  using is_always_equal = std::true_type;
  using propagate_on_container_move_assignment = std::true_type;

  ProcedureAllocator() = default;
  template <typename U>
  ProcedureAllocator(const ProcedureAllocator<U>&) noexcept {}  // NOLINT

  T* allocate(std::size_t n) {
    if (n > static_cast<std::size_t>(-1) / sizeof(T)) throw std::bad_alloc();
    if constexpr (alignof(T) > 16) {
      return static_cast<T*>(AllocateAlignedProcedureMemory(
          n * sizeof(T), std::align_val_t(alignof(T))));
    } else {
      return static_cast<T*>(AllocateProcedureMemory(n * sizeof(T)));
    }
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if constexpr (alignof(T) > 16) {
      FreeAlignedProcedureMemory(p, std::align_val_t(alignof(T)));
    } else {
      FreeProcedureMemory(p, n * sizeof(T));
    }
  }

  template <typename U>
  friend bool operator==(const ProcedureAllocator&,
                         const ProcedureAllocator<U>&) noexcept {
    return true;
  }
};

}  // namespace planner_internal

// What Plan::Create and Procedure::Do return: the steps to run next, in order.
// A std::vector of std::unique_ptr<Procedure> (with the allocator above, so a
// list made during an execution costs no heap allocation); build it with
// push_back, ProcedureList or `Procedures{}`. Null entries are refused with
// kInvalidArgument.
using Procedures = std::vector<
    std::unique_ptr<Procedure>,
    planner_internal::ProcedureAllocator<std::unique_ptr<Procedure>>>;

// A procedure's memory comes from the running execution's arena when it is
// made inside Plan::Create or Procedure::Do, and from the heap otherwise (see
// planner_internal above); either way `new`, std::make_unique and delete work
// as for any class, on any thread, for as long as the caller keeps it.
class Procedure {
 public:
  // Its match is the sized operator delete below (the arena needs the
  // size), which clang-tidy's check does not count.
  // NOLINTNEXTLINE(misc-new-delete-overloads)
  static void* operator new(std::size_t size) {
    return planner_internal::AllocateProcedureMemory(size);
  }
  static void* operator new(std::size_t size, std::align_val_t align) {
    return planner_internal::AllocateAlignedProcedureMemory(size, align);
  }
  static void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
    try {
      return planner_internal::AllocateProcedureMemory(size);
    } catch (...) {
      return nullptr;
    }
  }
  static void* operator new(std::size_t size, std::align_val_t align,
                            const std::nothrow_t&) noexcept {
    try {
      return planner_internal::AllocateAlignedProcedureMemory(size, align);
    } catch (...) {
      return nullptr;
    }
  }
  // Placement new, so `new (buffer) MyProcedure(...)` still compiles.
  static void* operator new(std::size_t, void* where) noexcept { return where; }
  static void operator delete(void* p, std::size_t size) noexcept {
    planner_internal::FreeProcedureMemory(p, size);
  }
  static void operator delete(void* p, std::size_t,
                              std::align_val_t align) noexcept {
    planner_internal::FreeAlignedProcedureMemory(p, align);
  }
  // Called only when a constructor run by the nothrow forms throws.
  static void operator delete(void* p, const std::nothrow_t&) noexcept {
    planner_internal::FreeProcedureMemory(p, 0);
  }
  static void operator delete(void* p, std::align_val_t align,
                              const std::nothrow_t&) noexcept {
    planner_internal::FreeAlignedProcedureMemory(p, align);
  }
  static void operator delete(void*, void*) noexcept {}

  // `name` says what the step does ("run instance i-42"); it appears in
  // reports, logs and errors. An empty name is refused by the Scheduler.
  explicit Procedure(std::string name) : name_(std::move(name)) {}
  virtual ~Procedure() = default;
  Procedure(const Procedure&) = delete;
  Procedure& operator=(const Procedure&) = delete;

  const std::string& Name() const { return name_; }

  // A human-readable account of what Do() would change, for Preview().
  // Default: empty.
  virtual std::string Description() const { return {}; }

  // Performs the step. Returns the follow-up procedures (possibly none), or an
  // error. Exceptions are caught by the Scheduler and become kInternal
  // failures carrying the exception's text. Must honour `ctx` when it blocks.
  virtual absl::StatusOr<Procedures> Do(const Context& ctx) = 0;

  // The retry policy for this step; null means the Scheduler's default. A
  // step that threw is never retried (an exception is a bug, not a transient
  // fault), nor one whose context is done.
  const RetryPolicy* retry_policy() const { return retry_.get(); }
  // Sets this step's retry policy. Returns *this for chaining.
  Procedure& set_retry_policy(RetryPolicy policy) {
    retry_ = std::make_unique<const RetryPolicy>(std::move(policy));
    return *this;
  }

 private:
  std::string name_;
  // Null for most procedures; a unique_ptr keeps every procedure small (the
  // Scheduler's throughput is bound by how much procedure memory it touches).
  std::unique_ptr<const RetryPolicy> retry_;
};

// A Procedure from a callable `absl::StatusOr<Procedures>(const Context&)`.
template <typename Fn>
class ProcedureFunc final : public Procedure {
 public:
  ProcedureFunc(std::string name, Fn fn, std::string description = {})
      : Procedure(std::move(name)),
        fn_(std::move(fn)),
        description_(std::move(description)) {}

  std::string Description() const override { return description_; }
  absl::StatusOr<Procedures> Do(const Context& ctx) override {
    return fn_(ctx);
  }

 private:
  Fn fn_;
  std::string description_;
};

// clang-format off
// Makes a procedure from a lambda:
//   MakeProcedure("delete record",
//                 [&](const Context& ctx) -> absl::StatusOr<Procedures> {
//                   SETPOINT_RETURN_IF_ERROR(dns.Delete(ctx, name));
//                   return Procedures{};
//                 });
// clang-format on
template <typename Fn>
std::unique_ptr<Procedure> MakeProcedure(std::string name, Fn&& fn,
                                         std::string description = {}) {
  static_assert(std::is_invocable_r_v<absl::StatusOr<Procedures>,
                                      std::decay_t<Fn>&, const Context&>,
                "a procedure body must be callable as "
                "absl::StatusOr<Procedures>(const Context&)");
  return std::make_unique<ProcedureFunc<std::decay_t<Fn>>>(
      std::move(name), std::forward<Fn>(fn), std::move(description));
}

// Builds a Procedures list from move-only pointers (a braced list cannot):
//   return ProcedureList(std::make_unique<A>(), std::make_unique<B>());
template <typename... P>
Procedures ProcedureList(std::unique_ptr<P>... procedures) {
  if constexpr (sizeof...(P) == 0) {
    return Procedures();
  } else {
    std::unique_ptr<Procedure> items[] = {std::move(procedures)...};
    return Procedures(std::make_move_iterator(std::begin(items)),
                      std::make_move_iterator(std::end(items)));
  }
}

}  // namespace setpoint

#endif  // SETPOINT_PLANNER_PROCEDURE_H_
