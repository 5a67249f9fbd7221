#include "registry/redis/registry_codec.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace setpoint::redis {
namespace {

// At most this much of a foreign value goes into a message.
constexpr size_t kQuoteMax = 64;

std::string Quote(absl::string_view text) {
  std::string out;
  for (char c : text.substr(0, kQuoteMax)) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f || c == '"' || c == '\\') {
      absl::StrAppend(&out, "\\x", absl::Hex(u, absl::kZeroPad2));
    } else {
      out.push_back(c);
    }
  }
  if (text.size() > kQuoteMax) out += "...";
  return absl::StrCat("\"", out, "\"");
}

bool ParseDecimal(absl::string_view text, uint64_t* out) {
  if (text.empty() || text.size() > 20) return false;
  uint64_t v = 0;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

absl::Status Shape(absl::string_view what) {
  return absl::InternalError(
      absl::StrCat("poll: unexpected reply from the script: ", what));
}

bool IsText(const RedisReply& r) {
  return r.type == RedisReply::Type::kString ||
         r.type == RedisReply::Type::kStatus;
}

// A server time in ms as the scripts write it (decimal, below 2^63 / 1000).
bool ParseMillis(absl::string_view text, absl::Time* out) {
  uint64_t ms = 0;
  if (!ParseDecimal(text, &ms) ||
      ms > static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / 1000)) {
    return false;
  }
  *out = absl::FromUnixMillis(static_cast<int64_t>(ms));
  return true;
}

// The drained hash's HGETALL: pod id -> drain time in ms. An id that is not
// a pod id drains nothing; a time that does not parse still drains (the
// flag is the field; the time only informs). False if not pairs of text.
bool DecodeDrained(const RedisReply& pairs,
                   std::map<std::string, absl::Time>* drained,
                   std::vector<std::string>* warnings) {
  if (pairs.type != RedisReply::Type::kArray || pairs.elements.size() % 2) {
    return false;
  }
  for (size_t i = 0; i + 1 < pairs.elements.size(); i += 2) {
    const RedisReply& pod = pairs.elements[i];
    const RedisReply& since = pairs.elements[i + 1];
    if (!IsText(pod) || !IsText(since)) return false;
    if (absl::Status s = ValidatePodId(pod.str); !s.ok()) {
      warnings->push_back(absl::StrCat("drain flag ", Quote(pod.str),
                                       " does not name a pod and drains "
                                       "nothing: ",
                                       s.message()));
      continue;
    }
    absl::Time at = absl::InfinitePast();
    if (!ParseMillis(since.str, &at)) {
      warnings->push_back(absl::StrCat(
          "drain flag of pod ", Quote(pod.str), " holds ", Quote(since.str),
          ", not a server time in ms; the pod counts as drained all the "
          "same (undrain it to remove the flag)"));
    }
    (*drained)[pod.str] = at;
  }
  return true;
}

// A member id the scripts give a share: "<pod>/<kind>/<index>" of `kind`,
// at most 512 bytes, no control bytes or spaces.
bool IsMemberId(absl::string_view id, absl::string_view kind) {
  if (id.size() > 512) return false;
  for (char c : id) {
    unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f || c == ' ') return false;
  }
  std::vector<absl::string_view> parts = absl::StrSplit(id, '/');
  if (parts.size() != 3 || parts[0].empty() || parts[1] != kind ||
      parts[2].empty()) {
    return false;
  }
  return std::all_of(parts[2].begin(), parts[2].end(), [](char c) {
    return absl::ascii_isdigit(static_cast<unsigned char>(c));
  });
}

// A sorted-set score as Redis prints it: ms as an integer, or a double
// someone else wrote ("inf", "1.5e+20"). Clamped to the representable.
bool ParseScore(absl::string_view text, absl::Time* out) {
  if (ParseMillis(text, out)) return true;
  double v = 0;
  if (!absl::SimpleAtod(text, &v) || std::isnan(v)) return false;
  if (v >= 9e15) {
    *out = absl::InfiniteFuture();
  } else if (v <= 0) {
    *out = absl::InfinitePast();
  } else {
    *out = absl::FromUnixMillis(static_cast<int64_t>(v));
  }
  return true;
}

}  // namespace

// Checked here, not in the poll script: every pod checks its own copy,
// and Redis, which serves them all, does less per poll.
bool UsableMemberId(absl::string_view id, absl::string_view kind) {
  if (id.size() > 512) return false;
  for (char ch : id) {
    auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f || c == ' ') return false;
  }
  // "<pod>/<kind>/<index>" without splitting (every poll checks every id).
  const size_t first = id.find('/');
  if (first == 0 || first == absl::string_view::npos) return false;
  absl::string_view rest = id.substr(first + 1);
  if (rest.size() < kind.size() + 2 || rest.substr(0, kind.size()) != kind ||
      rest[kind.size()] != '/') {
    return false;
  }
  absl::string_view index = rest.substr(kind.size() + 1);
  return !index.empty() && std::all_of(index.begin(), index.end(), [](char c) {
    return c >= '0' && c <= '9';
  });
}

absl::StatusOr<uint64_t> ParseToken(absl::string_view text) {
  uint64_t v = 0;
  if (!ParseDecimal(text, &v)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token ", Quote(text), " is not a decimal integer in [0, 2^64-1]"));
  }
  return v;
}

absl::StatusOr<Assignment> ParseHeld(absl::string_view text) {
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "held value ", Quote(text),
        " is not \"<begin> <end> [<begin> <end> ...] <token>\" with sorted, "
        "non-empty, separate runs"));
  };
  // Decimal words separated by single spaces, no leading zeros: the one
  // spelling FormatHeld writes (the scripts compare records as text).
  std::vector<uint64_t> words;
  size_t i = 0;
  while (i <= text.size()) {
    size_t j = i;
    while (j < text.size() && text[j] != ' ') ++j;
    uint64_t v = 0;
    absl::string_view word = text.substr(i, j - i);
    if (!ParseDecimal(word, &v) || (word.size() > 1 && word[0] == '0')) {
      return bad();
    }
    words.push_back(v);
    i = j + 1;
  }
  if (words.size() < 3 || words.size() % 2 == 0) return bad();
  Assignment a;
  a.token = words.back();
  std::vector<ShardRange> runs;
  runs.reserve(words.size() / 2);
  for (size_t k = 0; k + 1 < words.size(); k += 2) {
    const uint64_t begin = words[k], end = words[k + 1];
    if (begin >= end || end > std::numeric_limits<uint32_t>::max() ||
        (k > 0 && begin <= words[k - 1])) {
      return bad();
    }
    runs.push_back(
        ShardRange{static_cast<uint32_t>(begin), static_cast<uint32_t>(end)});
  }
  a.range = ShardSet::Of(std::move(runs));
  return a;
}

std::string RunsArg(const ShardSet& shards) {
  std::string out;
  for (const ShardRange& r : shards.runs()) {
    absl::StrAppend(&out, out.empty() ? "" : " ", r.begin, " ", r.end);
  }
  return out;
}

std::string FormatHeld(const Assignment& a) {
  return absl::StrCat(RunsArg(a.range), " ", a.token);
}

absl::StatusOr<LoggedChange> ParseLoggedChange(absl::string_view entry) {
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("change ", Quote(entry),
                     " is not \"<seq> <op> <length of id> <id><value>\""));
  };
  LoggedChange c;
  const size_t s1 = entry.find(' ');
  if (s1 == absl::string_view::npos ||
      !ParseDecimal(entry.substr(0, s1), &c.seq) || entry.size() < s1 + 3 ||
      entry[s1 + 2] != ' ') {
    return bad();
  }
  c.op = entry[s1 + 1];
  absl::string_view rest = entry.substr(s1 + 3);
  const size_t s2 = rest.find(' ');
  uint64_t len = 0;
  if (s2 == absl::string_view::npos ||
      !ParseDecimal(rest.substr(0, s2), &len) || len == 0 ||
      len > rest.size() - s2 - 1) {
    return bad();
  }
  c.id = std::string(rest.substr(s2 + 1, len));
  absl::string_view value = rest.substr(s2 + 1 + len);
  if (c.op == 'h') {
    if (value.empty()) return bad();
    c.value = std::string(value);
  } else if ((c.op != '+' && c.op != '-' && c.op != 'd') || !value.empty()) {
    return bad();
  }
  return c;
}

absl::StatusOr<DecodedPoll> DecodePollReply(
    const RedisReply& reply, const std::vector<std::string>& kinds) {
  if (reply.type != RedisReply::Type::kArray) return Shape("not an array");
  const auto& e = reply.elements;
  if (e.size() != 8) {
    return Shape(absl::StrCat(e.size(), " elements, expected 8"));
  }
  for (int i : {0, 1, 2, 3, 4}) {
    if (!IsText(e[i])) return Shape(absl::StrCat("element ", i, " not text"));
  }
  if (e[5].type != RedisReply::Type::kArray ||
      e[5].elements.size() != 4 * kinds.size()) {
    return Shape("views do not match the kinds asked for");
  }
  if (e[6].type != RedisReply::Type::kArray) return Shape("no warning list");
  DecodedPoll out;
  PollResult& result = out.result;
  result.epoch = e[0].str;
  if (result.epoch.empty()) return Shape("empty epoch");
  uint64_t grants_from_ms = 0;
  if (!ParseDecimal(e[1].str, &grants_from_ms) ||
      grants_from_ms >
          static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / 1000)) {
    return Shape(absl::StrCat("grants_from ", Quote(e[1].str)));
  }
  result.grants_from =
      absl::FromUnixMillis(static_cast<int64_t>(grants_from_ms));
  uint64_t now_ms = 0;
  if (!ParseDecimal(e[2].str, &now_ms) ||
      now_ms >
          static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / 1000)) {
    return Shape(absl::StrCat("server time ", Quote(e[2].str)));
  }
  result.server_time = absl::FromUnixMillis(static_cast<int64_t>(now_ms));
  if (!ParseDecimal(e[3].str, &result.version)) {
    return Shape(absl::StrCat("version ", Quote(e[3].str)));
  }
  out.new_epoch_reason = e[4].str;
  for (const RedisReply& w : e[6].elements) {
    if (!IsText(w)) return Shape("a warning that is not text");
    out.warnings.push_back(w.str);
  }
  std::map<std::string, absl::Time> drained;
  if (!DecodeDrained(e[7], &drained, &out.warnings)) {
    return Shape("drained pods are not pairs of text");
  }
  for (const auto& [pod, since] : drained) result.drained.insert(pod);
  for (size_t k = 0; k < kinds.size(); ++k) {
    const RedisReply& mode = e[5].elements[4 * k];
    const RedisReply& seq = e[5].elements[4 * k + 1];
    const RedisReply& members = e[5].elements[4 * k + 2];
    const RedisReply& held = e[5].elements[4 * k + 3];
    if (!IsText(mode) ||
        (mode.str != "f" && mode.str != "d" && mode.str != "o") ||
        !IsText(seq) || members.type != RedisReply::Type::kArray ||
        held.type != RedisReply::Type::kArray ||
        held.elements.size() % 2 != 0) {
      return Shape(absl::StrCat("view of kind ", kinds[k]));
    }
    KindAnswer& answer = out.answers[kinds[k]];
    answer.changes_only = mode.str == "d";
    if (!seq.str.empty()) {
      uint64_t v = 0;
      if (!ParseDecimal(seq.str, &v)) {
        return Shape(
            absl::StrCat("change seq of kind ", kinds[k], " ", Quote(seq.str)));
      }
      answer.seq = v;
    } else if (answer.changes_only) {
      return Shape(
          absl::StrCat("changes of kind ", kinds[k], " without a seq"));
    }
    KindView& view = result.kinds[kinds[k]];
    if (answer.changes_only) {
      for (const RedisReply& c : members.elements) {
        if (!IsText(c)) return Shape(absl::StrCat("change of kind ", kinds[k]));
        absl::StatusOr<LoggedChange> change = ParseLoggedChange(c.str);
        if (!change.ok()) {
          // Someone else's entry: the changes cannot be trusted; the caller
          // reads everything instead.
          out.warnings.push_back(absl::StrCat(
              "kind ", kinds[k], " change log: ", change.status().message()));
          answer.broken = true;
          continue;
        }
        answer.changes.push_back(*std::move(change));
      }
    } else {
      int64_t bad = 0;
      std::vector<std::string> examples;
      for (const RedisReply& m : members.elements) {
        if (!IsText(m)) return Shape(absl::StrCat("member of kind ", kinds[k]));
        if (!UsableMemberId(m.str, kinds[k])) {
          if (++bad <= 3) examples.push_back(Quote(m.str));
          continue;
        }
        view.members.push_back(m.str);
      }
      if (bad > 0) {
        out.warnings.push_back(absl::StrCat(
            "kind ", kinds[k], ": ", bad, " member id(s) are not \"<pod>/",
            kinds[k],
            "/<index>\" and get no shards: ", absl::StrJoin(examples, ", ")));
      }
      std::sort(view.members.begin(), view.members.end());
      view.members.erase(std::unique(view.members.begin(), view.members.end()),
                         view.members.end());
    }
    for (size_t i = 0; i + 1 < held.elements.size(); i += 2) {
      const RedisReply& id = held.elements[i];
      const RedisReply& value = held.elements[i + 1];
      if (!IsText(id) || !IsText(value)) {
        return Shape(absl::StrCat("held entry of kind ", kinds[k]));
      }
      if (!answer.changes_only &&
          !std::binary_search(view.members.begin(), view.members.end(),
                              id.str)) {
        continue;  // Not a live member: the scripts ignore it too.
      }
      absl::StatusOr<Assignment> a = ParseHeld(value.str);
      if (!a.ok()) {
        out.warnings.push_back(absl::StrCat("kind ", kinds[k], " node ",
                                            Quote(id.str), ": ",
                                            a.status().message()));
        continue;
      }
      view.held[id.str] = *a;
    }
  }
  return out;
}

absl::StatusOr<RegistryDescription> DecodeDescribeReply(
    const RedisReply& reply, const std::vector<std::string>& kinds) {
  auto shape = [](absl::string_view what) {
    return absl::InternalError(
        absl::StrCat("describe: unexpected reply from the script: ", what));
  };
  if (reply.type != RedisReply::Type::kArray) return shape("not an array");
  const auto& e = reply.elements;
  if (e.size() != 8) {
    return shape(absl::StrCat(e.size(), " elements, expected 8"));
  }
  for (int i : {0, 1, 2, 3, 4}) {
    if (!IsText(e[i])) return shape(absl::StrCat("element ", i, " not text"));
  }
  if (e[7].type != RedisReply::Type::kArray ||
      e[7].elements.size() != 3 * kinds.size()) {
    return shape("kinds do not match the kinds asked for");
  }
  if (e[6].type != RedisReply::Type::kArray || e[6].elements.size() % 2) {
    return shape("ring sizes are not pairs");
  }
  RegistryDescription d;
  std::vector<std::string>& warnings = d.warnings;
  if (!ParseMillis(e[2].str, &d.server_time)) {
    return shape(absl::StrCat("server time ", Quote(e[2].str)));
  }
  d.epoch = e[0].str;
  if (d.epoch.empty()) {
    warnings.push_back(
        "no epoch: no pod has polled yet (or redis lost its data); the "
        "first poll starts one and refuses grants for one lease");
  } else if (e[4].str != "1") {
    warnings.push_back(
        "the state was written under another redis server run (a restart "
        "or a failover): the next poll starts a new epoch");
  }
  if (!e[1].str.empty() && !ParseMillis(e[1].str, &d.grants_from)) {
    d.grants_from = absl::InfinitePast();
    warnings.push_back(absl::StrCat("grants_from holds ", Quote(e[1].str),
                                    ", not a server time in ms; the next "
                                    "poll resets it to one lease from now"));
  }
  if (!e[3].str.empty() && !ParseDecimal(e[3].str, &d.version)) {
    warnings.push_back(absl::StrCat("version holds ", Quote(e[3].str),
                                    ", not a version; the next poll starts a "
                                    "new epoch"));
  }
  if (!DecodeDrained(e[5], &d.drained, &warnings)) {
    return shape("drained pods are not pairs of text");
  }
  std::map<std::string, std::string> rings;
  for (size_t i = 0; i + 1 < e[6].elements.size(); i += 2) {
    if (!IsText(e[6].elements[i]) || !IsText(e[6].elements[i + 1])) {
      return shape("a ring size that is not text");
    }
    rings[e[6].elements[i].str] = e[6].elements[i + 1].str;
  }
  for (size_t k = 0; k < kinds.size(); ++k) {
    const std::string& name = kinds[k];
    const RedisReply& members = e[7].elements[3 * k];
    const RedisReply& held = e[7].elements[3 * k + 1];
    const RedisReply& token = e[7].elements[3 * k + 2];
    if (members.type != RedisReply::Type::kArray ||
        members.elements.size() % 2 || held.type != RedisReply::Type::kArray ||
        held.elements.size() % 2 || !IsText(token)) {
      return shape(absl::StrCat("kind ", Quote(name)));
    }
    KindDescription& kind = d.kinds[name];
    uint64_t ring = 0;
    auto r = rings.find(name);
    if (r == rings.end() || !ParseDecimal(r->second, &ring) || ring == 0 ||
        ring > std::numeric_limits<uint32_t>::max()) {
      warnings.push_back(
          r == rings.end() || r->second.empty()
              ? absl::StrCat("kind ", Quote(name),
                             ": no ring size recorded (its pods' polls give "
                             "none)")
              : absl::StrCat("kind ", Quote(name), ": ring size ",
                             Quote(r->second), " is not a number of shards"));
      ring = 0;
    }
    kind.ring_size = static_cast<uint32_t>(ring);
    if (!token.str.empty() && !ParseDecimal(token.str, &kind.last_token)) {
      kind.last_token = 0;
      warnings.push_back(absl::StrCat(
          "kind ", Quote(name), ": the token counter holds ", Quote(token.str),
          ", not a token; polls fail until it is repaired"));
    }
    std::map<std::string, const RedisReply*> records;
    for (size_t i = 0; i + 1 < held.elements.size(); i += 2) {
      if (!IsText(held.elements[i]) || !IsText(held.elements[i + 1])) {
        return shape(absl::StrCat("held entry of kind ", Quote(name)));
      }
      records[held.elements[i].str] = &held.elements[i + 1];
    }
    int bad_ids = 0;
    for (size_t i = 0; i + 1 < members.elements.size(); i += 2) {
      const RedisReply& id = members.elements[i];
      const RedisReply& score = members.elements[i + 1];
      if (!IsText(id) || !IsText(score)) {
        return shape(absl::StrCat("member of kind ", Quote(name)));
      }
      MemberDescription m{.id = id.str, .lease_expiry = {}, .held = {}};
      if (!ParseScore(score.str, &m.lease_expiry)) {
        return shape(absl::StrCat("lease of ", Quote(id.str)));
      }
      if (!IsMemberId(id.str, name) && ++bad_ids <= 3) {
        warnings.push_back(absl::StrCat("kind ", Quote(name), ": member ",
                                        Quote(id.str), " is not \"<pod>/", name,
                                        "/<index>\" and gets no shards"));
      }
      auto rec = records.find(id.str);
      if (rec != records.end()) {
        absl::StatusOr<Assignment> a = ParseHeld(rec->second->str);
        if (a.ok()) {
          m.held = *a;
        } else {
          warnings.push_back(absl::StrCat("kind ", Quote(name), " node ",
                                          Quote(id.str), ": ",
                                          a.status().message()));
        }
        records.erase(rec);
      }
      kind.members.push_back(std::move(m));
    }
    if (bad_ids > 3) {
      warnings.push_back(absl::StrCat("kind ", Quote(name), ": ", bad_ids - 3,
                                      " more member ids get no shards"));
    }
    for (const auto& [id, value] : records) {
      warnings.push_back(absl::StrCat("kind ", Quote(name),
                                      ": a held record for ", Quote(id),
                                      ", which is not a member, is ignored"));
    }
    std::sort(kind.members.begin(), kind.members.end(),
              [](const MemberDescription& a, const MemberDescription& b) {
                return a.id < b.id;
              });
  }
  return d;
}

// Reads a change message: nullopt for our own (`self`), a notice of freed
// shards for "<instance>\tf\t<kind>\t<b>-<e>,...", and a plain notice
// (look again) for anything else, including what does not parse.
ParsedNotice ParseNotice(absl::string_view payload, absl::string_view self) {
  std::vector<absl::string_view> parts = absl::StrSplit(payload, '\t');
  ParsedNotice out;
  out.own = parts[0] == self;
  const size_t n = parts.size();
  size_t i = 1;
  bool entries_ok = true, came_or_went = false;
  while (i < n && parts[i] == "c") {
    uint64_t count = 0;
    if (i + 2 >= n || !ParseDecimal(parts[i + 2], &count) ||
        count > n - i - 3) {
      return ParsedNotice{.own = out.own};  // Plain: look again.
    }
    NoticeChanges section{.log_key = std::string(parts[i + 1])};
    for (size_t k = 0; k < count; ++k) {
      absl::StatusOr<LoggedChange> c = ParseLoggedChange(parts[i + 3 + k]);
      if (!c.ok()) {
        entries_ok = false;
        continue;
      }
      came_or_went = came_or_went || c->op == '+' || c->op == '-';
      section.changes.push_back(*std::move(c));
    }
    out.changes.push_back(std::move(section));
    i += 3 + count;
  }
  if (!entries_ok) {
    out.changes.clear();
    came_or_went = true;  // Unknown.
  }
  if (i == n) return out;  // No tail: look again (membership).
  if (parts[i] == "g" && i + 1 == n) {
    out.notice.membership = came_or_went;
    return out;
  }
  if (parts[i] != "f" || n - i - 1 < 2 || (n - i - 1) % 2 != 0) {
    return ParsedNotice{.own = out.own};
  }
  for (size_t k = i + 1; k + 1 < n; k += 2) {
    std::vector<ShardRange> ranges;
    for (absl::string_view r : absl::StrSplit(parts[k + 1], ',')) {
      std::pair<absl::string_view, absl::string_view> be =
          absl::StrSplit(r, absl::MaxSplits('-', 1));
      uint32_t b = 0, e = 0;
      if (!absl::SimpleAtoi(be.first, &b) || !absl::SimpleAtoi(be.second, &e) ||
          b >= e) {
        return ParsedNotice{.own = out.own};
      }
      ranges.push_back(ShardRange{b, e});
    }
    ShardSet& freed = out.notice.freed[std::string(parts[k])];
    freed = freed.Union(ShardSet::Of(std::move(ranges)));
  }
  out.notice.membership = came_or_went;
  return out;
}

std::optional<ChangeNotice> ParseChangeNotice(absl::string_view payload,
                                              absl::string_view self) {
  ParsedNotice parsed = ParseNotice(payload, self);
  if (parsed.own) return std::nullopt;
  return std::move(parsed.notice);
}

}  // namespace setpoint::redis
