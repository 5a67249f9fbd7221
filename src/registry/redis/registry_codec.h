// Decoding of what the Redis registry's scripts return: strict parsers for
// the values stored in the namespace's keys and for the poll script's reply.
// Private to setpoint::redis; kept apart from the IO so a fuzzer can feed it
// anything.
//
//   absl::StatusOr<uint64_t> token = ParseToken("17");
//   absl::StatusOr<Assignment> held = ParseHeld("0 1024 17");
//
// Thread safety: pure functions.
#ifndef SETPOINT_SRC_REGISTRY_REDIS_REGISTRY_CODEC_H_
#define SETPOINT_SRC_REGISTRY_REDIS_REGISTRY_CODEC_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "registry/redis/redis_client.h"
#include "setpoint/node/node_registry.h"
#include "setpoint/node/shard.h"

namespace setpoint::redis {

// A decimal integer in [0, 2^64-1] with no sign, space or leading '+':
// the only form a token (or a version) takes. kInvalidArgument otherwise.
absl::StatusOr<uint64_t> ParseToken(absl::string_view text);

// "<begin> <end> [<begin> <end> ...] <token>": one or more runs, each
// begin < end, sorted and apart (a held record is never empty), exactly as
// FormatHeld writes them. kInvalidArgument otherwise.
absl::StatusOr<Assignment> ParseHeld(absl::string_view text);
// The runs of `shards` as the scripts take them: "<begin> <end> ..." ("" for
// none).
std::string RunsArg(const ShardSet& shards);
// A held record: RunsArg(a.range) + " <token>".
std::string FormatHeld(const Assignment& a);

// A member id that may get a share of the ring: "<pod>/<kind>/<index>" of
// this kind (index decimal digits), at most 512 bytes, no control bytes or
// spaces.
bool UsableMemberId(absl::string_view id, absl::string_view kind);

// One entry of a kind's change log, "<seq> <op> <#id> <id><value>": op '+'
// a member joined, '-' a member left (and its record went), 'h' the record
// was set to `value`, 'd' the record was dropped. kInvalidArgument when the
// entry is not exactly that.
struct LoggedChange {
  uint64_t seq = 0;
  char op = 0;
  std::string id;
  std::string value;
};
absl::StatusOr<LoggedChange> ParseLoggedChange(absl::string_view entry);

// How the poll answered for one kind. A full view (`changes_only` false):
// the kind's view is in `result`, and `seq` is the change seq it is at
// (nullopt: the view must not be cached, e.g. members beyond the horizon).
// Changes only: `changes` since the seq the caller sent, up to `seq`, and
// the kind's view in `result` holds only the held records of the ids the
// caller renewed (no members).
struct KindAnswer {
  bool changes_only = false;
  std::optional<uint64_t> seq;
  std::vector<LoggedChange> changes = {};
  // Changes only, and some entry did not parse (named in the warnings).
  bool broken = false;
};

// What one poll returned, decoded.
struct DecodedPoll {
  PollResult result;
  std::map<std::string, KindAnswer> answers;
  // The reason the script started a new epoch ("" when it did not).
  std::string new_epoch_reason;
  // Values the script ignored or repaired, one line each, naming the key.
  std::vector<std::string> warnings;
};

// Decodes the poll script's reply for `kinds` (in the order they were
// sent). Members whose held value does not parse are left out of `held`
// and reported in `warnings`; so is a drained pod whose id is not a pod id.
// A drain flag whose time does not parse still drains its pod (reported).
// kInternal naming what was wrong when the reply does not have the
// script's shape.
absl::StatusOr<DecodedPoll> DecodePollReply(
    const RedisReply& reply, const std::vector<std::string>& kinds);

// Decodes the describe script's reply for `kinds` (in the order their keys
// were sent). Whatever does not parse is left out or unknown (held: none;
// ring size, token: 0; drained since: InfinitePast) and reported in
// `warnings`, never an error; kInternal only when the reply does not have
// the script's shape.
absl::StatusOr<RegistryDescription> DecodeDescribeReply(
    const RedisReply& reply, const std::vector<std::string>& kinds);

// The change-log entries a message carries for one kind's log key.
struct NoticeChanges {
  std::string log_key;
  std::vector<LoggedChange> changes = {};
};

// A message on the change channel, "<instance>" then what the script
// logged, "\tc\t<log key>\t<n>\t<entry>..." per log key, then "\tf"
// followed by "\t<kind>\t<b>-<e>,..." pairs (the shards releases freed),
// "\tg" (grants only: nothing freed) or nothing (look again).
struct ParsedNotice {
  // Written by `self` (our own write: no listener needs it, the cache
  // does).
  bool own = false;
  // What it says to a pod that cannot use the changes: `membership` when
  // members came or went or it says nothing more precise.
  ChangeNotice notice = {};
  // The entries, when every one of them parsed; empty otherwise.
  std::vector<NoticeChanges> changes = {};
};
// Never fails: what does not parse is a plain notice without changes.
ParsedNotice ParseNotice(absl::string_view payload, absl::string_view self);

// ParseNotice's notice: nullopt for one from `self`.
std::optional<ChangeNotice> ParseChangeNotice(absl::string_view payload,
                                              absl::string_view self);

}  // namespace setpoint::redis

#endif  // SETPOINT_SRC_REGISTRY_REDIS_REGISTRY_CODEC_H_
