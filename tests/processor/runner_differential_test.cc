// Differential test of the Runner against ReferenceRunner (a mutex and a
// deque): the same seeded random workloads run through both.
//
// Manual mode (one thread, a SimulatedClock) is deterministic, so the whole
// trace must be equal: every event and timer that ran, in order, every
// Cancel() result, every refused post, what each RunUntilIdle returned, the
// stats at checkpoints, and which closures were destroyed without running.
//
// Started mode (several producer threads, then a Stop racing them) is
// checked per run against the documented rules (each producer's accepted
// posts run once, in its order; refused ones never; due timers run,
// cancelled ones never, those not yet due at Stop are dropped and counted),
// and the parts that the rules make deterministic (everything before the
// Stop race) must be equal between the two runners.
//
// Seeds: a fixed set (fewer in sanitizer builds). SETPOINT_RUNNER_DIFF_SEED=S
// replays one seed; SETPOINT_RUNNER_DIFF_SEEDS=N adds N random seeds (each
// failure names its seed).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "processor/reference_runner.h"
#include "setpoint/base/mutex.h"
#include "setpoint/processor/runner.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/simulated_clock.h"

namespace setpoint {
namespace {

using ::setpoint::testing::AwaitCondition;
using ::setpoint::testing::ReferenceRunner;
using ::setpoint::testing::ReferenceTimerHandle;
using ::setpoint::testing::SimulatedClock;

// Sanitizers slow every step several times: fewer seeds there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSlowBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSlowBuild = true;
#else
constexpr bool kSlowBuild = false;
#endif
#else
constexpr bool kSlowBuild = false;
#endif

constexpr int kManualSeeds = kSlowBuild ? 30 : 150;
constexpr int kStartedSeeds = kSlowBuild ? 6 : 24;

// The seeds to run: 1..fixed, plus SETPOINT_RUNNER_DIFF_SEEDS random ones,
// or only SETPOINT_RUNNER_DIFF_SEED.
std::vector<uint64_t> Seeds(int fixed, uint64_t salt) {
  if (const char* one = std::getenv("SETPOINT_RUNNER_DIFF_SEED")) {
    return {std::strtoull(one, nullptr, 0)};
  }
  std::vector<uint64_t> seeds;
  for (int i = 1; i <= fixed; ++i) seeds.push_back(salt + i);
  if (const char* more = std::getenv("SETPOINT_RUNNER_DIFF_SEEDS")) {
    std::random_device rd;
    for (long i = std::strtol(more, nullptr, 10); i > 0; --i) {
      seeds.push_back((uint64_t{rd()} << 32) | rd());
    }
  }
  return seeds;
}

uint64_t Mix(uint64_t x) {  // SplitMix64's finalizer.
  x += 0x9e3779b97f4a7c15;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9;
  x = (x ^ (x >> 27)) * 0x94d049bb133111eb;
  return x ^ (x >> 31);
}

// A cheap seeded generator (events seed their own, so seeding must be cheap).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(Mix(seed)) {}
  uint64_t Next() { return Mix(state_++); }
  int64_t Below(int64_t n) {
    return static_cast<int64_t>(Next() % static_cast<uint64_t>(n));
  }
  bool Percent(int64_t p) { return Below(100) < p; }

 private:
  uint64_t state_;
};

// The two runners behind one shape, on a simulated clock.
template <class R>
std::unique_ptr<R> MakeRunner(SimulatedClock* clock);
template <>
std::unique_ptr<Runner> MakeRunner<Runner>(SimulatedClock* clock) {
  return std::make_unique<Runner>(
      RunnerOptions{.name = "diff",
                    .clock = clock,
                    .slow_event_threshold = absl::ZeroDuration(),
                    .logger = ::setpoint::testing::NullLogger()});
}
template <>
std::unique_ptr<ReferenceRunner> MakeRunner<ReferenceRunner>(
    SimulatedClock* clock) {
  return std::make_unique<ReferenceRunner>(clock);
}

// Destroyed without having run (cancelled, dropped, refused), it reports
// its id.
class Tracker {
 public:
  using Report = void (*)(void* to, int64_t id);
  Tracker(Report report, void* to, int64_t id)
      : report_(report), to_(to), id_(id) {}
  Tracker(Tracker&& other) noexcept
      : report_(std::exchange(other.report_, nullptr)),
        to_(other.to_),
        id_(other.id_) {}
  Tracker& operator=(Tracker&&) = delete;
  ~Tracker() {
    if (report_ != nullptr) report_(to_, id_);
  }
  void Ran() { report_ = nullptr; }

 private:
  Report report_;
  void* to_;
  int64_t id_;
};

// ---------------------------------------------------------------------------
// Manual mode: one thread, everything deterministic.

enum class Kind {
  kRan,
  kThrew,
  kRefused,   // a = id, b = status code
  kCancel,    // a = timer id, b = result
  kIdle,      // a = RunUntilIdle's result, b = 1 when nested in an event
  kStop,      // a = 1 when inside an event
  kStart,     // b = status code
  kRunStats,  // a = events_run, b = events_threw
  kTimerStats,
  kDropStats,
};

struct Entry {
  Kind kind;
  int64_t a = 0;
  int64_t b = 0;
  bool operator==(const Entry&) const = default;
};

std::string ToString(const Entry& e) {
  static constexpr const char* kNames[] = {
      "ran",
      "threw",
      "refused",
      "cancel",
      "idle",
      "stop",
      "start",
      "stats run/threw",
      "stats fired/cancelled",
      "stats timers_dropped/events_dropped"};
  return absl::StrCat(kNames[static_cast<int>(e.kind)], " ", e.a, " ", e.b);
}

struct ManualOutcome {
  std::vector<Entry> trace;
  std::vector<int64_t> not_run;  // Sorted.
};

template <class R>
class ManualWorkload {
 public:
  static constexpr int kMaxDepth = 4;

  explicit ManualWorkload(uint64_t seed)
      : seed_(seed), runner_(MakeRunner<R>(&clock_)) {
    Rng rng(seed ^ 0x5eed);
    stop_in_events_ = rng.Percent(30);
    nested_idle_ = rng.Percent(30);
  }

  ManualOutcome Run() {
    Rng rng(seed_);
    const int64_t steps = 50 + rng.Below(250);
    // Half the workloads stop part way and go on posting, cancelling and
    // running (all refused or no-ops).
    const int64_t stop_at = rng.Percent(50) ? rng.Below(steps) : steps;
    for (int64_t i = 0; i < steps; ++i) {
      if (i == stop_at) Stop(0);
      const int64_t r = rng.Below(100);
      if (r < 33) {
        PostEvent(0);
      } else if (r < 53) {
        PostTimer(rng, 0);
      } else if (r < 63) {
        Cancel(rng);
      } else if (r < 78) {
        Log(Kind::kIdle, runner_->RunUntilIdle());
      } else if (r < 90) {
        clock_.AdvanceTime(absl::Milliseconds(rng.Below(30)));
      } else if (r < 98) {
        LogStats();
      } else if (r < 99) {
        // Across segment and batch boundaries: more events than a batch.
        for (int64_t n = 500 + rng.Below(1500); n > 0; --n) {
          PostEvent(kMaxDepth - 1);
        }
      } else {
        // Many timers due at once, at a few times (the bulk path that takes
        // them from the heap in one pass and sorts them).
        const int64_t n = 100 + rng.Below(1400);
        const int64_t times = 1 + rng.Below(5);
        for (int64_t k = 0; k < n; ++k) {
          PostTimerAt(clock_.Now() + absl::Milliseconds(rng.Below(times)),
                      kMaxDepth - 1, rng.Percent(50));
        }
      }
    }
    Log(Kind::kIdle, runner_->RunUntilIdle());
    LogStats();
    Stop(0);
    PostEvent(0);
    PostTimer(rng, 0);
    for (int k = 0; k < 3; ++k) Cancel(rng);
    Log(Kind::kIdle, runner_->RunUntilIdle());
    Log(Kind::kStart, 0, static_cast<int64_t>(runner_->Start().code()));
    LogStats();
    runner_.reset();  // Handles outlive the runner: Cancel is false.
    for (int k = 0; k < 3; ++k) Cancel(rng);
    std::sort(not_run_.begin(), not_run_.end());
    return {std::move(trace_), std::move(not_run_)};
  }

 private:
  using Handle = std::remove_cvref_t<decltype(*std::declval<R&>().PostAfter(
      absl::ZeroDuration(), typename R::Event()))>;

  void Log(Kind kind, int64_t a = 0, int64_t b = 0) {
    trace_.push_back(Entry{kind, a, b});
  }

  void LogStats() {
    const RunnerStats s = runner_->stats();
    Log(Kind::kRunStats, s.events_run, s.events_threw);
    Log(Kind::kTimerStats, s.timers_fired, s.timers_cancelled);
    Log(Kind::kDropStats, s.timers_dropped, s.events_dropped);
  }

  static void NotRun(void* to, int64_t id) {
    static_cast<ManualWorkload*>(to)->not_run_.push_back(id);
  }

  typename R::Event MakeEvent(int64_t id, int depth) {
    return [this, t = Tracker(&NotRun, this, id), id, depth]() mutable {
      t.Ran();
      OnRun(id, depth);
    };
  }

  void PostEvent(int depth) {
    const int64_t id = next_id_++;
    absl::Status posted = runner_->Post(MakeEvent(id, depth));
    if (!posted.ok())
      Log(Kind::kRefused, id, static_cast<int64_t>(posted.code()));
  }

  void PostTimer(Rng& rng, int depth) {
    const int64_t r = rng.Below(100);
    absl::Duration delay;
    if (r < 10) {
      delay = -absl::Milliseconds(rng.Below(5));  // Due at once.
    } else if (r < 25) {
      delay = absl::ZeroDuration();
    } else if (r < 70) {
      delay = absl::Milliseconds(1 + rng.Below(20));  // Ties likely.
    } else {
      delay = absl::Microseconds(1 + rng.Below(100'000));
    }
    PostTimerAt(clock_.Now() + delay, depth, rng.Percent(50));
  }

  void PostTimerAt(absl::Time when, int depth, bool after) {
    const int64_t id = next_id_++;
    auto handle =
        after ? runner_->PostAfter(when - clock_.Now(), MakeEvent(id, depth))
              : runner_->PostAt(when, MakeEvent(id, depth));
    if (!handle.ok()) {
      Log(Kind::kRefused, id, static_cast<int64_t>(handle.status().code()));
      return;
    }
    timers_.emplace_back(id, *std::move(handle));
  }

  void Cancel(Rng& rng) {
    if (timers_.empty()) return;
    auto& [id, handle] = timers_[static_cast<size_t>(
        rng.Below(static_cast<int64_t>(timers_.size())))];
    Log(Kind::kCancel, id, handle.Cancel() ? 1 : 0);
  }

  void Stop(int64_t in_event) {
    Log(Kind::kStop, in_event);
    runner_->Stop();
  }

  // What an event does, decided by its own id.
  void OnRun(int64_t id, int depth) {
    Log(Kind::kRan, id);
    Rng rng(seed_ * 1'000'003 + static_cast<uint64_t>(id));
    const int64_t actions = depth < kMaxDepth ? rng.Below(4) : 0;
    for (int64_t a = 0; a < actions; ++a) {
      const int64_t r = rng.Below(100);
      if (r < 40) {
        PostEvent(depth + 1);
      } else if (r < 65) {
        PostTimer(rng, depth + 1);
      } else if (r < 80) {
        Cancel(rng);
      } else if (r < 92) {
        clock_.AdvanceTime(absl::Milliseconds(rng.Below(10)));
      } else if (r < 97) {
        if (nested_idle_) Log(Kind::kIdle, runner_->RunUntilIdle(), 1);
      } else if (stop_in_events_ && rng.Percent(10)) {
        Stop(1);
      }
    }
    if (rng.Percent(5)) {
      Log(Kind::kThrew, id);
      throw std::runtime_error("planned");
    }
  }

  const uint64_t seed_;
  bool stop_in_events_ = false;
  bool nested_idle_ = false;
  SimulatedClock clock_;
  int64_t next_id_ = 1;
  std::vector<std::pair<int64_t, Handle>> timers_;
  std::vector<Entry> trace_;
  std::vector<int64_t> not_run_;
  std::unique_ptr<R> runner_;  // Last: destroyed first.
};

// The first difference of two traces, with a little context.
std::string FirstDifference(const std::vector<Entry>& want,
                            const std::vector<Entry>& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  std::string out =
      absl::StrCat("traces differ at entry ", i, " (reference ", want.size(),
                   " entries, runner ", got.size(), ")\n");
  for (size_t k = i < 5 ? 0 : i - 5; k < i + 5; ++k) {
    absl::StrAppend(&out, k == i ? "> " : "  ", k, ": reference ",
                    k < want.size() ? ToString(want[k]) : "-", " | runner ",
                    k < got.size() ? ToString(got[k]) : "-", "\n");
  }
  return out;
}

TEST(RunnerDifferential, ManualModeTracesEqualTheReference) {
  int64_t entries = 0;
  for (uint64_t seed : Seeds(kManualSeeds, 0)) {
    SCOPED_TRACE(absl::StrCat("seed=", seed,
                              " (replay: SETPOINT_RUNNER_DIFF_SEED=", seed,
                              " --gtest_filter=*ManualMode*)"));
    ManualOutcome want = ManualWorkload<ReferenceRunner>(seed).Run();
    ManualOutcome got = ManualWorkload<Runner>(seed).Run();
    ASSERT_TRUE(want.trace == got.trace)
        << FirstDifference(want.trace, got.trace);
    ASSERT_EQ(want.not_run, got.not_run);
    entries += static_cast<int64_t>(got.trace.size());
  }
  // The workloads did something: on average hundreds of entries per seed.
  EXPECT_GT(entries, 100 * static_cast<int64_t>(Seeds(kManualSeeds, 0).size()));
}

// ---------------------------------------------------------------------------
// Started mode: producer threads, a clock advance, and a Stop racing posts.

constexpr int64_t kIdsPerProducer = 1'000'000;
constexpr int64_t kTimerBase = 500'000;      // Timer ids within a producer.
constexpr int64_t kChildBase = 100'000'000;  // child id = base + 4 * parent + k
constexpr int64_t kMaxRacePosts = 5'000;     // Per producer, racing Stop.

struct TimerRecord {
  int64_t id;
  absl::Duration delay;
  absl::Time when;
  int cancels_true = 0;  // Cancel() calls that returned true.
  int cancels = 0;
};

struct ProducerRecord {
  std::vector<int64_t> accepted;  // Events, in posting order.
  std::vector<int64_t> refused;
  int64_t phase1_events = 0;  // accepted[0, phase1_events) came before Stop.
  size_t phase1_refused = 0;  // Must be 0: nothing stopped the runner yet.
  std::vector<TimerRecord> timers;
  std::vector<int> cancel_results;  // Phase 1, in order.
};

struct StartedOutcome {
  // Deterministic: equal for both runners.
  std::vector<std::vector<int64_t>> phase1_ran;  // Per producer, in order.
  std::vector<int64_t> phase1_timers_ran;        // Sorted.
  std::vector<int64_t> phase1_children_ran;      // Sorted.
  std::vector<std::vector<int>> cancel_results;  // Per producer.
  std::vector<int64_t> quiet_stats;  // At quiescence, before the Stop race.
  // What the rules say about the rest, checked per runner.
  std::vector<std::string> violations;
};

template <class R>
class StartedWorkload {
 public:
  explicit StartedWorkload(uint64_t seed) : seed_(seed) {
    Rng rng(seed);
    producers_ = 2 + static_cast<int>(rng.Below(3));
    ops_ = 50 + rng.Below(kSlowBuild ? 150 : 350);
    advance_ = absl::Milliseconds(rng.Below(120));
    stop_after_ = rng.Below(kSlowBuild ? 300 : 2000);
    ran_.resize(static_cast<size_t>(producers_) + 1);
    records_.resize(static_cast<size_t>(producers_));
    runner_ = MakeRunner<R>(&clock_);
  }

  StartedOutcome Run() {
    StartedOutcome out;
    if (!runner_->Start().ok()) {
      out.violations.push_back("start failed");
      return out;
    }
    using Handle = std::remove_cvref_t<decltype(*runner_->PostAfter(
        absl::ZeroDuration(), typename R::Event()))>;
    std::vector<std::vector<Handle>> handles(static_cast<size_t>(producers_));
    // Phase 1: producers post events and timers and cancel some timers.
    {
      std::vector<std::jthread> threads;
      for (int p = 0; p < producers_; ++p) {
        threads.emplace_back([this, p, &handles] {
          Phase1(p, handles[static_cast<size_t>(p)]);
        });
      }
    }
    const absl::Time start = clock_.Now();
    AwaitQuiet(out, "phase 1");
    // Phase 2: the clock passes some of the timers.
    int64_t due = 0;
    for (const ProducerRecord& rec : records_) {
      for (const TimerRecord& t : rec.timers) {
        if (t.delay > absl::ZeroDuration() && t.delay <= advance_ &&
            t.cancels_true == 0) {
          ++due;
        }
      }
    }
    posted_ += due;
    clock_.AdvanceTime(advance_);
    AwaitQuiet(out, "phase 2");
    {
      const RunnerStats s = runner_->stats();
      out.quiet_stats = {s.events_run,     s.events_threw,
                         s.timers_fired,   s.timers_cancelled,
                         s.timers_dropped, s.events_dropped};
    }
    const int64_t before_race = posted_.load();
    // Phase 3: producers post until refused while Stop() comes.
    {
      std::vector<std::jthread> threads;
      for (int p = 0; p < producers_; ++p) {
        threads.emplace_back([this, p, &handles] {
          Phase3(p, handles[static_cast<size_t>(p)]);
        });
      }
      (void)AwaitCondition(
          [&] { return posted_.load() >= before_race + stop_after_; });
      runner_->Stop();
    }
    Check(out, start + advance_);
    for (int p = 0; p < producers_; ++p) {
      const ProducerRecord& rec = records_[static_cast<size_t>(p)];
      const std::vector<int64_t>& ran = ran_[static_cast<size_t>(p)];
      out.phase1_ran.emplace_back(
          ran.begin(),
          ran.begin() + std::min<int64_t>(rec.phase1_events,
                                          static_cast<int64_t>(ran.size())));
      out.cancel_results.push_back(rec.cancel_results);
    }
    for (int64_t id : timers_ran_) {
      if (id % kIdsPerProducer < kTimerBase + ops_) {
        out.phase1_timers_ran.push_back(id);
      }
    }
    std::sort(out.phase1_timers_ran.begin(), out.phase1_timers_ran.end());
    for (int64_t id : ran_[static_cast<size_t>(producers_)]) {
      if (IsPhase1((id - kChildBase) / 4))
        out.phase1_children_ran.push_back(id);
    }
    std::sort(out.phase1_children_ran.begin(), out.phase1_children_ran.end());
    return out;
  }

 private:
  template <class Handle>
  void Phase1(int p, std::vector<Handle>& handles) {
    ProducerRecord& rec = records_[static_cast<size_t>(p)];
    Rng rng(seed_ * 31 + static_cast<uint64_t>(p));
    const absl::Time start = clock_.Now();  // Nobody moves it meanwhile.
    for (int64_t i = 0; i < ops_; ++i) {
      const int64_t r = rng.Below(100);
      if (r < 70) {
        const int64_t id = p * kIdsPerProducer + i;
        if (Post(id)) {
          rec.accepted.push_back(id);
        } else {
          rec.refused.push_back(id);  // Not expected before Stop.
        }
      } else if (r < 90) {
        const int64_t id = p * kIdsPerProducer + kTimerBase + i;
        // A fifth due at once; the rest within 100 ms, some past the advance.
        const absl::Duration delay =
            rng.Percent(20) ? absl::ZeroDuration()
                            : absl::Milliseconds(1 + rng.Below(100));
        if (!PostTimer(id, delay, handles)) {
          rec.refused.push_back(id);  // Not expected before Stop.
        } else {
          rec.timers.push_back(
              TimerRecord{.id = id, .delay = delay, .when = start + delay});
        }
      } else {
        // Cancel one of this producer's timers not yet due (perhaps again).
        std::vector<size_t> later;
        for (size_t k = 0; k < rec.timers.size(); ++k) {
          if (rec.timers[k].delay > absl::ZeroDuration()) later.push_back(k);
        }
        if (later.empty()) continue;
        const size_t k = later[static_cast<size_t>(
            rng.Below(static_cast<int64_t>(later.size())))];
        const bool cancelled = handles[k].Cancel();
        ++rec.timers[k].cancels;
        rec.timers[k].cancels_true += cancelled ? 1 : 0;
        rec.cancel_results.push_back(cancelled ? 1 : 0);
      }
    }
    rec.phase1_events = static_cast<int64_t>(rec.accepted.size());
    rec.phase1_refused = rec.refused.size();
  }

  template <class Handle>
  void Phase3(int p, std::vector<Handle>& handles) {
    ProducerRecord& rec = records_[static_cast<size_t>(p)];
    Rng rng(seed_ * 37 + static_cast<uint64_t>(p));
    const absl::Time now = clock_.Now();
    // Ids go on after phase 1's; the loop ends at the first refusal (or
    // after a bound, should Stop be late).
    for (int64_t i = ops_; i < ops_ + kMaxRacePosts; ++i) {
      if (rng.Percent(5)) {
        const int64_t id = p * kIdsPerProducer + kTimerBase + i;
        // Due at once (runs: posted before Stop) or an hour away (dropped).
        const absl::Duration delay =
            rng.Percent(50) ? absl::ZeroDuration() : absl::Hours(1);
        if (!PostTimer(id, delay, handles)) {
          rec.refused.push_back(id);
          break;
        }
        rec.timers.push_back(
            TimerRecord{.id = id, .delay = delay, .when = now + delay});
        continue;
      }
      const int64_t id = p * kIdsPerProducer + i;
      if (!Post(id)) {
        rec.refused.push_back(id);
        break;
      }
      rec.accepted.push_back(id);
    }
  }

  bool IsPhase1(int64_t id) const {
    if (id >= kChildBase) return IsPhase1((id - kChildBase) / 4);
    return id % kIdsPerProducer < ops_ ||
           (id % kIdsPerProducer >= kTimerBase &&
            id % kIdsPerProducer < kTimerBase + ops_);
  }

  static void NotRun(void* to, int64_t id) {
    auto* w = static_cast<StartedWorkload*>(to);
    MutexLock l(&w->not_run_mu_);
    w->not_run_.push_back(id);
  }

  // An event or timer `id`: logs itself (runner-only state), may post a
  // child and may throw.
  typename R::Event MakeEvent(int64_t id, bool timer) {
    return [this, t = Tracker(&NotRun, this, id), id, timer]() mutable {
      t.Ran();
      if (id >= kChildBase) {
        ran_[static_cast<size_t>(producers_)].push_back(id);
      } else if (timer) {
        timers_ran_.push_back(id);
      } else {
        ran_[static_cast<size_t>(id / kIdsPerProducer)].push_back(id);
      }
      Rng rng(seed_ * 1'000'003 + static_cast<uint64_t>(id));
      for (int64_t k = 0; id < kChildBase && k < 4; ++k) {
        if (!rng.Percent(8)) continue;
        const int64_t child = kChildBase + 4 * id + k;
        if (Post(child)) {
          children_accepted_.push_back(child);
        } else {
          children_refused_.push_back(child);
        }
      }
      const bool throws = rng.Percent(3);
      if (throws) ++threw_;
      ++done_;
      if (throws) throw std::runtime_error("planned");
    };
  }

  bool Post(int64_t id) {
    // Counted first: quiescence is events_run == posted.
    ++posted_;
    if (runner_->Post(MakeEvent(id, false)).ok()) return true;
    --posted_;
    return false;
  }

  template <class Handle>
  bool PostTimer(int64_t id, absl::Duration delay,
                 std::vector<Handle>& handles) {
    const bool due = delay <= absl::ZeroDuration();
    if (due) ++posted_;
    auto handle = runner_->PostAfter(delay, MakeEvent(id, true));
    if (!handle.ok()) {
      if (due) --posted_;
      return false;
    }
    handles.push_back(*std::move(handle));
    return true;
  }

  void AwaitQuiet(StartedOutcome& out, const char* phase) {
    // Read first: posted_ only grows, and an event is posted before it runs.
    int64_t ran = 0;
    const bool quiet = AwaitCondition([&] {
      ran = runner_->stats().events_run;
      return ran >= posted_.load();
    });
    if (!quiet || ran != posted_.load()) {
      out.violations.push_back(absl::StrCat(phase, ": ran ", ran, " of the ",
                                            posted_.load(), " posted"));
    }
  }

  // The rules, after Stop() (the loop's thread is joined: its state is
  // ours to read).
  void Check(StartedOutcome& out, absl::Time now) {
    auto fail = [&](std::string what) {
      out.violations.push_back(std::move(what));
    };
    int64_t events = 0, timers_due = 0, timers_dropped = 0, cancels = 0;
    std::vector<int64_t> expect_timers, expect_not_run;
    for (int p = 0; p < producers_; ++p) {
      const ProducerRecord& rec = records_[static_cast<size_t>(p)];
      // Each producer's accepted posts ran once each, in its order; the
      // refused never.
      if (ran_[static_cast<size_t>(p)] != rec.accepted) {
        fail(absl::StrCat("producer ", p, ": ran ",
                          ran_[static_cast<size_t>(p)].size(),
                          " events, not its ", rec.accepted.size(),
                          " accepted ones in order"));
      }
      if (rec.phase1_refused != 0) {
        fail(absl::StrCat("producer ", p, ": ", rec.phase1_refused,
                          " posts refused before Stop"));
      }
      events += static_cast<int64_t>(rec.accepted.size());
      expect_not_run.insert(expect_not_run.end(), rec.refused.begin(),
                            rec.refused.end());
      for (const TimerRecord& t : rec.timers) {
        cancels += t.cancels_true;
        if (t.cancels_true > 1 || (t.cancels > 0 && t.cancels_true != 1)) {
          fail(absl::StrCat("timer ", t.id, " not yet due: ", t.cancels,
                            " cancels, ", t.cancels_true, " true"));
        }
        if (t.cancels_true > 0) {
          expect_not_run.push_back(t.id);
        } else if (t.when <= now) {
          expect_timers.push_back(t.id);
          ++timers_due;
        } else {
          expect_not_run.push_back(t.id);
          ++timers_dropped;
        }
      }
    }
    // The runner's own posts (children) likewise.
    if (ran_[static_cast<size_t>(producers_)] != children_accepted_) {
      fail(absl::StrCat(
          "children: ran ", ran_[static_cast<size_t>(producers_)].size(),
          ", not the ", children_accepted_.size(), " accepted in order"));
    }
    events += static_cast<int64_t>(children_accepted_.size());
    expect_not_run.insert(expect_not_run.end(), children_refused_.begin(),
                          children_refused_.end());
    std::vector<int64_t> timers_ran = timers_ran_;
    std::sort(timers_ran.begin(), timers_ran.end());
    std::sort(expect_timers.begin(), expect_timers.end());
    if (timers_ran != expect_timers) {
      fail(absl::StrCat("timers: ", timers_ran.size(), " ran, want the ",
                        expect_timers.size(),
                        " due and not cancelled (cancelled ones never run, "
                        "due ones run before Stop returns)"));
    }
    std::vector<int64_t> not_run;
    {
      MutexLock l(&not_run_mu_);
      not_run = not_run_;
    }
    std::sort(not_run.begin(), not_run.end());
    std::sort(expect_not_run.begin(), expect_not_run.end());
    if (not_run != expect_not_run) {
      fail(absl::StrCat("closures destroyed unrun: ", not_run.size(), ", want ",
                        expect_not_run.size(),
                        " (refused, cancelled, dropped)"));
    }
    const RunnerStats s = runner_->stats();
    const auto want = [&](const char* what, int64_t got, int64_t expected) {
      if (got != expected) {
        fail(absl::StrCat("stats.", what, " = ", got, ", want ", expected));
      }
    };
    want("events_run", s.events_run, events + timers_due);
    want("events_threw", s.events_threw, threw_);
    want("timers_fired", s.timers_fired, timers_due);
    want("timers_cancelled", s.timers_cancelled, cancels);
    want("timers_dropped", s.timers_dropped, timers_dropped);
    want("events_dropped", s.events_dropped, 0);
    want("done", done_, events + timers_due);
  }

  const uint64_t seed_;
  int producers_;
  int64_t ops_;
  absl::Duration advance_;
  int64_t stop_after_;
  SimulatedClock clock_;
  std::atomic<int64_t> posted_{0};
  std::vector<ProducerRecord> records_;  // Each its producer's, then ours.
  // Runner-only (read after Stop).
  std::vector<std::vector<int64_t>> ran_;  // Per producer; the last: children.
  std::vector<int64_t> timers_ran_;
  std::vector<int64_t> children_accepted_;
  std::vector<int64_t> children_refused_;
  int64_t threw_ = 0;
  int64_t done_ = 0;
  Mutex not_run_mu_;
  std::vector<int64_t> not_run_ ABSL_GUARDED_BY(not_run_mu_);
  std::unique_ptr<R> runner_;  // Last: destroyed first.
};

TEST(RunnerDifferential, StartedModeKeepsTheRulesAndEqualsTheReference) {
  for (uint64_t seed : Seeds(kStartedSeeds, 1000)) {
    SCOPED_TRACE(absl::StrCat("seed=", seed,
                              " (replay: SETPOINT_RUNNER_DIFF_SEED=", seed,
                              " --gtest_filter=*StartedMode*)"));
    StartedOutcome want = StartedWorkload<ReferenceRunner>(seed).Run();
    StartedOutcome got = StartedWorkload<Runner>(seed).Run();
    ASSERT_TRUE(want.violations.empty())
        << "reference: " << absl::StrJoin(want.violations, "; ");
    ASSERT_TRUE(got.violations.empty())
        << "runner: " << absl::StrJoin(got.violations, "; ");
    ASSERT_EQ(want.phase1_ran, got.phase1_ran);
    ASSERT_EQ(want.phase1_timers_ran, got.phase1_timers_ran);
    ASSERT_EQ(want.phase1_children_ran, got.phase1_children_ran);
    ASSERT_EQ(want.cancel_results, got.cancel_results);
    ASSERT_EQ(want.quiet_stats, got.quiet_stats);
    ASSERT_FALSE(got.phase1_ran.empty());
  }
}

}  // namespace
}  // namespace setpoint
