// ProcedureArena: where procedures and their lists live while a Scheduler
// execution runs (see planner_internal in setpoint/planner/procedure.h).
//
//   ArenaChunkCache cache;                 // one per Scheduler
//   {
//     ProcedureArena arena(&cache);        // one per execution and thread
//     ProcedureArena::Scope scope(&arena);  // procedures made here use it
//     ...
//   }                                      // arena released; blocks still
//                                          // alive keep their chunks
//
// Layout: a chunk is a 64 KiB heap block, a small header and then slots. Each
// slot is an 8-byte tag followed by the block the caller gets (16-aligned);
// the tag points to the slot's chunk, or holds kHeapTag for a block that came
// from the heap. A block freed by the arena's own thread while the arena is
// active goes on a free list for its size and is reused; any other free
// decrements the chunk's atomic count. When the arena is released, it adds
// the blocks still alive to that count: chunks with none left go back to the
// cache at once, the others to the heap when their last block is freed.
//
// Thread safety: an arena is used by one thread at a time (the one its Scope
// is on); blocks may be freed on any thread; ArenaChunkCache is thread-safe.
#ifndef SETPOINT_SRC_PLANNER_PROCEDURE_ARENA_H_
#define SETPOINT_SRC_PLANNER_PROCEDURE_ARENA_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "setpoint/base/mutex.h"

namespace setpoint::planner_internal {

class ProcedureArena;

// The bytes of one chunk, header included.
inline constexpr size_t kArenaChunkBytes = 64 * 1024;
// Blocks larger than this come from the heap even inside an execution.
inline constexpr size_t kArenaMaxBlockBytes = 1024;
// How many chunks a cache keeps for the next execution (8 MiB: enough for
// about 100,000 procedures of 64 bytes).
inline constexpr size_t kArenaMaxCachedChunks = 128;

struct alignas(16) ArenaChunk {
  // The arena that allocates from this chunk while it is active; null once
  // it was released. Read by any thread freeing a block (relaxed: a thread
  // only compares it with its own active arena).
  std::atomic<ProcedureArena*> owner{nullptr};
  // Before the release: minus the blocks freed by other threads or outside
  // the arena. After it: the blocks still alive.
  std::atomic<int64_t> count{0};
  // Blocks alive as the owner counts them (allocated minus freed by it).
  // Owner thread only.
  int64_t local_live = 0;
  ArenaChunk* next = nullptr;  // In the arena's or the cache's list.
};

// Chunks kept between the executions of one Scheduler, so that a plan run
// again and again reuses warm memory instead of the heap's. It keeps at most
// as many chunks as the last execution took, and never more than
// kArenaMaxCachedChunks; the rest go back to the heap when an execution ends,
// and all of them when the cache is destroyed.
class ArenaChunkCache {
 public:
  ArenaChunkCache() = default;
  ~ArenaChunkCache();
  ArenaChunkCache(const ArenaChunkCache&) = delete;
  ArenaChunkCache& operator=(const ArenaChunkCache&) = delete;

  // A cached chunk or a new one, owned by `owner`.
  ArenaChunk* Take(ProcedureArena* owner);
  // Takes back the free chunks in `list` (linked by next), up to
  // kArenaMaxCachedChunks in all; frees the others.
  void Give(ArenaChunk* list);
  // Frees cached chunks beyond `keep` (an execution's end passes how many
  // it took).
  void Trim(size_t keep);
  // Chunks held now, for tests.
  size_t cached() const;

 private:
  mutable Mutex mu_;
  ArenaChunk* free_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t free_count_ ABSL_GUARDED_BY(mu_) = 0;
};

class ProcedureArena {
 public:
  // `cache` must outlive the arena.
  explicit ProcedureArena(ArenaChunkCache* cache) : cache_(cache) {}
  // Releases the arena (see the file comment). Must run on the thread that
  // used it, or after that thread was joined.
  ~ProcedureArena();
  ProcedureArena(const ProcedureArena&) = delete;
  ProcedureArena& operator=(const ProcedureArena&) = delete;

  // Makes `arena` the calling thread's active arena for the scope's life;
  // the previous one (a nested execution's caller's) is active again after.
  class Scope {
   public:
    explicit Scope(ProcedureArena* arena);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    ProcedureArena* const saved_;
  };

  // Chunks taken from the cache or the heap so far.
  size_t chunks_taken() const { return chunks_taken_; }

  // For AllocateProcedureMemory and FreeProcedureMemory: `size` is at most
  // kArenaMaxBlockBytes.
  void* Allocate(size_t size);
  void FreeLocal(ArenaChunk* chunk, void* block, size_t size);

 private:
  static constexpr size_t kClasses = kArenaMaxBlockBytes / 16 + 2;

  void* AllocateSlow(size_t slot);

  ArenaChunkCache* const cache_;
  ArenaChunk* chunks_ = nullptr;   // Every chunk this arena took.
  ArenaChunk* current_ = nullptr;  // The one being carved.
  char* next_ = nullptr;           // Its next free slot.
  char* end_ = nullptr;
  size_t chunks_taken_ = 0;
  // Freed blocks by slot size / 16, linked through their first word.
  void* free_[kClasses] = {};
};

}  // namespace setpoint::planner_internal

#endif  // SETPOINT_SRC_PLANNER_PROCEDURE_ARENA_H_
