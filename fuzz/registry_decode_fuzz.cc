// libFuzzer target for how the Redis registry reads values back: the poll
// and describe scripts' replies (DecodePollReply, DecodeDescribeReply) and the
// stored token and held values (ParseToken, ParseHeld). Whatever someone else
// wrote into Redis, decoding must return a value or a clear error, never crash,
// and never accept what breaks an invariant the NodeManager relies on.
//
// Input: byte 0 picks the number of kinds (0-2); the rest encodes one
// reply tree (see Read below). The same bytes are also fed to ParseToken,
// ParseHeld and ParseChangeNotice as text.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "registry/redis/registry_codec.h"

namespace {

using setpoint::redis::RedisReply;

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool Done() const { return pos_ >= size_; }
  uint8_t Byte() { return Done() ? 0 : data_[pos_++]; }
  std::string Bytes(size_t n) {
    n = std::min(n, size_ - std::min(pos_, size_));
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }

  // A type byte (mod 6): 0 nil, 1 integer (8 bytes), 2 string, 3 status,
  // 4 error (a length byte, then that many bytes), 5 array (a count byte
  // mod 16, then the elements). Depth is bounded.
  RedisReply Read(int depth) {
    RedisReply r;
    switch (Byte() % 6) {
      case 0:
        r.type = RedisReply::Type::kNil;
        break;
      case 1: {
        r.type = RedisReply::Type::kInteger;
        uint64_t v = 0;
        for (int i = 0; i < 8; ++i) v = (v << 8) | Byte();
        r.integer = static_cast<int64_t>(v);
        break;
      }
      case 2:
      case 3:
      case 4: {
        static constexpr RedisReply::Type kText[] = {RedisReply::Type::kString,
                                                     RedisReply::Type::kStatus,
                                                     RedisReply::Type::kError};
        uint8_t t = data_[pos_ - 1] % 6;
        r.type = kText[t - 2];
        r.str = Bytes(Byte());
        break;
      }
      default: {
        r.type = RedisReply::Type::kArray;
        if (depth >= 6) break;
        int n = Byte() % 16;
        for (int i = 0; i < n && !Done(); ++i) {
          r.elements.push_back(Read(depth + 1));
        }
        break;
      }
    }
    return r;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "invariant broken: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  if (auto token = setpoint::redis::ParseToken(text); token.ok()) {
    // Only decimal digits, and the value reads back the same.
    Check(!text.empty() && text.size() <= 20, "token length");
    Check(text.find_first_not_of("0123456789") == std::string::npos,
          "token digits");
    auto again = setpoint::redis::ParseToken(absl::StrCat(*token));
    Check(again.ok() && *again == *token, "token round trip");
  } else {
    Check(absl::IsInvalidArgument(token.status()), "token error code");
  }
  if (auto held = setpoint::redis::ParseHeld(text); held.ok()) {
    Check(!held->range.Empty(), "held range not empty");
    Check(setpoint::redis::FormatHeld(*held) == text, "held round trip");
  } else {
    Check(absl::IsInvalidArgument(held.status()), "held error code");
  }

  // A change message someone published on our channel: ours or another's;
  // a notice that does not say "look again" says what changed instead
  // (freed shards, or grants only); entries only when every one parsed.
  const setpoint::redis::ParsedNotice parsed =
      setpoint::redis::ParseNotice(text, "self");
  Check(parsed.own == (text.substr(0, text.find('\t')) == "self"),
        "own when written by us");
  Check(parsed.notice.membership || !parsed.notice.freed.empty() ||
            absl::EndsWith(text, "\tg"),
        "notice says what");
  Check(!parsed.notice.view_current, "only the registry knows its cache");
  for (const auto& [kind, ranges] : parsed.notice.freed) {
    Check(!ranges.Empty(), "freed set not empty");
    for (const auto& f : ranges.runs()) {
      Check(f.begin < f.end, "freed run not empty");
    }
  }
  for (const auto& section : parsed.changes) {
    for (const auto& c : section.changes) {
      Check(c.op == '+' || c.op == '-' || c.op == 'h' || c.op == 'd',
            "entry op known");
      Check(!c.id.empty(), "entry id not empty");
      if (c.op == '+' || c.op == '-') {
        Check(parsed.notice.membership, "a join or leave says membership");
      }
    }
  }
  Check(parsed.own ==
            !setpoint::redis::ParseChangeNotice(text, "self").has_value(),
        "only ours is dropped");

  Reader reader(data, size);
  std::vector<std::string> kinds;
  int n = reader.Byte() % 3;
  for (int i = 0; i < n; ++i) kinds.push_back(absl::StrCat("k", i));
  RedisReply reply = reader.Read(0);
  // The same tree as the describe script's reply: a description or a
  // shape error, never a crash.
  if (auto described = setpoint::redis::DecodeDescribeReply(reply, kinds);
      described.ok()) {
    Check(described->kinds.size() == kinds.size(), "one description per kind");
    for (const auto& [kind, k] : described->kinds) {
      for (size_t i = 1; i < k.members.size(); ++i) {
        Check(k.members[i - 1].id <= k.members[i].id, "members sorted");
      }
      for (const auto& m : k.members) {
        Check(!m.held.has_value() || !m.held->range.Empty(),
              "described range not empty");
      }
    }
  } else {
    Check(absl::IsInternal(described.status()), "describe error code");
  }
  auto decoded = setpoint::redis::DecodePollReply(reply, kinds);
  if (!decoded.ok()) {
    Check(absl::IsInternal(decoded.status()), "decode error code");
    return 0;
  }
  const setpoint::PollResult& r = decoded->result;
  Check(!r.epoch.empty(), "epoch present");
  Check(r.kinds.size() == kinds.size(), "one view per kind");
  Check(decoded->answers.size() == kinds.size(), "one answer per kind");
  for (const auto& [kind, view] : r.kinds) {
    for (size_t i = 1; i < view.members.size(); ++i) {
      Check(view.members[i - 1] < view.members[i], "members sorted, unique");
    }
    const setpoint::redis::KindAnswer& answer = decoded->answers.at(kind);
    // Changes only: no members, the caller's records (the cache merges).
    Check(!answer.changes_only || view.members.empty(), "no members");
    Check(!answer.changes_only || answer.seq.has_value(), "changes end at seq");
    for (const auto& [id, a] : view.held) {
      Check(answer.changes_only || std::binary_search(view.members.begin(),
                                                      view.members.end(), id),
            "held only by members");
      Check(!a.range.Empty(), "held range not empty");
    }
    for (const setpoint::redis::LoggedChange& c : answer.changes) {
      Check(!c.id.empty(), "change names an id");
      Check(c.op == '+' || c.op == '-' || c.op == 'h' || c.op == 'd',
            "change op");
      Check((c.op == 'h') == !c.value.empty(), "value only when set");
    }
  }
  return 0;
}
