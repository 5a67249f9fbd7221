// The value types a Syncer reports, without the Syncer: the operation kinds
// (SyncOp) and its counters (SyncerStats). The syncer's compiled parts use
// them too; user code gets them through setpoint/processor/syncer.h.
//
// Thread safety: plain values.
#ifndef SETPOINT_PROCESSOR_SYNC_TYPES_H_
#define SETPOINT_PROCESSOR_SYNC_TYPES_H_

#include <cstdint>

namespace setpoint {

// What a Syncer does to one key of the world.
enum class SyncOp : uint8_t { kNone, kCreate, kUpdate, kDelete };
// "create", "update", "delete" or "none".
const char* SyncOpName(SyncOp op);

// A Syncer's counters since it was made, readable from any thread.
struct SyncerStats {
  int64_t creates = 0;  // Succeeded operations, by kind.
  int64_t updates = 0;
  int64_t deletes = 0;
  int64_t failures = 0;              // Failed operations that will be retried.
  int64_t terminal_failures = 0;     // Failed with a terminal code.
  int64_t client_threw = 0;          // Of the failures, how many threw.
  int64_t results_discarded = 0;     // Results for keys that left the range.
  int64_t ignored_out_of_range = 0;  // Desired/observed keys outside filter.
  int64_t not_started_at_stop = 0;   // Handed to updaters, never started.
  int64_t calls_cancelled = 0;       // Calls cancelled: the key left.
  int64_t stale_refusals = 0;        // Calls refused as a stale owner
                                     // (discarded results included).
  int64_t pauses = 0;                // Times writes paused: world down.
  int64_t probes = 0;                // Calls sent while paused.
  int64_t requeued = 0;  // Failed while paused, or in a batch cancelled for
                         // another key: retried without counting a failure.
  int64_t batches = 0;   // Batch client calls made (batch clients only).
};

}  // namespace setpoint

#endif  // SETPOINT_PROCESSOR_SYNC_TYPES_H_
