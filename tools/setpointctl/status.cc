#include "status.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "setpoint/base/json.h"

namespace setpoint::ctl {
namespace {

std::string Time(absl::Time t) {
  if (t == absl::InfinitePast()) return "unknown";
  if (t == absl::InfiniteFuture()) return "never";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", t, absl::UTCTimeZone());
}

std::string Duration(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return "forever";
  if (d == -absl::InfiniteDuration()) return "-forever";
  if (absl::AbsDuration(d) < absl::Seconds(1)) {
    return absl::StrCat(absl::ToInt64Milliseconds(d), "ms");
  }
  return absl::StrFormat("%.1fs", absl::ToDoubleSeconds(d));
}

std::string Percent(double p) { return absl::StrFormat("%.1f%%", p); }

std::string Ranges(const std::vector<ShardRange>& ranges) {
  return absl::StrJoin(ranges, " ", [](std::string* out, const ShardRange& r) {
    out->append(r.ToString());
  });
}

// Pads each column to its widest cell.
std::string Table(const std::vector<std::vector<std::string>>& rows,
                  const std::string& indent) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()));
    for (size_t i = 0; i < row.size(); ++i) {
      width[i] = std::max(width[i], row[i].size());
    }
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line = indent;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line.append(width[i] - row[i].size() + 2, ' ');
    }
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

void Json(std::string* out, std::string_view s) { AppendJsonString(out, s); }

void JsonTime(std::string* out, absl::Time t) {
  if (t == absl::InfinitePast() || t == absl::InfiniteFuture()) {
    out->append("null");
  } else {
    Json(out, Time(t));
  }
}

void JsonMs(std::string* out, absl::Duration d) {
  if (d == absl::InfiniteDuration() || d == -absl::InfiniteDuration()) {
    out->append("null");
  } else {
    absl::StrAppend(out, absl::ToInt64Milliseconds(d));
  }
}

}  // namespace

Status BuildStatus(const RegistryDescription& d) {
  Status s;
  s.description = d;
  s.warnings = d.warnings;
  std::map<std::string, PodRow> pods;
  for (const auto& [pod, since] : d.drained) {
    PodRow& row = pods[pod];
    row.pod = pod;
    row.drained_since = since;
  }
  for (const auto& [name, kind] : d.kinds) {
    KindRows k;
    k.kind = name;
    k.ring_size = kind.ring_size;
    if (k.ring_size == 0) {
      k.ring_size = kDefaultRingSize;
      k.ring_size_recorded = false;
    }
    k.last_token = kind.last_token;
    std::vector<std::pair<ShardRange, std::string>> held;
    for (const MemberDescription& m : kind.members) {
      NodeRow row;
      row.id = m.id;
      row.pod = std::string(PodOfNodeId(m.id));
      row.lease_left = m.lease_expiry - d.server_time;
      const bool live = m.lease_expiry > d.server_time;
      PodRow& pod = pods[row.pod];
      pod.pod = row.pod;
      if (live) {
        ++pod.nodes;
        if (pod.kinds.empty() || pod.kinds.back().kind != name) {
          pod.kinds.push_back({.kind = name, .nodes = 0, .shards = 0});
        }
        ++pod.kinds.back().nodes;
        if (m.held.has_value()) {
          row.held = m.held;
          row.share_percent = 100.0 * m.held->range.size() / k.ring_size;
          pod.kinds.back().shards += m.held->range.size();
          pod.holds_shards = pod.holds_shards || !m.held->range.Empty();
          for (const ShardRange& r : m.held->range.runs()) {
            held.emplace_back(r, m.id);
          }
        }
      } else {
        row.state = "expired";
      }
      k.nodes.push_back(std::move(row));
    }
    std::sort(held.begin(), held.end(), [](const auto& a, const auto& b) {
      return a.first.begin < b.first.begin;
    });
    uint32_t at = 0;
    for (size_t i = 0; i < held.size(); ++i) {
      const ShardRange& r = held[i].first;
      if (i > 0 && held[i - 1].first.Intersects(r)) {
        s.warnings.push_back(absl::StrCat(
            "kind ", name, ": ", held[i - 1].second, " ",
            held[i - 1].first.ToString(), " and ", held[i].second, " ",
            r.ToString(), " overlap: two owners recorded for the same shards"));
      }
      if (r.begin > at && at < k.ring_size) {
        k.unowned.push_back({at, std::min(r.begin, k.ring_size)});
      }
      at = std::max(at, r.end);
    }
    if (at < k.ring_size) k.unowned.push_back({at, k.ring_size});
    for (const ShardRange& r : k.unowned) k.unowned_shards += r.size();
    s.kinds.push_back(std::move(k));
  }
  bool any_live = false;
  s.all_drained = true;
  for (auto& [id, pod] : pods) {
    const bool drained = d.drained.contains(id);
    if (!drained) {
      pod.state = "active";
    } else if (pod.nodes == 0) {
      pod.state = pod.holds_shards ? "draining" : "drained (no nodes)";
    } else {
      pod.state = pod.holds_shards ? "draining" : "drained";
    }
    if (pod.nodes > 0) {
      any_live = true;
      s.all_drained = s.all_drained && drained;
    }
    s.pods.push_back(pod);
  }
  s.all_drained = any_live && s.all_drained;
  for (KindRows& k : s.kinds) {
    for (NodeRow& row : k.nodes) {
      if (!row.state.empty()) continue;
      row.state = pods[row.pod].state;
    }
  }
  return s;
}

std::string StatusText(const Status& s, const StatusSource& source) {
  const RegistryDescription& d = s.description;
  std::string out =
      absl::StrCat("registry ", source.address, " namespace ", source.ns, "\n");
  if (d.epoch.empty()) {
    absl::StrAppend(&out, "epoch    none yet (no pod has polled)\n");
  } else {
    absl::StrAppend(&out, "epoch    ", d.epoch, "  version ", d.version,
                    "  server time ", Time(d.server_time), "\n");
  }
  if (d.grants_from > d.server_time) {
    absl::StrAppend(&out, "grants   refused until ", Time(d.grants_from), " (",
                    Duration(d.grants_from - d.server_time),
                    " more: the registry's state is new)\n");
  } else if (d.grants_from == absl::InfinitePast()) {
    absl::StrAppend(&out, "grants   refused until unknown\n");
  } else {
    absl::StrAppend(&out, "grants   open (refused until ", Time(d.grants_from),
                    ")\n");
  }
  if (s.all_drained) {
    absl::StrAppend(&out,
                    "drained  EVERY POD: nobody owns anything until one is "
                    "undrained\n");
  }
  for (const KindRows& k : s.kinds) {
    absl::StrAppend(&out, "\nkind ", k.kind, "  ring ", k.ring_size,
                    k.ring_size_recorded ? "" : " (not recorded; assumed)",
                    "  last token ", k.last_token, "\n");
    std::vector<std::vector<std::string>> rows = {
        {"NODE", "POD", "STATE", "RANGE", "SHARE", "TOKEN", "LEASE"}};
    for (const NodeRow& n : k.nodes) {
      rows.push_back(
          {n.id, n.pod, n.state, n.held ? n.held->range.ToString() : "-",
           Percent(n.share_percent), n.held ? absl::StrCat(n.held->token) : "-",
           n.lease_left > absl::ZeroDuration()
               ? Duration(n.lease_left)
               : absl::StrCat("expired ", Duration(-n.lease_left), " ago")});
    }
    if (k.nodes.empty()) {
      absl::StrAppend(&out, "  no nodes\n");
    } else {
      out += Table(rows, "  ");
    }
    if (k.unowned.empty()) {
      absl::StrAppend(&out, "  unowned: none\n");
    } else {
      absl::StrAppend(&out, "  unowned: ", Ranges(k.unowned), " (",
                      k.unowned_shards, " shards, ",
                      Percent(100.0 * k.unowned_shards / k.ring_size), ")\n");
    }
  }
  absl::StrAppend(&out, "\npods\n");
  if (s.pods.empty()) {
    absl::StrAppend(&out, "  none\n");
  } else {
    // One row per pod and kind: shards of two rings do not add up.
    std::vector<std::vector<std::string>> rows = {
        {"POD", "KIND", "STATE", "NODES", "SHARDS", "DRAINED SINCE"}};
    for (const PodRow& p : s.pods) {
      const std::string since =
          p.state == "active" ? "-" : Time(p.drained_since);
      if (p.kinds.empty())
        rows.push_back({p.pod, "-", p.state, "0", "0", since});
      for (const PodKindRow& k : p.kinds) {
        rows.push_back({p.pod, k.kind, p.state, absl::StrCat(k.nodes),
                        absl::StrCat(k.shards), since});
      }
    }
    out += Table(rows, "  ");
  }
  if (!s.warnings.empty()) {
    absl::StrAppend(&out, "\nwarnings\n");
    for (const std::string& w : s.warnings)
      absl::StrAppend(&out, "  ", w, "\n");
  }
  return out;
}

std::string StatusJson(const Status& s, const StatusSource& source) {
  const RegistryDescription& d = s.description;
  std::string out = "{\"address\":";
  Json(&out, source.address);
  out += ",\"namespace\":";
  Json(&out, source.ns);
  out += ",\"epoch\":";
  if (d.epoch.empty()) {
    out += "null";
  } else {
    Json(&out, d.epoch);
  }
  absl::StrAppend(&out, ",\"version\":", d.version, ",\"server_time\":");
  JsonTime(&out, d.server_time);
  out += ",\"grants_refused_until\":";
  JsonTime(&out, d.grants_from);
  out += ",\"grants_refused_for_ms\":";
  JsonMs(&out,
         d.grants_from == absl::InfinitePast()
             ? -absl::InfiniteDuration()
             : std::max(absl::ZeroDuration(), d.grants_from - d.server_time));
  absl::StrAppend(&out, ",\"all_drained\":", s.all_drained ? "true" : "false",
                  ",\"pods\":[");
  for (size_t i = 0; i < s.pods.size(); ++i) {
    const PodRow& p = s.pods[i];
    out += i > 0 ? ",{\"pod\":" : "{\"pod\":";
    Json(&out, p.pod);
    out += ",\"state\":";
    Json(&out, p.state);
    absl::StrAppend(&out,
                    ",\"drained\":", p.state == "active" ? "false" : "true",
                    ",\"drained_since\":");
    JsonTime(&out,
             p.state == "active" ? absl::InfinitePast() : p.drained_since);
    absl::StrAppend(&out, ",\"nodes\":", p.nodes, ",\"kinds\":[");
    for (size_t j = 0; j < p.kinds.size(); ++j) {
      out += j > 0 ? ",{\"kind\":" : "{\"kind\":";
      Json(&out, p.kinds[j].kind);
      absl::StrAppend(&out, ",\"nodes\":", p.kinds[j].nodes,
                      ",\"shards\":", p.kinds[j].shards, "}");
    }
    out += "]}";
  }
  out += "],\"kinds\":[";
  for (size_t i = 0; i < s.kinds.size(); ++i) {
    const KindRows& k = s.kinds[i];
    out += i > 0 ? ",{\"kind\":" : "{\"kind\":";
    Json(&out, k.kind);
    absl::StrAppend(
        &out, ",\"ring_size\":", k.ring_size,
        ",\"ring_size_recorded\":", k.ring_size_recorded ? "true" : "false",
        ",\"last_token\":", k.last_token, ",\"nodes\":[");
    for (size_t j = 0; j < k.nodes.size(); ++j) {
      const NodeRow& n = k.nodes[j];
      out += j > 0 ? ",{\"id\":" : "{\"id\":";
      Json(&out, n.id);
      out += ",\"pod\":";
      Json(&out, n.pod);
      out += ",\"state\":";
      Json(&out, n.state);
      if (n.held.has_value()) {
        absl::StrAppend(&out, ",\"range\":[", n.held->range.Hull().begin, ",",
                        n.held->range.Hull().end,
                        "],\"shards\":", n.held->range.RunsJson(),
                        ",\"token\":", n.held->token);
      } else {
        out += ",\"range\":[0,0],\"shards\":[],\"token\":0";  // Holds nothing.
      }
      absl::StrAppend(
          &out, ",\"share_percent\":", absl::StrFormat("%.3f", n.share_percent),
          ",\"lease_expires_in_ms\":");
      JsonMs(&out, n.lease_left);
      out += "}";
    }
    out += "],\"unowned\":[";
    for (size_t j = 0; j < k.unowned.size(); ++j) {
      absl::StrAppend(&out, j > 0 ? "," : "", "[", k.unowned[j].begin, ",",
                      k.unowned[j].end, "]");
    }
    absl::StrAppend(&out, "],\"unowned_shards\":", k.unowned_shards, "}");
  }
  out += "],\"warnings\":[";
  for (size_t i = 0; i < s.warnings.size(); ++i) {
    if (i > 0) out += ",";
    Json(&out, s.warnings[i]);
  }
  out += "]}\n";
  return out;
}

std::string StatusFingerprint(const Status& s) {
  const RegistryDescription& d = s.description;
  std::string out = absl::StrCat(d.epoch, "|", absl::FormatTime(d.grants_from),
                                 "|", d.grants_from > d.server_time, "\n");
  for (const PodRow& p : s.pods) {
    absl::StrAppend(&out, p.pod, " ", p.state, " ", p.nodes, "\n");
  }
  for (const KindRows& k : s.kinds) {
    absl::StrAppend(&out, k.kind, " ", k.ring_size, "\n");
    for (const NodeRow& n : k.nodes) {
      absl::StrAppend(&out, n.id, " ", n.state, " ",
                      n.held ? n.held->range.ToString() : "-", " ",
                      n.held ? n.held->token : 0, "\n");
    }
  }
  for (const std::string& w : s.warnings) absl::StrAppend(&out, w, "\n");
  return out;
}

std::string ErrorFingerprint(const absl::Status& error) {
  return absl::StrCat("error ", absl::StatusCodeToString(error.code()));
}

}  // namespace setpoint::ctl
