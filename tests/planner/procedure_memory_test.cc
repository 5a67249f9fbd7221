// Where procedures' memory comes from (planner/procedure_arena.h): the
// execution's arena inside Create and Do, the heap elsewhere, and freeing
// stays safe wherever and whenever the last owner lets go. Under ASan a block
// freed too early or twice, a chunk reused while a block in it lives, or a
// chunk never freed (LeakSanitizer) fails these tests; under TSan so does a
// racy free from another thread.
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "planner/procedure_arena.h"
#include "setpoint/base/mutex.h"
#include "setpoint/planner/plan.h"
#include "setpoint/planner/procedure.h"
#include "setpoint/planner/scheduler.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/status_matchers.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SETPOINT_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define SETPOINT_TEST_ASAN 1
#endif

namespace setpoint {
namespace {

using ::setpoint::testing::IsOk;
using ::setpoint::testing::StatusIs;

std::atomic<int64_t> g_live{0};

// A procedure that counts its instances and carries a payload it checks when
// it runs, so memory handed to someone else while it lives shows.
class Counted : public Procedure {
 public:
  explicit Counted(uint64_t payload, int children = 0)
      : Procedure("counted"), payload_(payload), children_(children) {
    std::memset(pattern_, static_cast<int>(payload & 0xff), sizeof(pattern_));
    ++g_live;
  }
  ~Counted() override { --g_live; }

  bool Intact() const {
    for (unsigned char c : pattern_) {
      if (c != static_cast<unsigned char>(payload_ & 0xff)) return false;
    }
    return true;
  }
  uint64_t payload() const { return payload_; }

  absl::StatusOr<Procedures> Do(const Context&) override {
    if (!Intact()) return absl::InternalError("payload overwritten");
    Procedures out;
    for (int i = 0; i < children_; ++i) {
      out.push_back(std::make_unique<Counted>(payload_ * 31 + i + 1));
    }
    return out;
  }

 private:
  const uint64_t payload_;
  const int children_;
  unsigned char pattern_[40];
};

SchedulerOptions Quiet(SchedulerOptions o = {}) {
  o.logger = ::setpoint::testing::NullLogger();
  return o;
}

// A plan that returns `make()` once, then nothing.
template <typename Fn>
class Once : public Plan {
 public:
  explicit Once(Fn make) : make_(std::move(make)) {}
  std::string Name() const override { return "once"; }
  absl::StatusOr<Procedures> Create(const Context&) override {
    if (done_) return Procedures{};
    done_ = true;
    return make_();
  }

 private:
  Fn make_;
  bool done_ = false;
};

class ProcedureMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(g_live.load(), 0); }
  void TearDown() override { EXPECT_EQ(g_live.load(), 0); }
};

TEST_F(ProcedureMemoryTest, ChunksFreedBlocksAreReusedOnlyWhenFree) {
  // A long chain: every link is made in the previous one's Do and each
  // checks its payload, so a slot handed out twice while alive fails.
  class Link : public Procedure {
   public:
    Link(int remaining, uint64_t payload)
        : Procedure("link"), remaining_(remaining), payload_(payload) {}
    absl::StatusOr<Procedures> Do(const Context&) override {
      if (payload_ != Expected(remaining_)) {
        return absl::InternalError("link overwritten");
      }
      if (remaining_ == 1) return Procedures{};
      return ProcedureList(
          std::make_unique<Link>(remaining_ - 1, Expected(remaining_ - 1)));
    }
    static uint64_t Expected(int n) { return 0x9e3779b97f4a7c15ull * n; }

   private:
    const int remaining_;
    const uint64_t payload_;
  };
  Once plan([] {
    return ProcedureList(std::make_unique<Link>(20'000, Link::Expected(20'000)),
                         std::make_unique<Counted>(7, 3));
  });
  ExecutionReport r = Scheduler(Quiet()).Execute(Context(), plan);
  EXPECT_THAT(r.status, IsOk());
  EXPECT_EQ(r.steps_run, 20'000 + 4);
}

TEST_F(ProcedureMemoryTest, KeptPastTheExecutionStaysValid) {
  std::vector<std::unique_ptr<Counted>> kept;
  Scheduler scheduler(Quiet());
  for (int run = 0; run < 3; ++run) {
    Once plan([&kept, run] {
      Procedures todo;
      for (int i = 0; i < 100; ++i) {
        auto p = std::make_unique<Counted>(1000 * run + i, 2);
        // Keep every tenth: made inside Create, outliving the execution.
        if (i % 10 == 0) kept.push_back(std::make_unique<Counted>(run + 1));
        todo.push_back(std::move(p));
      }
      return todo;
    });
    ExecutionReport r = scheduler.Execute(Context(), plan);
    ASSERT_THAT(r.status, IsOk());
    EXPECT_EQ(r.steps_run, 300);
  }
  // Later executions reused the chunks that were free, never these.
  ASSERT_EQ(kept.size(), 30u);
  for (const auto& p : kept) EXPECT_TRUE(p->Intact());
  EXPECT_EQ(g_live.load(), 30);
  kept.clear();
}

TEST_F(ProcedureMemoryTest, KeptProceduresDestroyedOnAnotherThread) {
  Mutex mu;
  std::vector<std::unique_ptr<Procedure>> kept;
  {
    Scheduler scheduler(Quiet());
    Once plan([&] {
      Procedures todo;
      for (int i = 0; i < 2'000; ++i) {
        todo.push_back(MakeProcedure(
            "keep one", [&, i](const Context&) -> absl::StatusOr<Procedures> {
              MutexLock l(&mu);
              kept.push_back(std::make_unique<Counted>(i));
              return Procedures{};
            }));
      }
      return todo;
    });
    ASSERT_THAT(scheduler.Execute(Context(), plan).status, IsOk());
  }  // The scheduler (and its chunk cache) is gone too.
  std::vector<std::unique_ptr<Procedure>> mine;
  {
    MutexLock l(&mu);
    mine = std::move(kept);
  }
  ASSERT_EQ(mine.size(), 2'000u);
  // Half destroyed on one thread and half on another, at the same time.
  std::vector<std::unique_ptr<Procedure>> other(
      std::make_move_iterator(mine.begin() + 1'000),
      std::make_move_iterator(mine.end()));
  mine.resize(1'000);
  std::thread t([&other] { other.clear(); });
  mine.clear();
  t.join();
  EXPECT_EQ(g_live.load(), 0);
}

TEST_F(ProcedureMemoryTest, MadeOutsideAnExecutionComesFromTheHeap) {
  // Made before any execution, run by one, destroyed after the Scheduler.
  std::unique_ptr<Counted> outside = std::make_unique<Counted>(5);
  Procedures list;
  list.push_back(std::make_unique<Counted>(6, 1));
  {
    Scheduler scheduler(Quiet());
    Once plan([&list] { return std::move(list); });
    ExecutionReport r = scheduler.Execute(Context(), plan);
    EXPECT_THAT(r.status, IsOk());
    EXPECT_EQ(r.steps_run, 2);
  }
  EXPECT_TRUE(outside->Intact());
  outside.reset();
  // A list grown inside an execution and freed outside it, and the reverse.
  Procedures grown;
  grown.push_back(std::make_unique<Counted>(1));
  Procedures made_inside;
  Scheduler scheduler(Quiet());
  Once plan([&] {
    for (int i = 0; i < 100; ++i) grown.push_back(std::make_unique<Counted>(i));
    made_inside.push_back(std::make_unique<Counted>(2));
    return Procedures{};
  });
  EXPECT_THAT(scheduler.Execute(Context(), plan).status, IsOk());
  EXPECT_EQ(grown.size(), 101u);
  for (int i = 0; i < 100; ++i) made_inside.push_back(nullptr);
  grown.clear();
  made_inside.clear();
}

TEST_F(ProcedureMemoryTest, NewWithoutSchedulerAndPlacementNew) {
  // The class-specific operators keep every ordinary form working.
  Counted* raw = new Counted(9);
  delete raw;
  Counted* maybe = new (std::nothrow) Counted(10);
  ASSERT_NE(maybe, nullptr);
  delete maybe;
  alignas(Counted) unsigned char buffer[sizeof(Counted)];
  Counted* placed = new (buffer) Counted(11);
  EXPECT_TRUE(placed->Intact());
  placed->~Counted();
  auto shared = std::make_shared<Counted>(12);
  EXPECT_TRUE(shared->Intact());
}

TEST_F(ProcedureMemoryTest, OverAlignedAndLargeProcedures) {
  struct alignas(64) Aligned : Procedure {
    Aligned() : Procedure("aligned") {}
    absl::StatusOr<Procedures> Do(const Context&) override {
      if (reinterpret_cast<uintptr_t>(this) % 64 != 0) {
        return absl::InternalError("misaligned");
      }
      return Procedures{};
    }
  };
  struct Large : Procedure {
    Large() : Procedure("large") { std::memset(bytes, 0x5a, sizeof(bytes)); }
    absl::StatusOr<Procedures> Do(const Context&) override {
      for (unsigned char c : bytes) {
        if (c != 0x5a) return absl::InternalError("overwritten");
      }
      return Procedures{};
    }
    unsigned char bytes[4096];
  };
  Once plan([] {
    Procedures todo;
    for (int i = 0; i < 50; ++i) {
      todo.push_back(std::make_unique<Aligned>());
      todo.push_back(std::make_unique<Large>());
      todo.push_back(std::make_unique<Counted>(i, 1));
    }
    return todo;
  });
  ExecutionReport r = Scheduler(Quiet()).Execute(Context(), plan);
  EXPECT_THAT(r.status, IsOk());
  EXPECT_EQ(r.steps_run, 200);
  auto outside = std::make_unique<Aligned>();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(outside.get()) % 64, 0u);
}

TEST_F(ProcedureMemoryTest, ParallelExecutionsCreateOnWorkerThreads) {
  Scheduler scheduler(Quiet({.parallelism = 2}));
  Mutex mu;
  std::vector<std::unique_ptr<Counted>> kept;
  // Two executions at once on the same Scheduler, each on two threads.
  auto run = [&](uint64_t seed) {
    Once plan([&, seed] {
      Procedures todo;
      for (int i = 0; i < 20; ++i) {
        todo.push_back(MakeProcedure(
            "spawn",
            [&, seed, i](const Context&) -> absl::StatusOr<Procedures> {
              // Made on a worker thread, run and destroyed on either.
              Procedures out;
              for (int j = 0; j < 20; ++j) {
                out.push_back(std::make_unique<Counted>(seed + i * 20 + j, 1));
              }
              MutexLock l(&mu);
              kept.push_back(std::make_unique<Counted>(seed + i));
              return out;
            }));
      }
      return todo;
    });
    return scheduler.Execute(Context(), plan);
  };
  ExecutionReport a;
  std::thread t([&] { a = run(1'000'000); });
  ExecutionReport b = run(2'000'000);
  t.join();
  EXPECT_THAT(a.status, IsOk());
  EXPECT_THAT(b.status, IsOk());
  EXPECT_EQ(a.steps_run, 20 + 400 + 400);
  EXPECT_EQ(b.steps_run, 20 + 400 + 400);
  MutexLock l(&mu);
  ASSERT_EQ(kept.size(), 40u);
  for (const auto& p : kept) EXPECT_TRUE(p->Intact());
  kept.clear();
}

TEST_F(ProcedureMemoryTest, ThrowingDoAndThrowingConstructor) {
  struct Throws : Procedure {
    explicit Throws(bool in_constructor) : Procedure("throws") {
      if (in_constructor) throw std::runtime_error("constructor");
    }
    absl::StatusOr<Procedures> Do(const Context&) override {
      // Made, then unwound: freed during the execution, on its thread.
      Procedures made;
      for (int i = 0; i < 10; ++i) made.push_back(std::make_unique<Counted>(i));
      auto extra = std::make_unique<Counted>(99);
      throw std::runtime_error("do");
    }
  };
  Once plan([] {
    try {
      auto never = std::make_unique<Throws>(true);
    } catch (const std::runtime_error&) {
      // The allocation was given back by the matching operator delete.
    }
    Procedures todo;
    todo.push_back(std::make_unique<Throws>(false));
    todo.push_back(std::make_unique<Counted>(1));  // Not run: reported.
    return todo;
  });
  ExecutionReport r = Scheduler(Quiet()).Execute(Context(), plan);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kInternal,
                                 ::testing::HasSubstr("do")));
  EXPECT_EQ(r.steps_failed, 1);
  EXPECT_EQ(r.steps_not_run, 1);
}

TEST_F(ProcedureMemoryTest, NestedExecutionInsideDo) {
  // A Do runs another Scheduler's execution and keeps a procedure made
  // there, returning it as its own child: made in the inner arena, run and
  // destroyed by the outer execution after the inner one ended.
  Scheduler inner_scheduler(Quiet());
  Once outer([&inner_scheduler] {
    return ProcedureList(MakeProcedure(
        "nest",
        [&inner_scheduler](const Context& ctx) -> absl::StatusOr<Procedures> {
          std::unique_ptr<Procedure> handed_out;
          Once inner([&handed_out] {
            handed_out = std::make_unique<Counted>(77, 2);
            Procedures todo;
            for (int i = 0; i < 50; ++i) {
              todo.push_back(std::make_unique<Counted>(i, 1));
            }
            return todo;
          });
          ExecutionReport r = inner_scheduler.Execute(ctx, inner);
          if (!r.status.ok()) return r.status;
          if (r.steps_run != 100) return absl::InternalError("inner steps");
          // Made here, in the outer arena, after the inner one ended.
          return ProcedureList(std::move(handed_out),
                               std::make_unique<Counted>(78, 1));
        }));
  });
  ExecutionReport r = Scheduler(Quiet()).Execute(Context(), outer);
  EXPECT_THAT(r.status, IsOk());
  EXPECT_EQ(r.steps_run, 1 + 3 + 2);
}

// ---- The arena and its cache directly

using planner_internal::ArenaChunk;
using planner_internal::ArenaChunkCache;
using planner_internal::kArenaMaxCachedChunks;
using planner_internal::ProcedureArena;

TEST(ArenaChunkCache, KeepsAtMostTheCapAndTrims) {
  ArenaChunkCache cache;
  ArenaChunk* list = nullptr;
  for (size_t i = 0; i < kArenaMaxCachedChunks + 10; ++i) {
    ArenaChunk* c = cache.Take(nullptr);
    c->next = list;
    list = c;
  }
  cache.Give(list);
  EXPECT_EQ(cache.cached(), kArenaMaxCachedChunks);
  cache.Trim(3);
  EXPECT_EQ(cache.cached(), 3u);
  // What is left is freed by the destructor (LeakSanitizer checks).
}

TEST(ProcedureArena, FreeChunksReturnAtReleaseLiveOnesAtTheirLastFree) {
  ArenaChunkCache cache;
  void* kept = nullptr;
  {
    ProcedureArena arena(&cache);
    ProcedureArena::Scope scope(&arena);
    // Three chunks' worth of blocks, all freed but one in the last chunk.
    std::vector<void*> blocks;
    for (int i = 0; i < 3 * 64 * 1024 / 512; ++i) {
      blocks.push_back(planner_internal::AllocateProcedureMemory(500));
    }
    EXPECT_GE(arena.chunks_taken(), 3u);
    kept = blocks.back();
    blocks.pop_back();
    for (void* b : blocks) planner_internal::FreeProcedureMemory(b, 500);
  }
  // Released: every chunk but the one holding `kept` went to the cache.
  const size_t cached = cache.cached();
  EXPECT_GE(cached, 2u);
  {
    // Another arena takes those chunks; `kept` is untouched.
    ProcedureArena arena(&cache);
    ProcedureArena::Scope scope(&arena);
    std::memset(kept, 0x11, 500);
    void* b = planner_internal::AllocateProcedureMemory(500);
    EXPECT_NE(b, kept);
    EXPECT_EQ(cache.cached(), cached - 1);
    planner_internal::FreeProcedureMemory(b, 500);
  }
  // The last free of a released chunk frees it to the heap, not the cache.
  std::thread([kept] {
    planner_internal::FreeProcedureMemory(kept, 500);
  }).join();
  EXPECT_EQ(cache.cached(), cached);
}

TEST(ProcedureArena, OutsideAScopeBlocksComeFromTheHeap) {
  ArenaChunkCache cache;
  ProcedureArena arena(&cache);
  void* heap = planner_internal::AllocateProcedureMemory(64);
  EXPECT_EQ(arena.chunks_taken(), 0u);
  {
    ProcedureArena::Scope scope(&arena);
    void* in = planner_internal::AllocateProcedureMemory(64);
    EXPECT_EQ(arena.chunks_taken(), 1u);
    // A heap block freed inside the scope goes back to the heap.
    planner_internal::FreeProcedureMemory(heap, 64);
    // Blocks over the limit come from the heap inside too.
    void* big = planner_internal::AllocateProcedureMemory(
        planner_internal::kArenaMaxBlockBytes + 1);
    EXPECT_EQ(arena.chunks_taken(), 1u);
    planner_internal::FreeProcedureMemory(
        big, planner_internal::kArenaMaxBlockBytes + 1);
    planner_internal::FreeProcedureMemory(in, 64);
  }
}

TEST(ProcedureArenaDeathTest, UseAfterFreeOfAnArenaBlockIsCaughtUnderAsan) {
#ifndef SETPOINT_TEST_ASAN
  GTEST_SKIP() << "needs AddressSanitizer (the arena poisons freed blocks)";
#else
  EXPECT_DEATH(
      {
        ArenaChunkCache cache;
        ProcedureArena arena(&cache);
        ProcedureArena::Scope scope(&arena);
        auto* block = static_cast<volatile char*>(
            planner_internal::AllocateProcedureMemory(64));
        planner_internal::FreeProcedureMemory(const_cast<char*>(block), 64);
        block[32] = 1;
      },
      "use-after-poison");
#endif
}

}  // namespace
}  // namespace setpoint
