// RecordsApi: the "world" of the sharded example — a DNS provider holding
// records, with latency and injected 503s and 429s. It checks fencing
// tokens the way a real system should: every write must carry the
// assignment it was started under (setpoint::AssignmentOf(ctx)); a write
// for a key the writer does not claim, or with a token older than one
// already seen for that key's shard, is refused and counted.
//
// Thread safety: thread-safe.
#ifndef SETPOINT_EXAMPLES_SHARDED_RECORDS_API_H_
#define SETPOINT_EXAMPLES_SHARDED_RECORDS_API_H_

#include <cstdint>
#include <random>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
#include "setpoint/base/status.h"
#include "setpoint/controller/controller.h"

namespace sharded {

struct Record {
  std::string address;
  friend bool operator==(const Record&, const Record&) = default;
};
using Records = absl::flat_hash_map<std::string, Record>;

struct RecordsApiOptions {
  absl::Duration latency = absl::Milliseconds(2);
  double unavailable_rate = 0.03;  // 503: retried with backoff.
  double throttle_rate = 0.02;     // 429 with a retry-after of 200 ms.
  uint64_t seed = 1;
};

struct RecordsApiStats {
  int64_t writes = 0;           // Accepted puts and deletes.
  int64_t stale_refused = 0;    // Token older than one seen for the shard.
  int64_t unowned_refused = 0;  // No assignment, or key not in its range.
  int64_t injected_errors = 0;  // 503s and 429s.
  int64_t max_concurrent_per_key = 0;
  int64_t serial_writes = 0;  // Leader writes accepted.
};

class RecordsApi {
 public:
  explicit RecordsApi(RecordsApiOptions options = {})
      : options_(options), rng_(options.seed) {}

  absl::StatusOr<Records> List(const setpoint::Context& ctx) {
    SETPOINT_RETURN_IF_ERROR(ctx.Wait(options_.latency));
    setpoint::MutexLock l(&mu_);
    return records_;
  }
  absl::Status Put(const setpoint::Context& ctx, const std::string& name,
                   const Record& record) {
    return Write(ctx, name, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      records_[name] = record;
    });
  }
  absl::Status Delete(const setpoint::Context& ctx, const std::string& name) {
    return Write(ctx, name, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      records_.erase(name);
    });
  }
  // The zone's serial, written only by the leader (a one-shard kind).
  absl::Status PublishSerial(const setpoint::Context& ctx, int64_t serial) {
    const setpoint::Assignment* a = setpoint::AssignmentOf(ctx);
    setpoint::MutexLock l(&mu_);
    if (a == nullptr || a->range.Empty()) {
      ++stats_.unowned_refused;
      return absl::PermissionDeniedError("serial: the writer is not leader");
    }
    if (a->token < leader_token_) {
      ++stats_.stale_refused;
      return setpoint::StaleOwnerError(
          absl::StrCat("serial: token ", a->token, " < ", leader_token_));
    }
    leader_token_ = a->token;
    serial_ = serial;
    ++stats_.serial_writes;
    return absl::OkStatus();
  }
  int64_t serial() const {
    setpoint::MutexLock l(&mu_);
    return serial_;
  }
  Records records() const {
    setpoint::MutexLock l(&mu_);
    return records_;
  }
  RecordsApiStats stats() const {
    setpoint::MutexLock l(&mu_);
    return stats_;
  }

 private:
  template <class Apply>
  absl::Status Write(const setpoint::Context& ctx, const std::string& name,
                     Apply apply) {
    const setpoint::Assignment* a = setpoint::AssignmentOf(ctx);
    {
      setpoint::MutexLock l(&mu_);
      if (a == nullptr || !a->Owns(name)) {
        ++stats_.unowned_refused;
        return absl::PermissionDeniedError(
            absl::StrCat(name, ": the writer does not own it"));
      }
      std::uniform_real_distribution<double> p(0, 1);
      double roll = p(rng_);
      if (roll < options_.unavailable_rate) {
        ++stats_.injected_errors;
        return absl::UnavailableError("503 injected");
      }
      if (roll < options_.unavailable_rate + options_.throttle_rate) {
        ++stats_.injected_errors;
        return setpoint::WithRetryAfter(
            absl::ResourceExhaustedError("429 injected"),
            absl::Milliseconds(200));
      }
      stats_.max_concurrent_per_key =
          std::max<int64_t>(stats_.max_concurrent_per_key, ++writing_[name]);
    }
    absl::Status waited = ctx.Wait(options_.latency);
    setpoint::MutexLock l(&mu_);
    if (--writing_[name] == 0) writing_.erase(name);
    SETPOINT_RETURN_IF_ERROR(waited);  // Cancelled: nothing written.
    uint64_t& seen = tokens_[setpoint::ShardOf(name, a->ring_size)];
    if (a->token < seen) {
      ++stats_.stale_refused;
      return setpoint::StaleOwnerError(
          absl::StrCat(name, ": token ", a->token, " < ", seen));
    }
    seen = a->token;
    apply();
    ++stats_.writes;
    return absl::OkStatus();
  }

  const RecordsApiOptions options_;
  mutable setpoint::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  Records records_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint32_t, uint64_t> tokens_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> writing_ ABSL_GUARDED_BY(mu_);
  uint64_t leader_token_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t serial_ ABSL_GUARDED_BY(mu_) = 0;
  RecordsApiStats stats_ ABSL_GUARDED_BY(mu_);
};

// The desired state: the records the operator wants (thread-safe).
class Catalog {
 public:
  Records Get() const {
    setpoint::MutexLock l(&mu_);
    return want_;
  }
  void Set(std::string name, Record r) {
    setpoint::MutexLock l(&mu_);
    want_[std::move(name)] = std::move(r);
  }
  void Remove(const std::string& name) {
    setpoint::MutexLock l(&mu_);
    want_.erase(name);
  }

 private:
  mutable setpoint::Mutex mu_;
  Records want_ ABSL_GUARDED_BY(mu_);
};

}  // namespace sharded

#endif  // SETPOINT_EXAMPLES_SHARDED_RECORDS_API_H_
