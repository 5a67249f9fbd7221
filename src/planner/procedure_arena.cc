#include "planner/procedure_arena.h"

#include <new>

#include "setpoint/planner/procedure.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SETPOINT_ARENA_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define SETPOINT_ARENA_ASAN 1
#endif
#ifdef SETPOINT_ARENA_ASAN
#include <sanitizer/asan_interface.h>
#endif

namespace setpoint::planner_internal {
namespace {

// The active arena of this thread, if a Scope is open on it.
thread_local ProcedureArena* tls_arena = nullptr;

// A slot's tag (the 8 bytes before the block): its chunk, or null for a block
// from the heap.
ArenaChunk*& Tag(void* block) {
  return *reinterpret_cast<ArenaChunk**>(static_cast<char*>(block) - 8);
}

// Heap blocks keep their tag in a 16-byte prefix, so they stay 16-aligned.
constexpr size_t kHeapPrefix = 16;
// The first slot's offset in a chunk: right after the header, placed so
// that blocks (8 bytes further) are 16-aligned.
constexpr size_t kFirstSlot = sizeof(ArenaChunk) + 8;
static_assert(sizeof(ArenaChunk) % 16 == 0);
static_assert(kFirstSlot % 16 == 8);

void* HeapAllocate(size_t size) {
  char* base = static_cast<char*>(::operator new(size + kHeapPrefix));
  void* block = base + kHeapPrefix;
  Tag(block) = nullptr;
  return block;
}

// Bytes of the slot holding a block of `size` bytes (tag included).
constexpr size_t SlotBytes(size_t size) {
  return (size + 8 + 15) & ~size_t{15};
}

ArenaChunk* NewChunk() {
  return new (::operator new(kArenaChunkBytes)) ArenaChunk;
}

void DeleteChunk(ArenaChunk* chunk) {
  chunk->~ArenaChunk();
  ::operator delete(chunk);
}

// Under AddressSanitizer a freed block is poisoned until it is reused, so a
// use after free of an arena block is caught as it would be on the heap.
void PoisonFreed(void* block, size_t size) {
#ifdef SETPOINT_ARENA_ASAN
  // The first word stays readable: it links the free list.
  if (size > sizeof(void*)) {
    ASAN_POISON_MEMORY_REGION(static_cast<char*>(block) + sizeof(void*),
                              size - sizeof(void*));
  }
#else
  (void)block;
  (void)size;
#endif
}

void UnpoisonReused(void* block, size_t size) {
#ifdef SETPOINT_ARENA_ASAN
  ASAN_UNPOISON_MEMORY_REGION(block, size);
#else
  (void)block;
  (void)size;
#endif
}

}  // namespace

void* AllocateProcedureMemory(size_t size) {
  ProcedureArena* arena = tls_arena;
  if (arena != nullptr && size <= kArenaMaxBlockBytes) {
    return arena->Allocate(size);
  }
  return HeapAllocate(size);
}

void FreeProcedureMemory(void* block, size_t size) noexcept {
  if (block == nullptr) return;
  ArenaChunk* chunk = Tag(block);
  if (chunk == nullptr) {
    ::operator delete(static_cast<char*>(block) - kHeapPrefix);
    return;
  }
  ProcedureArena* arena = tls_arena;
  if (arena != nullptr &&
      chunk->owner.load(std::memory_order_relaxed) == arena) {
    arena->FreeLocal(chunk, block, size);
    return;
  }
  // Another thread's arena, or one already released: the last block of a
  // released chunk frees it.
  if (chunk->count.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    DeleteChunk(chunk);
  }
}

void* AllocateAlignedProcedureMemory(size_t size, std::align_val_t align) {
  return ::operator new(size, align);
}

void FreeAlignedProcedureMemory(void* block, std::align_val_t align) noexcept {
  ::operator delete(block, align);
}

// ---- ProcedureArena

ProcedureArena::Scope::Scope(ProcedureArena* arena) : saved_(tls_arena) {
  tls_arena = arena;
}

ProcedureArena::Scope::~Scope() { tls_arena = saved_; }

void* ProcedureArena::Allocate(size_t size) {
  const size_t slot = SlotBytes(size);
  void*& head = free_[slot / 16];
  if (void* block = head; block != nullptr) {
    UnpoisonReused(block, size);
    head = *static_cast<void**>(block);
    ++Tag(block)->local_live;
    return block;
  }
  if (static_cast<size_t>(end_ - next_) < slot) return AllocateSlow(slot);
  char* s = next_;
  next_ += slot;
  void* block = s + 8;
  Tag(block) = current_;
  ++current_->local_live;
  return block;
}

void* ProcedureArena::AllocateSlow(size_t slot) {
  ArenaChunk* chunk = cache_->Take(this);
  ++chunks_taken_;
  chunk->next = chunks_;
  chunks_ = chunk;
  current_ = chunk;
  next_ = reinterpret_cast<char*>(chunk) + kFirstSlot;
  end_ = reinterpret_cast<char*>(chunk) + kArenaChunkBytes;
  char* s = next_;
  next_ += slot;
  void* block = s + 8;
  Tag(block) = chunk;
  ++chunk->local_live;
  return block;
}

void ProcedureArena::FreeLocal(ArenaChunk* chunk, void* block, size_t size) {
  --chunk->local_live;
  // Size 0: not known (a nothrow new whose constructor threw); not reused.
  if (size == 0) return;
  void*& head = free_[SlotBytes(size) / 16];
  *static_cast<void**>(block) = head;
  head = block;
  PoisonFreed(block, size);
}

ProcedureArena::~ProcedureArena() {
  ArenaChunk* reusable = nullptr;
  for (ArenaChunk* chunk = chunks_; chunk != nullptr;) {
    // Read before the count is published: from then on another thread may
    // free the chunk.
    ArenaChunk* next = chunk->next;
    chunk->owner.store(nullptr, std::memory_order_relaxed);
    const int64_t live = chunk->local_live;
    if (chunk->count.fetch_add(live, std::memory_order_acq_rel) + live == 0) {
      // Nothing alive in it: reusable at once.
      chunk->local_live = 0;
      chunk->next = reusable;
      reusable = chunk;
    }
    chunk = next;
  }
  cache_->Give(reusable);
}

// ---- ArenaChunkCache

ArenaChunkCache::~ArenaChunkCache() { Trim(0); }

ArenaChunk* ArenaChunkCache::Take(ProcedureArena* owner) {
  ArenaChunk* chunk = nullptr;
  {
    MutexLock l(&mu_);
    if (free_ != nullptr) {
      chunk = free_;
      free_ = chunk->next;
      --free_count_;
    }
  }
  if (chunk == nullptr) chunk = NewChunk();
  chunk->next = nullptr;
#ifdef SETPOINT_ARENA_ASAN
  // A recycled chunk may hold poisoned blocks of its last use.
  ASAN_UNPOISON_MEMORY_REGION(reinterpret_cast<char*>(chunk) + kFirstSlot,
                              kArenaChunkBytes - kFirstSlot);
#endif
  chunk->owner.store(owner, std::memory_order_relaxed);
  return chunk;
}

void ArenaChunkCache::Give(ArenaChunk* list) {
  ArenaChunk* surplus = nullptr;
  {
    MutexLock l(&mu_);
    while (list != nullptr) {
      ArenaChunk* chunk = list;
      list = chunk->next;
      if (free_count_ < kArenaMaxCachedChunks) {
        chunk->next = free_;
        free_ = chunk;
        ++free_count_;
      } else {
        chunk->next = surplus;
        surplus = chunk;
      }
    }
  }
  while (surplus != nullptr) {
    ArenaChunk* chunk = surplus;
    surplus = chunk->next;
    DeleteChunk(chunk);
  }
}

void ArenaChunkCache::Trim(size_t keep) {
  ArenaChunk* surplus = nullptr;
  {
    MutexLock l(&mu_);
    while (free_count_ > keep) {
      ArenaChunk* chunk = free_;
      free_ = chunk->next;
      --free_count_;
      chunk->next = surplus;
      surplus = chunk;
    }
  }
  while (surplus != nullptr) {
    ArenaChunk* chunk = surplus;
    surplus = chunk->next;
    DeleteChunk(chunk);
  }
}

size_t ArenaChunkCache::cached() const {
  MutexLock l(&mu_);
  return free_count_;
}

}  // namespace setpoint::planner_internal
