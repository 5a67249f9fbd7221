#include "chaos/analyzer.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace setpoint::chaos {
namespace {

template <typename T>
bool Num(absl::string_view s, T* out) {
  return absl::SimpleAtoi(s, out);
}

bool Intersects(const Span& a, const Span& b) {
  return a.first < b.second && b.first < a.second;
}

// Every shard of `b` is in `a`.
bool Covers(const Range& a, const Range& b) { return a.Covers(b); }

// "<begin>-<end>[,<begin>-<end>...]" as the pod logs a call's shards.
bool ParseRuns(absl::string_view text, Range* out) {
  std::vector<ShardRange> runs;
  for (absl::string_view run : absl::StrSplit(text, ',')) {
    std::pair<absl::string_view, absl::string_view> be =
        absl::StrSplit(run, absl::MaxSplits('-', 1));
    ShardRange r;
    if (!Num(be.first, &r.begin) || !Num(be.second, &r.end)) return false;
    runs.push_back(r);
  }
  *out = ShardSet::Of(std::move(runs));
  return true;
}

}  // namespace

PodLog ParsePodLog(std::string_view text) {
  PodLog log;
  size_t pos = 0;
  while (true) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) break;  // Incomplete last line.
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.empty()) continue;
    std::vector<absl::string_view> f = absl::StrSplit(
        absl::string_view(line.data(), line.size()), ' ', absl::SkipEmpty());
    if (f.empty()) continue;
    bool ok = false;
    int64_t t = 0;
    if (f[0] == "S" && f.size() == 9) {
      ok = Num(f[1], &t) && Num(f[4], &log.nodes) && Num(f[5], &log.ring) &&
           Num(f[6], &log.lease_ms) && Num(f[7], &log.poll_ms) &&
           Num(f[8], &log.clock_offset_ns);
      if (ok) {
        log.started = t;
        log.pod = std::string(f[2]);
      }
    } else if (f[0] == "B" && (f.size() == 5 || f.size() == 6)) {
      // "B <node> <runs> <token> <ns>", or with one run as "<begin> <end>".
      Call c;
      ShardRange one;
      ok = f.size() == 5 ? ParseRuns(f[2], &c.to) && Num(f[3], &c.token) &&
                               Num(f[4], &c.begin)
                         : Num(f[2], &one.begin) && Num(f[3], &one.end) &&
                               Num(f[4], &c.token) && Num(f[5], &c.begin);
      if (f.size() == 6) c.to = one;
      if (ok) {
        t = c.begin;
        std::vector<Call>& calls = log.calls[std::string(f[1])];
        if (!calls.empty() && calls.back().end == kNever) ++log.unmatched;
        calls.push_back(c);
      }
    } else if ((f[0] == "E" && f.size() == 3) ||
               (f[0] == "F" && f.size() == 4)) {
      int code = 0;
      ok = Num(f[2], &t) && (f.size() == 3 || Num(f[3], &code));
      if (ok) {
        auto it = log.calls.find(std::string(f[1]));
        if (it == log.calls.end() || it->second.empty() ||
            it->second.back().end != kNever) {
          ++log.unmatched;
        } else {
          it->second.back().end = t;
          it->second.back().refused = f[0] == "F";
          it->second.back().code = code;
        }
      }
    } else if (f[0] == "C" && f.size() == 7) {
      ClientCall c;
      c.node = std::string(f[1]);
      ok = Num(f[2], &c.shard) && Num(f[3], &c.token) && Num(f[4], &c.start) &&
           Num(f[5], &c.end) && Num(f[6], &c.code);
      if (ok) {
        t = c.end;
        log.client_calls.push_back(std::move(c));
      }
    } else if (f[0] == "R" && f.size() == 3) {
      Renewal r;
      ok = Num(f[1], &r.at) && Num(f[2], &r.until);
      if (ok) {
        t = r.at;
        log.renewals.push_back(r);
      }
    } else if (f[0] == "T" && f.size() == 3) {
      ok = Num(f[1], &t);
      if (ok) log.stop_requested = t;
    } else if (f[0] == "X" && f.size() == 2) {
      ok = Num(f[1], &t);
      if (ok) log.exited = t;
    }
    if (!ok) {
      ++log.bad_lines;
      continue;
    }
    log.last_line = std::max(log.last_line, t);
  }
  // The protocol thread logs R lines; sort in case a line was written late.
  std::stable_sort(
      log.renewals.begin(), log.renewals.end(),
      [](const Renewal& a, const Renewal& b) { return a.at < b.at; });
  return log;
}

absl::StatusOr<PodLog> ReadPodLog(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParsePodLog(ss.str());
}

void NameIncarnation(PodLog* log, const std::string& pod_id,
                     const std::string& label) {
  const std::string prefix = pod_id + "/";
  auto rename = [&](const std::string& node) {
    return node.starts_with(prefix) ? label + node.substr(pod_id.size()) : node;
  };
  log->pod = label;
  std::map<std::string, std::vector<Call>> calls;
  for (auto& [node, list] : log->calls) calls[rename(node)] = std::move(list);
  log->calls = std::move(calls);
  for (ClientCall& c : log->client_calls) c.node = rename(c.node);
}

std::vector<Span> ValiditySpans(const std::vector<Renewal>& renewals) {
  std::vector<Span> spans;
  bool open = false;
  Span cur;
  for (const Renewal& r : renewals) {
    if (open && r.at < cur.second) {
      cur.second = std::max(cur.second, r.until);
      continue;
    }
    if (open) spans.push_back(cur);
    open = r.until > r.at;
    if (open) cur = {r.at, r.until};
  }
  if (open) spans.push_back(cur);
  return spans;
}

int64_t ValidUntil(const std::vector<Span>& spans, int64_t t) {
  auto it =
      std::upper_bound(spans.begin(), spans.end(), t,
                       [](int64_t v, const Span& s) { return v < s.first; });
  if (it == spans.begin()) return t;
  --it;
  return t < it->second ? it->second : t;
}

namespace {

std::vector<Span> FrozenSpans(const PodRecord& rec,
                              const std::vector<Call>& calls,
                              const std::vector<Span>& spans) {
  std::vector<Span> out;
  for (const Span& stop : rec.stops) {
    if (ValidUntil(spans, stop.first) > stop.second) continue;  // Valid.
    int64_t until = kNever;
    for (const Call& c : calls) {
      if (c.to.Empty() && !c.refused && c.end != kNever &&
          c.end >= stop.second) {
        until = c.end;
        break;
      }
    }
    for (const Span& v : spans) {
      if (v.first >= stop.second) {
        until = std::min(until, v.first);
        break;
      }
    }
    out.push_back({stop.first, until});
  }
  return out;
}

}  // namespace

std::vector<Span> FrozenSpans(const PodRecord& rec, const std::string& node) {
  auto it = rec.log.calls.find(node);
  if (it == rec.log.calls.end()) return {};
  return FrozenSpans(rec, it->second, ValiditySpans(rec.log.renewals));
}

std::vector<Interval> Intervals(const PodRecord& rec, Cut cut) {
  const std::vector<Span> spans = ValiditySpans(rec.log.renewals);
  std::vector<Interval> out;
  for (const auto& [node, calls] : rec.log.calls) {
    std::vector<Interval> ivs;
    // The shards the node holds: since when, under which token, and when
    // the granting call returned.
    struct Open {
      int64_t since;
      uint64_t token;
      int64_t granted;
    };
    std::map<uint32_t, Open> open;
    for (const Call& c : calls) {
      for (const ShardRange& r : c.to.runs()) {
        for (uint32_t s = r.begin; s < r.end; ++s) {
          if (!open.contains(s)) open[s] = {c.begin, c.token, c.end};
        }
      }
      if (c.refused) continue;  // Takes nothing away.
      for (auto it = open.begin(); it != open.end();) {
        if (c.to.Contains(it->first)) {
          ++it;
          continue;
        }
        ivs.push_back({rec.log.pod, node, it->first, it->second.token,
                       it->second.since, c.end, it->second.granted});
        it = open.erase(it);
      }
    }
    for (const auto& [s, o] : open) {
      ivs.push_back(
          {rec.log.pod, node, s, o.token, o.since, kNever, o.granted});
    }
    // Spans excluded from this node's ownership (Cut::kCalls): from a
    // SIGSTOP that outlived the validity until the node's fence returned,
    // or until the pod reported validity again, whichever came first (a
    // pod that resumes without fencing owns again from its renewal).
    std::vector<Span> excluded;
    if (cut == Cut::kCalls) excluded = FrozenSpans(rec, calls, spans);
    for (Interval iv : ivs) {
      iv.end = std::min(iv.end, rec.death);
      if (cut == Cut::kValidity) {
        iv.end = std::min(iv.end, ValidUntil(spans, iv.start));
      }
      std::vector<Interval> pieces = {iv};
      for (const Span& ex : excluded) {
        std::vector<Interval> next;
        for (const Interval& p : pieces) {
          // Only what the node held when it was stopped.
          if (p.start >= ex.first || p.end <= ex.first) {
            next.push_back(p);
            continue;
          }
          Interval a = p;
          a.end = ex.first;
          next.push_back(a);
          if (ex.second < p.end) {
            Interval b = p;
            b.start = ex.second;
            next.push_back(b);
          }
        }
        pieces = std::move(next);
      }
      for (const Interval& p : pieces) {
        if (p.end > p.start) out.push_back(p);
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const Interval& a, const Interval& b) {
    return a.shard != b.shard ? a.shard < b.shard : a.start < b.start;
  });
  return out;
}

OwnerCheck CheckOneOwner(const std::vector<Interval>& intervals,
                         uint32_t ring) {
  OwnerCheck check;
  std::vector<std::vector<const Interval*>> by_shard(ring);
  for (const Interval& iv : intervals) {
    if (iv.shard < ring && iv.end > iv.start) {
      by_shard[iv.shard].push_back(&iv);
    }
  }
  std::vector<Span> windows;
  for (uint32_t s = 0; s < ring; ++s) {
    auto& ivs = by_shard[s];
    std::sort(ivs.begin(), ivs.end(), [](const Interval* a, const Interval* b) {
      return a->start < b->start;
    });
    for (size_t i = 1; i < ivs.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (ivs[j]->end <= ivs[i]->start) continue;
        if (ivs[j]->node == ivs[i]->node && ivs[j]->pod == ivs[i]->pod) {
          continue;
        }
        check.overlaps.push_back({s, *ivs[j], *ivs[i], ivs[i]->start,
                                  std::min(ivs[i]->end, ivs[j]->end)});
      }
    }
    // Time with two or more owners: ends sort before starts at one instant
    // (touching intervals do not overlap).
    std::vector<std::pair<int64_t, int>> ev;
    for (const Interval* iv : ivs) {
      ev.push_back({iv->start, +1});
      ev.push_back({iv->end, -1});
    }
    std::sort(ev.begin(), ev.end());
    int n = 0;
    int64_t since = 0;
    for (const auto& [t, d] : ev) {
      int before = n;
      n += d;
      if (before < 2 && n >= 2) since = t;
      if (before >= 2 && n < 2) {
        check.shard_ns += t - since;
        windows.push_back({since, t});
      }
    }
  }
  std::sort(windows.begin(), windows.end());
  for (const Span& w : windows) {
    if (!check.windows.empty() && w.first <= check.windows.back().second) {
      check.windows.back().second =
          std::max(check.windows.back().second, w.second);
    } else {
      check.windows.push_back(w);
    }
  }
  for (const Span& w : check.windows) check.wall_ns += w.second - w.first;
  return check;
}

std::vector<Grant> Grants(const PodRecord& rec) {
  const std::vector<Span> spans = ValiditySpans(rec.log.renewals);
  std::vector<Grant> out;
  for (const auto& [node, calls] : rec.log.calls) {
    uint64_t token = 0;
    Range cur;
    for (const Call& c : calls) {
      // A refused call is in force only as a grow (the manager keeps it).
      if (c.refused && (c.to.Empty() || !Covers(c.to, cur))) continue;
      cur = c.to;
      if (!c.to.Empty() && c.token != token) {
        out.push_back(
            {rec.log.pod, node, c.to, c.token, c.begin,
             c.begin < rec.death && ValidUntil(spans, c.begin) > c.begin});
      }
      token = c.to.Empty() ? 0 : c.token;
    }
  }
  return out;
}

std::vector<TokenViolation> CheckTokens(const std::vector<Grant>& grants,
                                        uint32_t ring, bool effective_only) {
  std::vector<std::vector<const Grant*>> by_shard(ring);
  for (const Grant& g : grants) {
    if (effective_only && !g.effective) continue;
    for (const ShardRange& r : g.range.runs()) {
      for (uint32_t s = r.begin; s < r.end && s < ring; ++s) {
        by_shard[s].push_back(&g);
      }
    }
  }
  std::vector<TokenViolation> out;
  for (uint32_t s = 0; s < ring; ++s) {
    auto& gs = by_shard[s];
    std::stable_sort(gs.begin(), gs.end(), [](const Grant* a, const Grant* b) {
      return a->at < b->at;
    });
    for (size_t i = 1; i < gs.size(); ++i) {
      if (gs[i]->token <= gs[i - 1]->token) {
        out.push_back({s, *gs[i - 1], *gs[i]});
      }
    }
  }
  return out;
}

CallCheck CheckClientCalls(const std::vector<const PodRecord*>& pods,
                           uint32_t ring) {
  CallCheck out;
  // Per node: its pod, its UpdateShardRange calls, its frozen spans and
  // its raw ownership intervals per shard (sorted by start).
  struct NodeData {
    const PodRecord* pod = nullptr;
    const std::vector<Call>* calls = nullptr;
    std::vector<Span> frozen;
    std::map<uint32_t, std::vector<Interval>> owned;
  };
  std::map<std::string, NodeData> nodes;
  for (const PodRecord* p : pods) {
    const std::vector<Span> spans = ValiditySpans(p->log.renewals);
    for (const auto& [node, calls] : p->log.calls) {
      NodeData& n = nodes[node];
      n.pod = p;
      n.calls = &calls;
      n.frozen = FrozenSpans(*p, calls, spans);
    }
    for (Interval& iv : Intervals(*p, Cut::kRaw)) {
      nodes[iv.node].owned[iv.shard].push_back(std::move(iv));
    }
  }
  struct Ref {
    const PodRecord* pod;
    const ClientCall* call;
    const NodeData* node;
  };
  std::vector<std::vector<Ref>> by_shard(ring);
  for (const PodRecord* p : pods) {
    for (const ClientCall& c : p->log.client_calls) {
      ++out.calls;
      ++out.by_code[c.code];
      CallViolation v{.pod = p->log.pod, .call = c};
      auto n = nodes.find(c.node);
      if (c.node == "-") {
        v.kind = CallViolation::Kind::kNoAssignment;
        out.violations.push_back(std::move(v));
        continue;
      }
      if (n == nodes.end() || n->second.pod != p || c.shard >= ring) {
        v.kind = CallViolation::Kind::kOutsideOwnership;
        out.violations.push_back(std::move(v));
        continue;
      }
      const NodeData& node = n->second;
      by_shard[c.shard].push_back({p, &c, &node});
      const Interval* in = nullptr;
      const Interval* near = nullptr;
      if (auto o = node.owned.find(c.shard); o != node.owned.end()) {
        for (const Interval& iv : o->second) {
          if (iv.start <= c.start && c.end <= iv.end) {
            in = &iv;
            break;
          }
          if (near == nullptr || iv.start <= c.end) near = &iv;
        }
      }
      if (in == nullptr) {
        v.kind = CallViolation::Kind::kOutsideOwnership;
        if (near != nullptr) v.owned = *near;
        out.violations.push_back(std::move(v));
        continue;
      }
      if (c.start < in->granted) ++out.started_inside_grant;
      bool given = false;
      for (const Call& u : *node.calls) {
        if (u.begin > c.start) break;
        given = given || (u.token == c.token && u.to.Contains(c.shard));
      }
      if (!given) {
        v.kind = CallViolation::Kind::kForeignToken;
        v.owned = *in;
        out.violations.push_back(std::move(v));
      }
    }
  }
  // Overlaps per shard: a sweep by start over the calls still running.
  auto frozen_over = [](const Ref& r, int64_t from, int64_t to) {
    for (const Span& f : r.node->frozen) {
      if (f.first <= from && to <= f.second) return true;
    }
    return false;
  };
  for (uint32_t s = 0; s < ring; ++s) {
    std::vector<Ref>& refs = by_shard[s];
    std::sort(refs.begin(), refs.end(), [](const Ref& a, const Ref& b) {
      return a.call->start < b.call->start;
    });
    std::vector<const Ref*> running;
    for (const Ref& b : refs) {
      std::erase_if(
          running, [&](const Ref* a) { return a->call->end <= b.call->start; });
      for (const Ref* a : running) {
        if (a->call->node == b.call->node) continue;
        if (!(b.call->start < a->call->end && a->call->start < b.call->end)) {
          continue;
        }
        int64_t from = b.call->start;
        int64_t to = std::min(a->call->end, b.call->end);
        const Ref* frozen = nullptr;
        const Ref* other = nullptr;
        if (frozen_over(*a, from, to) && a->call->token < b.call->token) {
          frozen = a;
          other = &b;
        } else if (frozen_over(b, from, to) && b.call->token < a->call->token) {
          frozen = &b;
          other = a;
        }
        if (frozen != nullptr) {
          out.excused.push_back({.frozen_pod = frozen->pod->log.pod,
                                 .frozen = *frozen->call,
                                 .other_pod = other->pod->log.pod,
                                 .other = *other->call,
                                 .from = from,
                                 .to = to});
          continue;
        }
        out.violations.push_back({.kind = CallViolation::Kind::kOverlap,
                                  .pod = a->pod->log.pod,
                                  .call = *a->call,
                                  .other_pod = b.pod->log.pod,
                                  .other = *b.call,
                                  .from = from,
                                  .to = to});
      }
      running.push_back(&b);
    }
  }
  return out;
}

namespace {

// The first interval of another pod on `iv`'s shard that starts at or
// after `iv` does.
void FindSuccessor(const std::vector<Interval>& raw, const Interval& iv,
                   Takeover* t) {
  for (const Interval& o : raw) {
    if (o.shard != iv.shard || o.pod == iv.pod || o.start < iv.start) continue;
    if (o.start < t->at) {
      t->at = o.start;
      t->successor = o.node;
    }
  }
}

}  // namespace

std::vector<Takeover> KillTakeovers(const std::vector<Interval>& raw,
                                    const std::string& pod, int64_t death) {
  std::vector<Takeover> out;
  if (death == kNever) return out;
  for (const Interval& iv : raw) {
    if (iv.pod != pod || iv.end != death) continue;
    Takeover t{.shard = iv.shard, .from = death};
    FindSuccessor(raw, iv, &t);
    out.push_back(t);
  }
  return out;
}

std::vector<Takeover> GracefulTakeovers(const std::vector<Interval>& raw,
                                        const std::string& pod, int64_t term) {
  std::vector<Takeover> out;
  for (const Interval& iv : raw) {
    if (iv.pod != pod || iv.end < term || iv.end == kNever) continue;
    Takeover t{.shard = iv.shard, .from = iv.end};
    FindSuccessor(raw, iv, &t);
    out.push_back(t);
  }
  return out;
}

std::vector<Span> ConvergedSpans(const std::vector<const PodRecord*>& pods,
                                 const std::vector<Interval>& raw,
                                 uint32_t ring) {
  enum Kind { kPodStart, kPodDeath, kStart, kEnd };
  struct Ev {
    int64_t t;
    Kind kind;
    int pod;
    int node;
    uint32_t shard;
  };
  std::map<std::string, int> pod_index;
  std::vector<int> pod_nodes;
  std::vector<Ev> ev;
  for (const PodRecord* p : pods) {
    if (p->log.started == kNever) continue;
    int i = static_cast<int>(pod_nodes.size());
    pod_index[p->log.pod] = i;
    pod_nodes.push_back(p->log.nodes);
    ev.push_back({p->log.started, kPodStart, i, -1, 0});
    if (p->death != kNever) ev.push_back({p->death, kPodDeath, i, -1, 0});
  }
  std::map<std::string, int> node_index;
  std::vector<int> node_pod;
  for (const Interval& iv : raw) {
    auto pit = pod_index.find(iv.pod);
    if (pit == pod_index.end() || iv.shard >= ring) continue;
    auto [nit, added] =
        node_index.emplace(iv.node, static_cast<int>(node_pod.size()));
    if (added) node_pod.push_back(pit->second);
    ev.push_back({iv.start, kStart, pit->second, nit->second, iv.shard});
    if (iv.end != kNever) {
      ev.push_back({iv.end, kEnd, pit->second, nit->second, iv.shard});
    }
  }
  std::sort(ev.begin(), ev.end(),
            [](const Ev& a, const Ev& b) { return a.t < b.t; });
  std::vector<int> count(ring, 0), owned(node_pod.size(), 0),
      nonempty(pod_nodes.size(), 0);
  std::vector<bool> live(pod_nodes.size(), false);
  int64_t ones = 0, deficient = 0, live_pods = 0;
  std::vector<Span> out;
  bool conv = false;
  for (size_t i = 0; i < ev.size();) {
    int64_t t = ev[i].t;
    for (; i < ev.size() && ev[i].t == t; ++i) {
      const Ev& e = ev[i];
      switch (e.kind) {
        case kPodStart:
          live[e.pod] = true;
          ++live_pods;
          deficient += pod_nodes[e.pod] - nonempty[e.pod];
          break;
        case kPodDeath:
          live[e.pod] = false;
          --live_pods;
          deficient -= pod_nodes[e.pod] - nonempty[e.pod];
          break;
        case kStart:
        case kEnd: {
          int d = e.kind == kStart ? 1 : -1;
          if (count[e.shard] == 1) --ones;
          count[e.shard] += d;
          if (count[e.shard] == 1) ++ones;
          bool was = owned[e.node] > 0;
          owned[e.node] += d;
          bool is = owned[e.node] > 0;
          if (was != is) {
            nonempty[e.pod] += is ? 1 : -1;
            if (live[e.pod]) deficient += is ? -1 : 1;
          }
          break;
        }
      }
    }
    bool now = live_pods > 0 && ones == ring && deficient == 0;
    if (now && !conv) out.push_back({t, kNever});
    if (!now && conv) out.back().second = t;
    conv = now;
  }
  return out;
}

int64_t TimeToConverge(const std::vector<Span>& converged, int64_t t,
                       int64_t stable_ns, int64_t horizon) {
  for (const Span& s : converged) {
    int64_t from = std::max(s.first, t);
    if (s.second <= from) continue;
    if (s.second < horizon && s.second - from < stable_ns) continue;
    return from - t;
  }
  return kNever;
}

bool OwnedOnceAt(const std::vector<const PodRecord*>& pods, uint32_t ring,
                 int64_t t, bool check_validity, std::string* why) {
  std::vector<int> owners(ring, 0);
  for (const PodRecord* p : pods) {
    if (p->log.started == kNever || p->log.started > t || p->death <= t) {
      continue;
    }
    if (check_validity && ValidUntil(ValiditySpans(p->log.renewals), t) <= t) {
      *why = absl::StrCat("pod ", p->log.pod, " has no valid lease");
      return false;
    }
    std::set<std::string> nonempty;
    for (const Interval& iv : Intervals(*p, Cut::kRaw)) {
      if (iv.start <= t && t < iv.end && iv.shard < ring) {
        ++owners[iv.shard];
        nonempty.insert(iv.node);
      }
    }
    if (static_cast<int>(nonempty.size()) != p->log.nodes) {
      *why = absl::StrCat("pod ", p->log.pod, ": ", nonempty.size(), " of ",
                          p->log.nodes, " nodes hold shards");
      return false;
    }
  }
  for (uint32_t s = 0; s < ring; ++s) {
    if (owners[s] != 1) {
      *why = absl::StrCat("shard ", s, " has ", owners[s], " owners");
      return false;
    }
  }
  return true;
}

std::vector<ValidityLapse> ValidityLapses(const PodRecord& rec) {
  const std::vector<Span> spans = ValiditySpans(rec.log.renewals);
  std::vector<ValidityLapse> out;
  for (const auto& [node, calls] : rec.log.calls) {
    bool holding = false;
    int64_t since = 0;
    for (const Call& c : calls) {
      // A refused call changes nothing but a grow from nothing.
      if (c.refused && (holding || c.to.Empty())) continue;
      if (!holding && !c.to.Empty()) {
        holding = true;
        since = c.begin;
        continue;
      }
      if (!holding || !c.to.Empty()) continue;
      holding = false;
      int64_t fenced = c.end;
      if (fenced == kNever || fenced > rec.death) continue;  // Died inside.
      bool stopped = false;
      for (const Span& s : rec.stops) {
        stopped = stopped || Intersects(s, {since, fenced});
      }
      int64_t t = since;
      while (true) {
        int64_t lapsed = ValidUntil(spans, t);
        if (lapsed >= fenced) break;
        auto next = std::upper_bound(
            spans.begin(), spans.end(), lapsed,
            [](int64_t v, const Span& s) { return v < s.first; });
        ValidityLapse l{.pod = rec.log.pod,
                        .node = node,
                        .lapsed = lapsed,
                        .sigstop = stopped};
        if (next != spans.end() && next->first <= c.begin) {
          l.resumed = next->first;
          out.push_back(l);
          t = next->first;
          continue;
        }
        l.fenced = fenced;
        out.push_back(l);
        break;
      }
    }
  }
  return out;
}

std::vector<Incident> Incidents(const OwnerCheck& check,
                                const std::vector<FaultRecord>& faults,
                                int64_t tail_ns, int64_t merge_gap_ns) {
  std::vector<Incident> out;
  for (const Span& w : check.windows) {
    if (!out.empty() && w.first - out.back().to <= merge_gap_ns) {
      out.back().to = std::max(out.back().to, w.second);
    } else {
      out.push_back({.from = w.first, .to = w.second});
    }
  }
  std::vector<std::set<uint32_t>> shards(out.size());
  std::vector<std::set<std::pair<std::string, std::string>>> pairs(out.size());
  for (const Overlap& o : check.overlaps) {
    auto it = std::upper_bound(
        out.begin(), out.end(), o.from,
        [](int64_t v, const Incident& inc) { return v < inc.from; });
    if (it == out.begin()) continue;
    --it;
    size_t i = static_cast<size_t>(it - out.begin());
    it->shard_ns += o.to - o.from;
    shards[i].insert(o.shard);
    if (it->samples.size() < 4 &&
        pairs[i].insert({o.first.node, o.second.node}).second) {
      it->samples.push_back(o);
    }
  }
  for (size_t i = 0; i < out.size(); ++i) {
    Incident& inc = out[i];
    inc.shards.assign(shards[i].begin(), shards[i].end());
    for (size_t f = 0; f < faults.size(); ++f) {
      if (faults[f].start <= inc.from && inc.from <= faults[f].end + tail_ns) {
        inc.faults.push_back(f);
      }
    }
    if (inc.faults.empty()) {
      for (size_t f = faults.size(); f-- > 0;) {
        if (faults[f].start <= inc.from) {
          inc.faults.push_back(f);
          inc.faults_are_last_before = true;
          break;
        }
      }
    }
  }
  return out;
}

int64_t Quantile(std::vector<int64_t> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double rank = std::ceil(q * static_cast<double>(v.size()));
  size_t i = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return v[std::min(i, v.size() - 1)];
}

}  // namespace setpoint::chaos
