// RecordsApi: the "world" of the sharded example — a DNS provider holding
// records. FakeRecordsApi is an in-process fake with latency and injected
// 503s and 429s; HttpRecordsApi (records_http_client.h) talks to the same
// fake run as a service (records_api_server). The fake checks fencing
// tokens the way a real system should: every write must carry the
// assignment it was started under (setpoint::AssignmentOf(ctx)); a write
// for a key the writer does not claim, or with a token older than one
// already seen for that key's shard, is refused and counted. A token is
// "seen" for every shard of the range its write claimed: once the next
// owner of a shard has written anything, every older writer of that shard
// is refused.
//
// Thread safety: thread-safe.
#ifndef SETPOINT_EXAMPLES_SHARDED_RECORDS_API_H_
#define SETPOINT_EXAMPLES_SHARDED_RECORDS_API_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
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

// What the controller needs from the DNS provider.
class RecordsApi {
 public:
  virtual ~RecordsApi() = default;
  virtual absl::StatusOr<Records> List(const setpoint::Context& ctx) = 0;
  virtual absl::Status Put(const setpoint::Context& ctx,
                           const std::string& name, const Record& record) = 0;
  virtual absl::Status Delete(const setpoint::Context& ctx,
                              const std::string& name) = 0;
  // The zone's serial, written only by the leader (a one-shard kind).
  virtual absl::Status PublishSerial(const setpoint::Context& ctx,
                                     int64_t serial) = 0;
  // The serial last published; -1 when it cannot be read.
  virtual int64_t serial() const = 0;
};

struct RecordsApiOptions {
  absl::Duration latency = absl::Milliseconds(2);
  double unavailable_rate = 0.03;  // 503: retried with backoff.
  double throttle_rate = 0.02;     // 429 with a retry-after of 200 ms.
  uint64_t seed = 1;
  // Accepted writes kept for write_log() (oldest dropped first); 0 keeps
  // none.
  size_t write_log_limit = 0;
};

struct RecordsApiStats {
  int64_t lists = 0;            // List calls (the zone fetched whole).
  int64_t writes = 0;           // Accepted puts and deletes.
  int64_t stale_refused = 0;    // Token older than one seen for the shard.
  int64_t unowned_refused = 0;  // No assignment, or key not in its range.
  int64_t injected_errors = 0;  // 503s and 429s.
  int64_t max_concurrent_per_key = 0;
  int64_t serial_writes = 0;  // Leader writes accepted.
};

// Per writer (node id): what the API did with its writes.
struct WriterStats {
  int64_t writes = 0;  // Accepted, serial included.
  int64_t stale_refused = 0;
  int64_t unowned_refused = 0;
  // The assignment of its last accepted write, and when.
  setpoint::ShardSet range = {};
  uint64_t token = 0;
  absl::Time last_write = absl::InfinitePast();
};

// One accepted write, as the API recorded it.
struct AcceptedWrite {
  absl::Time time;
  std::string node_id;
  std::string kind;
  uint32_t shard = 0;  // Of the key; 0 for the serial.
  uint64_t token = 0;
  setpoint::ShardSet range = {};  // The writer's claim.
};

class FakeRecordsApi final : public RecordsApi {
 public:
  static constexpr uint32_t kMaxRingSize = uint32_t{1} << 20;

  explicit FakeRecordsApi(RecordsApiOptions options = {})
      : options_(options), rng_(options.seed) {}

  absl::StatusOr<Records> List(const setpoint::Context& ctx) override {
    SETPOINT_RETURN_IF_ERROR(ctx.Wait(options_.latency));
    setpoint::MutexLock l(&mu_);
    ++stats_.lists;
    return records_;
  }
  absl::Status Put(const setpoint::Context& ctx, const std::string& name,
                   const Record& record) override {
    return Write(ctx, name, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      records_[name] = record;
    });
  }
  absl::Status Delete(const setpoint::Context& ctx,
                      const std::string& name) override {
    return Write(ctx, name, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      records_.erase(name);
    });
  }
  absl::Status PublishSerial(const setpoint::Context& ctx,
                             int64_t serial) override {
    const setpoint::Assignment* a = setpoint::AssignmentOf(ctx);
    setpoint::MutexLock l(&mu_);
    if (a == nullptr || a->range.Empty()) {
      ++stats_.unowned_refused;
      if (a != nullptr) ++writers_[a->node_id].unowned_refused;
      return absl::PermissionDeniedError("serial: the writer is not leader");
    }
    if (a->token < leader_token_) {
      ++stats_.stale_refused;
      ++writers_[a->node_id].stale_refused;
      return setpoint::StaleOwnerError(
          absl::StrCat("serial: token ", a->token, " < ", leader_token_));
    }
    leader_token_ = a->token;
    serial_ = serial;
    ++stats_.serial_writes;
    Accepted(*a, 0);
    return absl::OkStatus();
  }
  int64_t serial() const override {
    setpoint::MutexLock l(&mu_);
    return serial_;
  }
  std::optional<Record> Find(const std::string& name) const {
    setpoint::MutexLock l(&mu_);
    auto it = records_.find(name);
    if (it == records_.end()) return std::nullopt;
    return it->second;
  }
  Records records() const {
    setpoint::MutexLock l(&mu_);
    return records_;
  }
  RecordsApiStats stats() const {
    setpoint::MutexLock l(&mu_);
    return stats_;
  }
  absl::flat_hash_map<std::string, WriterStats> writers() const {
    setpoint::MutexLock l(&mu_);
    return writers_;
  }
  // Accepted writes from the `from`-th on (counting from the first ever),
  // as far as the log still holds them; `next` gets the count so far.
  std::vector<AcceptedWrite> write_log(int64_t from, int64_t* next) const {
    setpoint::MutexLock l(&mu_);
    *next = log_end_;
    int64_t first = log_end_ - static_cast<int64_t>(log_.size());
    std::vector<AcceptedWrite> out;
    for (int64_t i = std::max(from, first); i < log_end_; ++i) {
      out.push_back(log_[static_cast<size_t>(i - first)]);
    }
    return out;
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
        if (a != nullptr) ++writers_[a->node_id].unowned_refused;
        return absl::PermissionDeniedError(
            absl::StrCat(name, ": the writer does not own it"));
      }
      SETPOINT_RETURN_IF_ERROR(CheckRing(a->ring_size));
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
    SETPOINT_RETURN_IF_ERROR(CheckRing(a->ring_size));
    if (ring_size_ == 0) {
      ring_size_ = a->ring_size;
      tokens_.assign(ring_size_, 0);
    }
    uint32_t shard = setpoint::ShardOf(name, a->ring_size);
    uint64_t seen = tokens_[shard];
    if (a->token < seen) {
      ++stats_.stale_refused;
      ++writers_[a->node_id].stale_refused;
      return setpoint::StaleOwnerError(
          absl::StrCat(name, ": token ", a->token, " < ", seen));
    }
    // Every shard the writer claims has now seen its token.
    for (const setpoint::ShardRange& r : a->range.runs()) {
      for (uint32_t s = r.begin; s < std::min(r.end, ring_size_); ++s) {
        tokens_[s] = std::max(tokens_[s], a->token);
      }
    }
    apply();
    ++stats_.writes;
    Accepted(*a, shard);
    return absl::OkStatus();
  }
  // Every writer of records must split the same ring, of at most
  // kMaxRingSize shards.
  absl::Status CheckRing(uint32_t ring_size) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ring_size == 0 || ring_size > kMaxRingSize) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ring of ", ring_size, " shards; at most ", kMaxRingSize));
    }
    if (ring_size_ != 0 && ring_size != ring_size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("ring of ", ring_size, " shards; this API fences ",
                       "a ring of ", ring_size_));
    }
    return absl::OkStatus();
  }
  void Accepted(const setpoint::Assignment& a, uint32_t shard)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Time now = absl::Now();
    WriterStats& w = writers_[a.node_id];
    ++w.writes;
    w.range = a.range;
    w.token = a.token;
    w.last_write = now;
    if (options_.write_log_limit == 0) return;
    log_.push_back({now, a.node_id, a.kind, shard, a.token, a.range});
    ++log_end_;
    if (log_.size() > options_.write_log_limit) log_.pop_front();
  }

  const RecordsApiOptions options_;
  mutable setpoint::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  Records records_ ABSL_GUARDED_BY(mu_);
  // The ring the records' writers split (set by the first write), and per
  // shard the newest token seen.
  uint32_t ring_size_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint64_t> tokens_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> writing_ ABSL_GUARDED_BY(mu_);
  uint64_t leader_token_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t serial_ ABSL_GUARDED_BY(mu_) = 0;
  RecordsApiStats stats_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, WriterStats> writers_ ABSL_GUARDED_BY(mu_);
  std::deque<AcceptedWrite> log_ ABSL_GUARDED_BY(mu_);
  int64_t log_end_ ABSL_GUARDED_BY(mu_) = 0;
};

// How the catalog keeps changing (Catalog::Churn): every `period` each
// record gets a new address, at a moment of its own within the period
// (from the hash of its name), until `until`; then the addresses stay.
// Computed from the wall clock alone, so processes with the same catalog
// and churn agree on the desired state without talking to each other.
struct Churn {
  absl::Duration period = absl::ZeroDuration();  // Zero: no churn.
  absl::Time until = absl::InfiniteFuture();
};

// The desired state: the records the operator wants (thread-safe).
class Catalog {
 public:
  Records Get() const {
    setpoint::MutexLock l(&mu_);
    if (churn_.period <= absl::ZeroDuration()) return want_;
    int64_t period = absl::ToInt64Milliseconds(churn_.period);
    int64_t now = absl::ToUnixMillis(std::min(absl::Now(), churn_.until));
    Records out;
    for (const auto& [name, r] : want_) {
      uint64_t h = setpoint::Fnv1a64(name);
      int64_t version = (now + static_cast<int64_t>(h % period)) / period;
      out[name] = Record{absl::StrCat("10.", version % 250, ".", (h >> 8) % 250,
                                      ".", h % 250)};
    }
    return out;
  }
  void Set(std::string name, Record r) {
    setpoint::MutexLock l(&mu_);
    want_[std::move(name)] = std::move(r);
  }
  void Remove(const std::string& name) {
    setpoint::MutexLock l(&mu_);
    want_.erase(name);
  }
  // From now on the records' addresses follow `churn` (the names stay).
  void SetChurn(Churn churn) {
    setpoint::MutexLock l(&mu_);
    churn_ = churn;
  }

 private:
  mutable setpoint::Mutex mu_;
  Records want_ ABSL_GUARDED_BY(mu_);
  Churn churn_ ABSL_GUARDED_BY(mu_);
};

// Sets records host-<from>.example.com .. host-<to - 1>.example.com to
// addresses starting with `prefix`.
inline void Fill(Catalog& catalog, int from, int to, const char* prefix) {
  for (int i = from; i < to; ++i) {
    catalog.Set(absl::StrFormat("host-%04d.example.com", i),
                Record{absl::StrFormat("%s.%d.%d", prefix, i / 250, i % 250)});
  }
}

}  // namespace sharded

#endif  // SETPOINT_EXAMPLES_SHARDED_RECORDS_API_H_
