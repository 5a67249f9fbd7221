#include "registry/redis/registry_codec.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
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

}  // namespace

absl::StatusOr<uint64_t> ParseToken(absl::string_view text) {
  uint64_t v = 0;
  if (!ParseDecimal(text, &v)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token ", Quote(text), " is not a decimal integer in [0, 2^64-1]"));
  }
  return v;
}

absl::StatusOr<ShardAssignment> ParseHeld(absl::string_view text) {
  std::vector<absl::string_view> parts = absl::StrSplit(text, ' ');
  ShardAssignment a;
  uint64_t begin = 0, end = 0;
  if (parts.size() != 3 || !ParseDecimal(parts[0], &begin) ||
      !ParseDecimal(parts[1], &end) || !ParseDecimal(parts[2], &a.token) ||
      begin >= end || end > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("held value ", Quote(text),
                     " is not \"<begin> <end> <token>\" with begin < end"));
  }
  a.range =
      ShardRange{static_cast<uint32_t>(begin), static_cast<uint32_t>(end)};
  return a;
}

absl::StatusOr<DecodedPoll> DecodePollReply(
    const RedisReply& reply, const std::vector<std::string>& kinds) {
  if (reply.type != RedisReply::Type::kArray) return Shape("not an array");
  const auto& e = reply.elements;
  if (e.size() != 7) {
    return Shape(absl::StrCat(e.size(), " elements, expected 7"));
  }
  for (int i : {0, 1, 2, 3, 4}) {
    if (!IsText(e[i])) return Shape(absl::StrCat("element ", i, " not text"));
  }
  if (e[5].type != RedisReply::Type::kArray ||
      e[5].elements.size() != 2 * kinds.size()) {
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
  for (size_t k = 0; k < kinds.size(); ++k) {
    const RedisReply& members = e[5].elements[2 * k];
    const RedisReply& held = e[5].elements[2 * k + 1];
    if (members.type != RedisReply::Type::kArray ||
        held.type != RedisReply::Type::kArray ||
        held.elements.size() % 2 != 0) {
      return Shape(absl::StrCat("view of kind ", kinds[k]));
    }
    KindView& view = result.kinds[kinds[k]];
    for (const RedisReply& m : members.elements) {
      if (!IsText(m)) return Shape(absl::StrCat("member of kind ", kinds[k]));
      view.members.push_back(m.str);
    }
    std::sort(view.members.begin(), view.members.end());
    view.members.erase(std::unique(view.members.begin(), view.members.end()),
                       view.members.end());
    for (size_t i = 0; i + 1 < held.elements.size(); i += 2) {
      const RedisReply& id = held.elements[i];
      const RedisReply& value = held.elements[i + 1];
      if (!IsText(id) || !IsText(value)) {
        return Shape(absl::StrCat("held entry of kind ", kinds[k]));
      }
      if (!std::binary_search(view.members.begin(), view.members.end(),
                              id.str)) {
        continue;  // Not a live member: the scripts ignore it too.
      }
      absl::StatusOr<ShardAssignment> a = ParseHeld(value.str);
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

}  // namespace setpoint::redis
