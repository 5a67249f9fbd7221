// The chaos harness's analysis: the pods' logs read back, ownership,
// tokens and client calls checked (analyzer.h), recovery and takeover per
// fault, the summary printed (and written as JSON on request), and the
// test's expectations.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "chaos/chaos_harness.h"
#include "gtest/gtest.h"

namespace setpoint::chaos {

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out;
}

// Min / median / max in ms, or "-" for none.
std::string Mmm(const std::vector<int64_t>& v) {
  if (v.empty()) return "-";
  return absl::StrFormat("%.0f/%.0f/%.0f",
                         static_cast<double>(Quantile(v, 0.0)) / kMs,
                         static_cast<double>(Quantile(v, 0.5)) / kMs,
                         static_cast<double>(Quantile(v, 1.0)) / kMs);
}

std::string JsonMmm(const std::vector<int64_t>& v) {
  if (v.empty()) return "null";
  return absl::StrFormat(
      "{\"min_ms\": %.1f, \"median_ms\": %.1f, \"max_ms\": %.1f, \"n\": %d}",
      static_cast<double>(Quantile(v, 0.0)) / kMs,
      static_cast<double>(Quantile(v, 0.5)) / kMs,
      static_cast<double>(Quantile(v, 1.0)) / kMs, static_cast<int>(v.size()));
}

void ChaosHarness::Analyze() {
  const int64_t lease = c_.lease_ms * kMs;
  const int64_t poll = c_.poll_ms * kMs;
  std::vector<PodRecord> recs;
  std::map<std::string, size_t> by_id;
  for (auto& p : pods_) {
    absl::StatusOr<PodLog> log = ReadPodLog(p->log_path);
    EXPECT_TRUE(log.ok()) << log.status();
    PodRecord rec;
    if (log.ok()) rec.log = std::move(*log);
    rec.death = p->death;
    rec.stops = p->stops;
    if (rec.log.pod.empty()) rec.log.pod = p->pod_id;
    EXPECT_EQ(rec.log.pod, p->pod_id);
    if (p->pod_id != p->id) NameIncarnation(&rec.log, p->pod_id, p->id);
    EXPECT_EQ(rec.log.pod, p->id);
    EXPECT_EQ(rec.log.bad_lines, 0) << p->id;
    EXPECT_EQ(rec.log.unmatched, 0) << p->id;
    EXPECT_LT(std::abs(rec.log.clock_offset_ns), 1 * kMs)
        << p->id << ": the manager's clock is not CLOCK_MONOTONIC";
    if (p->death != kNever) {
      EXPECT_LE(rec.log.last_line, p->death)
          << p->id << " logged after its recorded death";
    }
    by_id[p->id] = recs.size();
    recs.push_back(std::move(rec));
  }
  std::vector<Interval> raw, valid, calls;
  std::vector<Grant> grants;
  std::vector<ValidityLapse> lapses;
  for (const PodRecord& r : recs) {
    for (Interval& iv : Intervals(r, Cut::kRaw)) raw.push_back(std::move(iv));
    for (Interval& iv : Intervals(r, Cut::kValidity)) {
      valid.push_back(std::move(iv));
    }
    for (Interval& iv : Intervals(r, Cut::kCalls)) {
      calls.push_back(std::move(iv));
    }
    for (Grant& g : Grants(r)) grants.push_back(std::move(g));
    for (ValidityLapse& l : ValidityLapses(r)) lapses.push_back(std::move(l));
  }
  OwnerCheck by_validity = CheckOneOwner(valid, c_.ring);
  OwnerCheck by_calls = CheckOneOwner(calls, c_.ring);
  std::vector<TokenViolation> tokens = CheckTokens(grants, c_.ring, true);
  std::vector<TokenViolation> tokens_all = CheckTokens(grants, c_.ring, false);
  int64_t effective = 0;
  for (const Grant& g : grants) effective += g.effective ? 1 : 0;
  std::vector<const PodRecord*> rec_ptrs;
  for (const PodRecord& r : recs) rec_ptrs.push_back(&r);
  std::vector<Span> converged = ConvergedSpans(rec_ptrs, raw, c_.ring);
  CallCheck client = CheckClientCalls(rec_ptrs, c_.ring);
  int refusals = 0;
  for (const PodRecord& r : recs) {
    for (const auto& [node, node_calls] : r.log.calls) {
      for (const Call& c : node_calls) refusals += c.refused ? 1 : 0;
    }
  }

  // Per fault: recovery, takeover, cleanliness.
  struct PerFault {
    int64_t recovery = kNever;
    int64_t takeover = -1;  // Max over shards; -1: not measured.
    bool clean = true;
    int untaken = 0;
  };
  std::vector<PerFault> per(faults_.size());
  std::vector<int64_t> graceful_gaps;
  int64_t kill_bound = KillBoundMs() * kMs;
  for (size_t i = 0; i < faults_.size(); ++i) {
    FaultRecord& f = faults_[i];
    if (f.end == 0) f.end = f.start;
    per[i].recovery =
        TimeToConverge(converged, f.end, lease + poll, stopping_at_);
    // Clean: no other fault from a lease before it until its takeover
    // could be measured (a graceful one is fast).
    // A SIGTERM with static membership keeps the places for the successor
    // or until the lease ends: the bound of a kill.
    const bool graceful =
        fault_kinds_[i] == Kind::kPodTerm && !c_.static_membership;
    int64_t tail =
        graceful ? (kGracefulBoundMs + c_.graceful_slack_ms) * kMs : kill_bound;
    Span window = {f.start - lease - poll, f.end + tail};
    for (size_t j = 0; j < faults_.size(); ++j) {
      if (j == i) continue;
      int64_t end = faults_[j].end == 0 ? faults_[j].start : faults_[j].end;
      if (faults_[j].start < window.second && window.first <= end) {
        per[i].clean = false;
      }
    }
    auto it = by_id.find(f.target);
    if (it == by_id.end()) continue;
    const PodRecord& r = recs[it->second];
    std::vector<Takeover> t;
    if (fault_kinds_[i] == Kind::kPodKill) {
      t = KillTakeovers(raw, f.target, r.death);
    } else if (fault_kinds_[i] == Kind::kPodTerm) {
      int64_t term = pods_[it->second]->term_sent;
      t = GracefulTakeovers(raw, f.target, term);
    } else {
      continue;
    }
    for (const Takeover& x : t) {
      if (x.at == kNever) {
        ++per[i].untaken;
        continue;
      }
      per[i].takeover = std::max(per[i].takeover, x.gap());
      if (graceful && per[i].clean) {
        graceful_gaps.push_back(x.gap());
      }
    }
  }

  // --- the summary -----------------------------------------------------------
  std::string out;
  absl::StrAppendFormat(
      &out,
      "\n==== chaos summary: seed=%llu duration=%llds pods=%dx%d ring=%u "
      "lease=%lldms poll=%lldms%s\n",
      static_cast<unsigned long long>(c_.seed),
      static_cast<long long>(c_.seconds), c_.pods, c_.nodes, c_.ring,
      static_cast<long long>(c_.lease_ms), static_cast<long long>(c_.poll_ms),
      c_.static_membership ? " static_membership (SIGTERM bound: the kill's)"
                           : "");
  absl::StrAppendFormat(
      &out,
      "slack: SIGKILL takeover bound (lease+poll)*1.1 + %lldms = %lldms; "
      "graceful bound %lldms + %lldms\n",
      static_cast<long long>(c_.slack_ms),
      static_cast<long long>(KillBoundMs()),
      static_cast<long long>(kGracefulBoundMs),
      static_cast<long long>(c_.graceful_slack_ms));
  absl::StrAppendFormat(&out, "%-28s %5s %7s %24s %24s\n", "fault", "count",
                        "clean", "recovery ms min/med/max",
                        "takeover ms min/med/max");
  std::string json_kinds;
  for (const KindInfo& k : kKinds) {
    int n = 0, clean = 0;
    std::vector<int64_t> rec_v, take_v;
    for (size_t i = 0; i < faults_.size(); ++i) {
      if (fault_kinds_[i] != k.kind) continue;
      ++n;
      clean += per[i].clean ? 1 : 0;
      if (per[i].recovery != kNever) rec_v.push_back(per[i].recovery);
      if (per[i].takeover >= 0) take_v.push_back(per[i].takeover);
    }
    absl::StrAppendFormat(&out, "%-28s %5d %7d %24s %24s\n", k.name, n, clean,
                          Mmm(rec_v), Mmm(take_v));
    absl::StrAppendFormat(&json_kinds,
                          "%s\n    \"%s\": {\"count\": %d, \"clean\": %d, "
                          "\"recovery\": %s, \"takeover\": %s}",
                          json_kinds.empty() ? "" : ",", k.name, n, clean,
                          JsonMmm(rec_v), JsonMmm(take_v));
  }
  absl::StrAppendFormat(&out, "total faults %d, grants %d (%d effective)\n",
                        static_cast<int>(faults_.size()),
                        static_cast<int>(grants.size()),
                        static_cast<int>(effective));
  auto describe = [&](const char* name, const OwnerCheck& check,
                      std::string* json) {
    std::vector<Incident> incidents =
        Incidents(check, faults_, 2 * lease + poll, 200 * kMs);
    absl::StrAppendFormat(
        &out,
        "double ownership (%s): %d overlaps, %.1f shard-ms, %.1f wall-ms, "
        "%d incidents\n",
        name, static_cast<int>(check.overlaps.size()),
        static_cast<double>(check.shard_ns) / kMs,
        static_cast<double>(check.wall_ns) / kMs,
        static_cast<int>(incidents.size()));
    std::string json_inc;
    for (const Incident& inc : incidents) {
      std::vector<std::string> names;
      for (size_t f : inc.faults) {
        names.push_back(absl::StrCat(faults_[f].kind, "(", faults_[f].target,
                                     " at ", Rel(faults_[f].start), ")"));
      }
      absl::StrAppendFormat(
          &out, "  incident %s..%s %.1fms, %d shards, %.1f pair-ms; %s%s\n",
          Rel(inc.from), Rel(inc.to),
          static_cast<double>(inc.to - inc.from) / kMs,
          static_cast<int>(inc.shards.size()),
          static_cast<double>(inc.shard_ns) / kMs,
          inc.faults_are_last_before ? "after (none active) " : "during ",
          names.empty() ? "no fault" : absl::StrJoin(names, ", "));
      for (const Overlap& o : inc.samples) {
        absl::StrAppendFormat(
            &out,
            "    shard %u: %s (token %llu, from %s) and %s (token %llu, from "
            "%s) for %.1fms\n",
            o.shard, o.first.node,
            static_cast<unsigned long long>(o.first.token), Rel(o.first.start),
            o.second.node, static_cast<unsigned long long>(o.second.token),
            Rel(o.second.start), static_cast<double>(o.to - o.from) / kMs);
      }
      absl::StrAppendFormat(
          &json_inc,
          "%s{\"from_s\": %.3f, \"ms\": %.1f, \"shards\": %d, \"faults\": "
          "[%s], \"after_faults\": %s}",
          json_inc.empty() ? "" : ", ",
          static_cast<double>(inc.from - t0_) / 1e9,
          static_cast<double>(inc.to - inc.from) / kMs,
          static_cast<int>(inc.shards.size()),
          absl::StrJoin(names, ", ",
                        [](std::string* o, const std::string& s) {
                          absl::StrAppend(o, "\"", JsonEscape(s), "\"");
                        }),
          inc.faults_are_last_before ? "true" : "false");
    }
    *json = absl::StrFormat(
        "{\"overlaps\": %d, \"shard_ms\": %.1f, \"wall_ms\": %.1f, "
        "\"incidents\": [%s]}",
        static_cast<int>(check.overlaps.size()),
        static_cast<double>(check.shard_ns) / kMs,
        static_cast<double>(check.wall_ns) / kMs, json_inc);
  };
  std::string json_valid, json_calls;
  describe("validity cut", by_validity, &json_valid);
  describe("calls only, SIGSTOP excused", by_calls, &json_calls);
  absl::StrAppendFormat(&out,
                        "token order violations: %d (effective grants), %d "
                        "(all grants)\n",
                        static_cast<int>(tokens.size()),
                        static_cast<int>(tokens_all.size()));
  for (size_t i = 0; i < tokens.size() && i < 5; ++i) {
    const TokenViolation& v = tokens[i];
    absl::StrAppendFormat(
        &out, "  shard %u: %s token %llu at %s, then %s token %llu at %s\n",
        v.shard, v.earlier.node,
        static_cast<unsigned long long>(v.earlier.token), Rel(v.earlier.at),
        v.later.node, static_cast<unsigned long long>(v.later.token),
        Rel(v.later.at));
  }
  int64_t fence_max = 0, fence_max_stopped = 0, gap_max = 0;
  int fences = 0, fences_stopped = 0, gaps = 0;
  for (const ValidityLapse& l : lapses) {
    if (!l.fence()) {
      ++gaps;
      gap_max = std::max(gap_max, l.duration());
    } else if (l.sigstop) {
      ++fences_stopped;
      fence_max_stopped = std::max(fence_max_stopped, l.duration());
    } else {
      ++fences;
      fence_max = std::max(fence_max, l.duration());
    }
  }
  absl::StrAppendFormat(
      &out,
      "fence lateness (last valid_until -> E of the fencing call): max "
      "%.1fms over %d late fences; with SIGSTOP: max %.1fms over %d\n"
      "validity gaps while holding (renewed again without fencing): %d, max "
      "%.1fms\n",
      static_cast<double>(fence_max) / kMs, fences,
      static_cast<double>(fence_max_stopped) / kMs, fences_stopped, gaps,
      static_cast<double>(gap_max) / kMs);
  {
    std::vector<const ValidityLapse*> worst;
    for (const ValidityLapse& l : lapses) {
      if (l.fence() && !l.sigstop) worst.push_back(&l);
    }
    std::sort(worst.begin(), worst.end(),
              [](const ValidityLapse* a, const ValidityLapse* b) {
                return a->duration() > b->duration();
              });
    for (size_t i = 0; i < worst.size() && i < 3; ++i) {
      absl::StrAppendFormat(&out,
                            "  late fence %s: validity lapsed %s, %.1fms\n",
                            worst[i]->node, Rel(worst[i]->lapsed),
                            static_cast<double>(worst[i]->duration()) / kMs);
    }
  }
  {
    std::vector<std::string> codes;
    for (const auto& [code, n] : client.by_code) {
      codes.push_back(absl::StrCat(
          absl::AsciiStrToLower(
              absl::StatusCodeToString(static_cast<absl::StatusCode>(code))),
          " ", n));
    }
    absl::StrAppendFormat(
        &out,
        "client calls: %lld checked (%s), %d violations, %d excused overlaps "
        "(frozen by SIGSTOP, lower token), %lld started inside their grant; "
        "refused handoffs %d\n",
        static_cast<long long>(client.calls), absl::StrJoin(codes, ", "),
        static_cast<int>(client.violations.size()),
        static_cast<int>(client.excused.size()),
        static_cast<long long>(client.started_inside_grant), refusals);
    const char* kind_names[] = {"no assignment", "outside ownership",
                                "foreign token", "overlap"};
    for (size_t i = 0; i < client.violations.size() && i < 5; ++i) {
      const CallViolation& v = client.violations[i];
      absl::StrAppendFormat(&out, "  %s: %s shard %u token %llu %s..%s",
                            kind_names[static_cast<int>(v.kind)], v.call.node,
                            v.call.shard,
                            static_cast<unsigned long long>(v.call.token),
                            Rel(v.call.start), Rel(v.call.end));
      if (v.kind == CallViolation::Kind::kOverlap) {
        absl::StrAppendFormat(&out, " and %s token %llu %s..%s", v.other.node,
                              static_cast<unsigned long long>(v.other.token),
                              Rel(v.other.start), Rel(v.other.end));
      } else if (v.owned.end > v.owned.start) {
        absl::StrAppendFormat(
            &out, " (owned %s..%s)", Rel(v.owned.start),
            v.owned.end == kNever ? std::string("end") : Rel(v.owned.end));
      }
      absl::StrAppendFormat(&out, "\n");
    }
    for (size_t i = 0; i < client.excused.size() && i < 3; ++i) {
      const ExcusedOverlap& e = client.excused[i];
      absl::StrAppendFormat(
          &out,
          "  excused: shard %u, frozen %s token %llu and %s token %llu for "
          "%.1fms at %s\n",
          e.frozen.shard, e.frozen.node,
          static_cast<unsigned long long>(e.frozen.token), e.other.node,
          static_cast<unsigned long long>(e.other.token),
          static_cast<double>(e.to - e.from) / kMs, Rel(e.from));
    }
  }
  absl::StrAppendFormat(
      &out,
      "graceful takeover (clean SIGTERMs, per shard): p50 %.1fms p99 %.1fms "
      "max %.1fms over %d shards\n",
      static_cast<double>(Quantile(graceful_gaps, 0.5)) / kMs,
      static_cast<double>(Quantile(graceful_gaps, 0.99)) / kMs,
      static_cast<double>(Quantile(graceful_gaps, 1.0)) / kMs,
      static_cast<int>(graceful_gaps.size()));
  absl::StrAppendFormat(&out, "faults:\n");
  for (size_t i = 0; i < faults_.size(); ++i) {
    const FaultRecord& f = faults_[i];
    absl::StrAppendFormat(
        &out, "  %s %-26s %-8s %-36s recovery %s takeover %s%s\n", Rel(f.start),
        f.kind, f.target, f.detail,
        per[i].recovery == kNever
            ? std::string("never")
            : absl::StrFormat("%.0fms",
                              static_cast<double>(per[i].recovery) / kMs),
        per[i].takeover < 0
            ? std::string("-")
            : absl::StrFormat("%.0fms",
                              static_cast<double>(per[i].takeover) / kMs),
        per[i].clean ? "" : " (overlapped)");
  }
  std::printf("%s", out.c_str());
  std::fflush(stdout);
  {
    std::ofstream summary(dir_ + "/summary.txt");
    summary << out;
  }

  if (!c_.report.empty()) {
    std::string json_faults;
    for (size_t i = 0; i < faults_.size(); ++i) {
      const FaultRecord& f = faults_[i];
      absl::StrAppendFormat(
          &json_faults,
          "%s\n    {\"kind\": \"%s\", \"target\": \"%s\", \"start_s\": %.3f, "
          "\"end_s\": %.3f, \"detail\": \"%s\", \"clean\": %s, "
          "\"recovery_ms\": %s, \"takeover_ms\": %s}",
          i == 0 ? "" : ",", f.kind, f.target,
          static_cast<double>(f.start - t0_) / 1e9,
          static_cast<double>(f.end - t0_) / 1e9, JsonEscape(f.detail),
          per[i].clean ? "true" : "false",
          per[i].recovery == kNever
              ? std::string("null")
              : absl::StrFormat("%.1f",
                                static_cast<double>(per[i].recovery) / kMs),
          per[i].takeover < 0
              ? std::string("null")
              : absl::StrFormat("%.1f",
                                static_cast<double>(per[i].takeover) / kMs));
    }
    std::ofstream json(c_.report);
    json << absl::StrFormat(
        "{\n  \"seed\": %llu,\n  \"duration_s\": %lld,\n  \"pods\": %d,\n"
        "  \"nodes\": %d,\n  \"ring\": %u,\n  \"lease_ms\": %lld,\n"
        "  \"poll_ms\": %lld,\n  \"slack_ms\": %lld,\n"
        "  \"graceful_slack_ms\": %lld,\n  \"kill_bound_ms\": %lld,\n"
        "  \"faults_by_kind\": {%s\n  },\n  \"grants\": %d,\n"
        "  \"effective_grants\": %d,\n"
        "  \"double_ownership_validity_cut\": %s,\n"
        "  \"double_ownership_calls\": %s,\n"
        "  \"token_violations\": %d,\n  \"token_violations_all\": %d,\n"
        "  \"client_calls\": {\"checked\": %lld, \"violations\": %d, "
        "\"excused\": %d, \"started_inside_grant\": %lld},\n"
        "  \"refused_handoffs\": %d,\n"
        "  \"fence_lateness_max_ms\": %.1f,\n  \"late_fences\": %d,\n"
        "  \"fence_lateness_sigstop_max_ms\": %.1f,\n"
        "  \"validity_gaps\": %d,\n  \"validity_gap_max_ms\": %.1f,\n"
        "  \"graceful_takeover\": {\"p50_ms\": %.1f, \"p99_ms\": %.1f, "
        "\"max_ms\": %.1f, \"shards\": %d},\n"
        "  \"problems\": %d,\n  \"faults\": [%s\n  ]\n}\n",
        static_cast<unsigned long long>(c_.seed),
        static_cast<long long>(c_.seconds), c_.pods, c_.nodes, c_.ring,
        static_cast<long long>(c_.lease_ms), static_cast<long long>(c_.poll_ms),
        static_cast<long long>(c_.slack_ms),
        static_cast<long long>(c_.graceful_slack_ms),
        static_cast<long long>(KillBoundMs()), json_kinds,
        static_cast<int>(grants.size()), static_cast<int>(effective),
        json_valid, json_calls, static_cast<int>(tokens.size()),
        static_cast<int>(tokens_all.size()),
        static_cast<long long>(client.calls),
        static_cast<int>(client.violations.size()),
        static_cast<int>(client.excused.size()),
        static_cast<long long>(client.started_inside_grant), refusals,
        static_cast<double>(fence_max) / kMs, fences,
        static_cast<double>(fence_max_stopped) / kMs, gaps,
        static_cast<double>(gap_max) / kMs,
        static_cast<double>(Quantile(graceful_gaps, 0.5)) / kMs,
        static_cast<double>(Quantile(graceful_gaps, 0.99)) / kMs,
        static_cast<double>(Quantile(graceful_gaps, 1.0)) / kMs,
        static_cast<int>(graceful_gaps.size()),
        static_cast<int>(problems_.size()), json_faults);
  }

  // --- the checks ------------------------------------------------------------
  // (a), (b), (c) and (f): the tests assert them on the outcome.
  outcome_ = {
      .analysed = true,
      .overlaps_validity = static_cast<int64_t>(by_validity.overlaps.size()),
      .overlaps_calls = static_cast<int64_t>(by_calls.overlaps.size()),
      .token_violations = static_cast<int64_t>(tokens.size()),
      .client_calls = client.calls,
      .client_violations = static_cast<int64_t>(client.violations.size()),
  };
  for (size_t i = 0; i < faults_.size(); ++i) {
    if (fault_kinds_[i] == Kind::kPodKill) {
      EXPECT_EQ(per[i].untaken, 0)
          << "(d) shards of " << faults_[i].target << " never taken over";
      if (per[i].clean && per[i].takeover >= 0) {
        EXPECT_LE(per[i].takeover, kill_bound)
            << "(d) takeover after SIGKILL of " << faults_[i].target << " at "
            << Rel(faults_[i].start);
      }
    }
    if (fault_kinds_[i] == Kind::kPodTerm && per[i].clean) {
      EXPECT_EQ(per[i].untaken, 0)
          << "(d) shards of " << faults_[i].target << " never taken over";
      if (c_.static_membership && per[i].takeover >= 0) {
        EXPECT_LE(per[i].takeover, kill_bound)
            << "(d) takeover after SIGTERM of " << faults_[i].target
            << " with static membership at " << Rel(faults_[i].start);
      }
    }
  }
  if (!graceful_gaps.empty()) {
    EXPECT_LE(Quantile(graceful_gaps, 1.0),
              (kGracefulBoundMs + c_.graceful_slack_ms) * kMs)
        << "(d) graceful takeover";
  }
  ::testing::Test::RecordProperty("double_owned_shard_ms_validity",
                                  std::to_string(by_validity.shard_ns / kMs));
  ::testing::Test::RecordProperty("double_owned_shard_ms_calls",
                                  std::to_string(by_calls.shard_ns / kMs));
  ::testing::Test::RecordProperty("client_calls_checked",
                                  std::to_string(client.calls));
  ::testing::Test::RecordProperty("client_call_violations",
                                  std::to_string(client.violations.size()));
  ::testing::Test::RecordProperty("client_calls_excused",
                                  std::to_string(client.excused.size()));
}

}  // namespace setpoint::chaos
