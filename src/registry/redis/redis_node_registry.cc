#include "setpoint/registry/redis_node_registry.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "registry/redis/redis_client.h"
#include "setpoint/base/format.h"
#include "setpoint/base/mutex.h"
#include "spdlog/spdlog.h"

namespace setpoint {
namespace {

using redis::RedisClient;
using redis::RedisReply;
using redis::RedisScript;

// Shared by the scripts: server time in ms, and a type check that refuses
// keys someone else filled with another type (a clear error, not a crash).
constexpr char kPrelude[] = R"lua(
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), t
end
local function wrong_type(key, want)
  local ty = redis.call('TYPE', key)['ok']
  if ty ~= 'none' and ty ~= want then
    return 'SETPOINT_GARBAGE key ' .. key .. ' holds a ' .. ty ..
           ', not a ' .. want .. '; remove it'
  end
  return nil
end
)lua";

// KEYS: epoch, grants_from, then members and held per kind.
// ARGV: lease_ms, fresh epoch id, channel, kinds, then per kind: n, ids...
// Renews the given members, expires dead ones with their held ranges, and
// returns {epoch, grants_from, now, {members, held-pairs, ...}, warnings}.
constexpr char kPollScript[] = R"lua(
local now = now_ms()
local lease = tonumber(ARGV[1])
local changed = false
local warnings = {}
for _, k in ipairs({KEYS[1], KEYS[2]}) do
  local e = wrong_type(k, 'string')
  if e then return redis.error_reply(e) end
end
local epoch = redis.call('GET', KEYS[1])
if not epoch then
  epoch = ARGV[2]
  redis.call('SET', KEYS[1], epoch)
  redis.call('SET', KEYS[2], tostring(now + lease))
  changed = true
end
local gf = tonumber(redis.call('GET', KEYS[2]) or '')
if not gf then
  gf = now + lease
  redis.call('SET', KEYS[2], tostring(gf))
  table.insert(warnings, KEYS[2] .. ' did not parse; grants wait one lease')
end
local views = {}
local ai = 5
for k = 1, tonumber(ARGV[4]) do
  local members, held = KEYS[1 + 2 * k], KEYS[2 + 2 * k]
  local e = wrong_type(members, 'zset') or wrong_type(held, 'hash')
  if e then return redis.error_reply(e) end
  local dead = redis.call('ZRANGEBYSCORE', members, '-inf', now)
  if #dead > 0 then
    redis.call('ZREMRANGEBYSCORE', members, '-inf', now)
    for _, id in ipairs(dead) do redis.call('HDEL', held, id) end
    changed = true
  end
  local n = tonumber(ARGV[ai])
  ai = ai + 1
  for i = 1, n do
    if redis.call('ZADD', members, now + lease, ARGV[ai]) == 1 then
      changed = true
    end
    ai = ai + 1
  end
  table.insert(views, redis.call('ZRANGE', members, 0, -1))
  table.insert(views, redis.call('HGETALL', held))
end
if changed then redis.call('PUBLISH', ARGV[3], 'poll') end
return {epoch, tostring(gf), tostring(now), views, warnings}
)lua";

// KEYS: members, held. ARGV: node, begin, end, channel.
constexpr char kReleaseScript[] = R"lua(
local e = wrong_type(KEYS[2], 'hash')
if e then return redis.error_reply(e) end
local b, en = tonumber(ARGV[2]), tonumber(ARGV[3])
local cur = redis.call('HGET', KEYS[2], ARGV[1])
if not cur then
  if b >= en then return 'OK' end
  return redis.error_reply('SETPOINT_PRECONDITION the node holds nothing')
end
if b >= en then
  redis.call('HDEL', KEYS[2], ARGV[1])
else
  local cb, ce, ct = string.match(cur, '^(%d+) (%d+) (%d+)$')
  if not cb then
    return redis.error_reply('SETPOINT_PRECONDITION held value "' .. cur ..
                             '" does not parse')
  end
  if b < tonumber(cb) or en > tonumber(ce) then
    return redis.error_reply('SETPOINT_PRECONDITION not within the held range [' ..
                             cb .. ',' .. ce .. ')')
  end
  redis.call('HSET', KEYS[2], ARGV[1], b .. ' ' .. en .. ' ' .. ct)
end
redis.call('PUBLISH', ARGV[4], 'release')
return 'OK'
)lua";

// KEYS: members, held, token, grants_from. ARGV: node, begin, end, channel.
// Grants [begin,end) if the node is live, grants are allowed, and no other
// live member holds any of it. Tokens only grow, also across a loss of
// Redis's state: each is at least the server time in microseconds.
constexpr char kGrantScript[] = R"lua(
local now, t = now_ms()
local e = wrong_type(KEYS[1], 'zset') or wrong_type(KEYS[2], 'hash') or
          wrong_type(KEYS[3], 'string') or wrong_type(KEYS[4], 'string')
if e then return redis.error_reply(e) end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) <= now then
  return redis.error_reply('SETPOINT_NOT_MEMBER not a live member (lease expired)')
end
local gf = tonumber(redis.call('GET', KEYS[4]) or '')
if not gf or now < gf then
  return redis.error_reply('SETPOINT_ABORTED grants refused until the registry state is one lease old')
end
local b, en = tonumber(ARGV[2]), tonumber(ARGV[3])
local held = redis.call('HGETALL', KEYS[2])
for i = 1, #held, 2 do
  local id = held[i]
  if id ~= ARGV[1] then
    local s = redis.call('ZSCORE', KEYS[1], id)
    if s and tonumber(s) > now then
      local ob, oe = string.match(held[i + 1], '^(%d+) (%d+) %d+$')
      if not ob then
        return redis.error_reply('SETPOINT_ABORTED held value of ' .. id ..
                                 ' does not parse; treated as holding everything')
      end
      if tonumber(ob) < en and b < tonumber(oe) then
        return redis.error_reply('SETPOINT_ABORTED shards still held by ' .. id ..
                                 ' [' .. ob .. ',' .. oe .. ')')
      end
    end
  end
end
local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', KEYS[3]) or '') or 0
local token = math.max(last + 1, floor)
redis.call('SET', KEYS[3], string.format('%.0f', token))
redis.call('HSET', KEYS[2], ARGV[1], b .. ' ' .. en .. ' ' .. string.format('%.0f', token))
redis.call('PUBLISH', ARGV[4], 'grant')
return string.format('%.0f', token)
)lua";

// KEYS: members, held. ARGV: channel, ids...
constexpr char kDeregisterScript[] = R"lua(
local e = wrong_type(KEYS[1], 'zset') or wrong_type(KEYS[2], 'hash')
if e then return redis.error_reply(e) end
for i = 2, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('HDEL', KEYS[2], ARGV[i])
end
redis.call('PUBLISH', ARGV[1], 'leave')
return 'OK'
)lua";

std::string RandomEpoch() {
  std::random_device rd;
  return absl::StrCat(absl::Hex(rd(), absl::kZeroPad8),
                      absl::Hex(rd(), absl::kZeroPad8));
}

// Maps a script's error reply; `what` names the operation and ids.
absl::Status ScriptError(const std::string& what, const std::string& msg) {
  auto rest = [&](absl::string_view code) {
    return absl::StrCat(what, ": ", msg.substr(code.size() + 1));
  };
  if (absl::StartsWith(msg, "SETPOINT_ABORTED")) {
    return absl::AbortedError(rest("SETPOINT_ABORTED"));
  }
  if (absl::StartsWith(msg, "SETPOINT_PRECONDITION")) {
    return absl::FailedPreconditionError(rest("SETPOINT_PRECONDITION"));
  }
  if (absl::StartsWith(msg, "SETPOINT_NOT_MEMBER")) {
    return absl::FailedPreconditionError(rest("SETPOINT_NOT_MEMBER"));
  }
  if (absl::StartsWith(msg, "SETPOINT_GARBAGE")) {
    return absl::DataLossError(rest("SETPOINT_GARBAGE"));
  }
  return redis::StatusFromErrorReply(what, msg);
}

absl::Status CheckContext(const Context& ctx) { return ctx.Err(); }

}  // namespace

absl::Status ValidateRedisNodeRegistryOptions(
    const RedisNodeRegistryOptions& o) {
  auto invalid = [](const char* field, const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("redis registry options: ", field, " ", what));
  };
  if (absl::StatusOr<redis::RedisEndpoint> e =
          redis::ParseRedisAddress(o.address);
      !e.ok()) {
    return invalid("address", std::string(e.status().message()));
  }
  if (o.db < 0) return invalid("db", absl::StrCat("must be >= 0, got ", o.db));
  if (o.ns.empty()) return invalid("ns", "must not be empty");
  if (o.ns.find_first_of("{}") != std::string::npos) {
    return invalid("ns", "must not contain '{' or '}' (it is a hash tag)");
  }
  if (o.connect_timeout <= absl::ZeroDuration()) {
    return invalid("connect_timeout", "must be > 0");
  }
  if (o.command_timeout <= absl::ZeroDuration()) {
    return invalid("command_timeout", "must be > 0");
  }
  if (!o.username.empty() && o.password.empty()) {
    return invalid("username", "needs a password");
  }
  if (absl::Status s = ValidateBackoffOptions(o.reconnect_backoff); !s.ok()) {
    return invalid("reconnect_backoff", std::string(s.message()));
  }
  return absl::OkStatus();
}

struct RedisNodeRegistry::Impl {
  Impl(redis::RedisEndpoint endpoint, RedisNodeRegistryOptions o)
      : options(std::move(o)),
        logger(options.logger != nullptr ? options.logger
                                         : spdlog::default_logger()),
        prefix(absl::StrCat("{setpoint:", options.ns, "}")),
        channel(prefix + ":changed"),
        client(endpoint, options, logger),
        subscriber(endpoint, options, logger) {}

  std::string Key(const std::string& name) const {
    return absl::StrCat(prefix, ":", name);
  }
  std::string KindKey(const std::string& kind, const char* name) const {
    return absl::StrCat(prefix, ":kind:", kind, ":", name);
  }

  absl::StatusOr<RedisReply> Eval(const Context& ctx, RedisScript& script,
                                  const std::vector<std::string>& keys,
                                  const std::vector<std::string>& args,
                                  const std::string& what) {
    if (absl::Status s = CheckContext(ctx); !s.ok()) return s;
    MutexLock l(&mu);
    absl::StatusOr<RedisReply> reply = client.Eval(script, keys, args);
    if (!reply.ok()) return reply.status();
    if (reply->type == RedisReply::Type::kError) {
      return ScriptError(what, reply->str);
    }
    return reply;
  }

  void Subscribe(std::stop_token stop) {
    bool announced_loss = false;
    while (!stop.stop_requested()) {
      if (!subscriber.connected()) {
        absl::StatusOr<RedisReply> ack =
            subscriber.Command({"SUBSCRIBE", channel});
        if (!ack.ok() || ack->type == RedisReply::Type::kError) {
          subscriber.Disconnect();
          if (!announced_loss) {
            SPDLOG_LOGGER_DEBUG(logger,
                                "registry change channel unavailable, "
                                "polling only: {}",
                                ack.ok() ? ack->str : ack.status().ToString());
            announced_loss = true;
          }
          // The client's reconnect backoff paces the attempts; wait a
          // little so a refused connect does not spin.
          std::mutex m;
          std::condition_variable_any cv;
          std::unique_lock lock(m);
          cv.wait_for(lock, stop, std::chrono::milliseconds(100),
                      [] { return false; });
          continue;
        }
        announced_loss = false;
        Notify();  // Anything may have changed while we were away.
      }
      absl::StatusOr<RedisReply> msg =
          subscriber.ReadPushed(absl::Milliseconds(200));
      if (!msg.ok()) {
        subscriber.Disconnect();
        continue;
      }
      if (msg->type == RedisReply::Type::kArray) Notify();
    }
  }

  void Notify() {
    MutexLock l(&listeners_mu);
    for (auto& [id, listener] : listeners) listener();
  }

  RedisNodeRegistryOptions options;
  std::shared_ptr<spdlog::logger> logger;
  const std::string prefix;
  const std::string channel;
  Mutex mu;
  RedisClient client ABSL_GUARDED_BY(mu);
  // The scripts are only touched inside Eval, under mu (the analysis cannot
  // follow them through the reference Eval takes).
  RedisScript poll{std::string(kPrelude) + kPollScript};
  RedisScript release{std::string(kPrelude) + kReleaseScript};
  RedisScript grant{std::string(kPrelude) + kGrantScript};
  RedisScript deregister{std::string(kPrelude) + kDeregisterScript};

  // Subscriber thread only.
  RedisClient subscriber;
  Mutex listeners_mu;
  std::map<int64_t, std::function<void()>> listeners
      ABSL_GUARDED_BY(listeners_mu);
  int64_t next_listener ABSL_GUARDED_BY(listeners_mu) = 1;
  std::jthread thread ABSL_GUARDED_BY(listeners_mu);  // First listener.
};

absl::StatusOr<std::unique_ptr<RedisNodeRegistry>> RedisNodeRegistry::Create(
    RedisNodeRegistryOptions options) {
  if (absl::Status s = ValidateRedisNodeRegistryOptions(options); !s.ok()) {
    return s;
  }
  absl::StatusOr<redis::RedisEndpoint> endpoint =
      redis::ParseRedisAddress(options.address);
  if (!endpoint.ok()) return endpoint.status();
  return std::unique_ptr<RedisNodeRegistry>(new RedisNodeRegistry(
      std::make_unique<Impl>(*endpoint, std::move(options))));
}

RedisNodeRegistry::RedisNodeRegistry(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

RedisNodeRegistry::~RedisNodeRegistry() {
  if (impl_->thread.joinable()) {
    impl_->thread.request_stop();
    impl_->thread.join();
  }
}

absl::StatusOr<PollResult> RedisNodeRegistry::Poll(const Context& ctx,
                                                   const PollRequest& request) {
  if (request.lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "poll: lease must be > 0, got ", absl::FormatDuration(request.lease)));
  }
  Impl& d = *impl_;
  std::vector<std::string> keys = {d.Key("epoch"), d.Key("grants_from")};
  std::vector<std::string> args = {
      // A new id each time: the one written when Redis comes back empty
      // must differ from every epoch anyone saw before.
      absl::StrCat(absl::ToInt64Milliseconds(request.lease)), RandomEpoch(),
      d.channel, absl::StrCat(request.kinds.size())};
  std::vector<std::string> kinds;
  for (const auto& [kind, ids] : request.kinds) {
    kinds.push_back(kind);
    keys.push_back(d.KindKey(kind, "members"));
    keys.push_back(d.KindKey(kind, "held"));
    args.push_back(absl::StrCat(ids.size()));
    args.insert(args.end(), ids.begin(), ids.end());
  }
  absl::StatusOr<RedisReply> reply = d.Eval(ctx, d.poll, keys, args, "poll");
  if (!reply.ok()) return reply.status();
  const auto& e = reply->elements;
  int64_t grants_from_ms = 0;
  if (reply->type != RedisReply::Type::kArray || e.size() != 5 ||
      e[3].type != RedisReply::Type::kArray ||
      e[3].elements.size() != 2 * kinds.size() ||
      !absl::SimpleAtoi(e[1].str, &grants_from_ms)) {
    return absl::InternalError("poll: unexpected reply shape from the script");
  }
  for (const RedisReply& w : e[4].elements) {
    SPDLOG_LOGGER_WARN(d.logger, "registry data ignored prefix={}: {}",
                       d.prefix, w.str);
  }
  PollResult result;
  result.epoch = e[0].str;
  result.grants_from = absl::FromUnixMillis(grants_from_ms);
  for (size_t k = 0; k < kinds.size(); ++k) {
    KindView& view = result.kinds[kinds[k]];
    for (const RedisReply& m : e[3].elements[2 * k].elements) {
      view.members.push_back(m.str);
    }
    std::sort(view.members.begin(), view.members.end());
    const auto& held = e[3].elements[2 * k + 1].elements;
    for (size_t i = 0; i + 1 < held.size(); i += 2) {
      const std::string& id = held[i].str;
      if (!std::binary_search(view.members.begin(), view.members.end(), id)) {
        continue;  // A stale entry; the scripts ignore it too.
      }
      std::vector<std::string> parts = absl::StrSplit(held[i + 1].str, ' ');
      ShardAssignment a;
      if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &a.range.begin) ||
          !absl::SimpleAtoi(parts[1], &a.range.end) ||
          !absl::SimpleAtoi(parts[2], &a.token)) {
        SPDLOG_LOGGER_WARN(d.logger,
                           "registry held value ignored, it does not parse "
                           "kind={} node={} value=\"{}\"",
                           kinds[k], id, held[i + 1].str);
        continue;
      }
      view.held[id] = a;
    }
  }
  return result;
}

absl::Status RedisNodeRegistry::Release(const Context& ctx,
                                        const std::string& kind,
                                        const std::string& node_id,
                                        ShardRange range) {
  Impl& d = *impl_;
  if (range.Empty()) range = ShardRange{};
  absl::StatusOr<RedisReply> reply = d.Eval(
      ctx, d.release, {d.KindKey(kind, "members"), d.KindKey(kind, "held")},
      {node_id, absl::StrCat(range.begin), absl::StrCat(range.end), d.channel},
      absl::StrCat("release node=", node_id, " range=", range.ToString()));
  return reply.status();
}

absl::StatusOr<uint64_t> RedisNodeRegistry::Grant(const Context& ctx,
                                                  const std::string& kind,
                                                  const std::string& node_id,
                                                  ShardRange target) {
  if (target.Empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("grant node=", node_id, ": empty range"));
  }
  Impl& d = *impl_;
  absl::StatusOr<RedisReply> reply = d.Eval(
      ctx, d.grant,
      {d.KindKey(kind, "members"), d.KindKey(kind, "held"),
       d.KindKey(kind, "token"), d.Key("grants_from")},
      {node_id, absl::StrCat(target.begin), absl::StrCat(target.end),
       d.channel},
      absl::StrCat("grant node=", node_id, " range=", target.ToString()));
  if (!reply.ok()) return reply.status();
  uint64_t token = 0;
  if (!absl::SimpleAtoi(reply->str, &token)) {
    return absl::InternalError(absl::StrCat(
        "grant node=", node_id, ": token \"", reply->str, "\" does not parse"));
  }
  return token;
}

absl::Status RedisNodeRegistry::Deregister(
    const Context& ctx, const std::string& kind,
    const std::vector<std::string>& node_ids) {
  Impl& d = *impl_;
  std::vector<std::string> args = {d.channel};
  args.insert(args.end(), node_ids.begin(), node_ids.end());
  return d
      .Eval(ctx, d.deregister,
            {d.KindKey(kind, "members"), d.KindKey(kind, "held")}, args,
            absl::StrCat("deregister kind=", kind))
      .status();
}

int64_t RedisNodeRegistry::AddChangeListener(std::function<void()> listener) {
  Impl& d = *impl_;
  MutexLock l(&d.listeners_mu);
  int64_t id = d.next_listener++;
  d.listeners.emplace(id, std::move(listener));
  if (!d.thread.joinable()) {
    d.thread = std::jthread([&d](std::stop_token stop) {
      pthread_setname_np(pthread_self(), "sp-registry-sub");
      d.Subscribe(stop);
    });
  }
  return id;
}

void RedisNodeRegistry::RemoveChangeListener(int64_t id) {
  MutexLock l(&impl_->listeners_mu);
  impl_->listeners.erase(id);
}

int64_t RedisNodeRegistry::round_trips() const {
  MutexLock l(&impl_->mu);
  return impl_->client.round_trips();
}

const std::string& RedisNodeRegistry::prefix() const { return impl_->prefix; }

}  // namespace setpoint
