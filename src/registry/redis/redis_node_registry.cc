#include "setpoint/registry/redis_node_registry.h"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

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
#include "registry/redis/poll_cache.h"
#include "registry/redis/redis_client.h"
#include "registry/redis/registry_codec.h"
#include "registry/redis/registry_scripts.h"
#include "registry/redis/sentinel_resolver.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/format.h"
#include "setpoint/base/mutex.h"
#include "spdlog/spdlog.h"

namespace setpoint {
namespace {

using redis::kDeregisterScript;
using redis::kDescribeScript;
using redis::kDrainScript;
using redis::kGrantScript;
using redis::kHandoffScript;
using redis::kKindsScript;
using redis::kPollScript;
using redis::kPrelude;
using redis::kReleaseScript;
using redis::RedisClient;
using redis::RedisReply;
using redis::RedisScript;

// Describe reads at most this many kinds (the rest are named in a warning).
constexpr size_t kDescribeMaxKinds = 256;

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
  if (o.sentinels.empty()) {
    if (absl::StatusOr<redis::RedisEndpoint> e =
            redis::ParseRedisAddress(o.address);
        !e.ok()) {
      return invalid("address", std::string(e.status().message()));
    }
    if (!o.master_name.empty()) {
      return invalid("master_name", "needs sentinels");
    }
  } else {
    for (const std::string& a : o.sentinels) {
      absl::StatusOr<redis::RedisEndpoint> e = redis::ParseRedisAddress(a);
      if (!e.ok()) {
        return invalid("sentinels", std::string(e.status().message()));
      }
      if (!e->unix_path.empty()) {
        return invalid("sentinels",
                       absl::StrCat("\"", a, "\": a sentinel needs host:port"));
      }
    }
    if (o.master_name.empty()) {
      return invalid("master_name", "must be set with sentinels");
    }
  }
  if (!o.sentinel_username.empty() && o.sentinel_password.empty()) {
    return invalid("sentinel_username", "needs a sentinel_password");
  }
  if (o.grant_wait_replicas < 0) {
    return invalid("grant_wait_replicas",
                   absl::StrCat("must be >= 0, got ", o.grant_wait_replicas));
  }
  if (o.grant_wait_replicas > 0 &&
      (o.grant_wait_timeout <= absl::ZeroDuration() ||
       o.grant_wait_timeout >= o.command_timeout)) {
    return invalid("grant_wait_timeout",
                   "must be > 0 and shorter than command_timeout");
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
  Impl(std::shared_ptr<redis::SentinelResolver> r, RedisNodeRegistryOptions o)
      : options(std::move(o)),
        logger(options.logger != nullptr ? options.logger
                                         : spdlog::default_logger()),
        prefix(absl::StrCat("{setpoint:", options.ns, "}")),
        channel(prefix + ":changed"),
        resolver(std::move(r)),
        client(resolver, options, logger),
        subscriber(resolver, options, logger) {}

  ~Impl() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    // The readers stop before the descriptor they poll is closed.
    sentinel_thread.request_stop();
    thread.request_stop();
    WakeReaders();
    if (sentinel_thread.joinable()) sentinel_thread.join();
    if (thread.joinable()) thread.join();
    if (wake_fd >= 0) close(wake_fd);
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // Wakes the reader threads (the subscriber, the sentinel watch) at once
  // instead of at their next read timeout: a pod's exit waits for them.
  void WakeReaders() {
    if (wake_fd < 0) return;
    const uint64_t one = 1;
    ssize_t n = write(wake_fd, &one, sizeof(one));
    (void)n;  // Readable already (it is never read), or the reads time out.
  }

  std::string Key(const std::string& name) const {
    return absl::StrCat(prefix, ":", name);
  }
  std::string KindKey(const std::string& kind, const char* name) const {
    return absl::StrCat(prefix, ":kind:", kind, ":", name);
  }
  // The keys of a kind the poll and handoff scripts take, in their order.
  void PushKindKeys(const std::string& kind,
                    std::vector<std::string>* keys) const {
    for (const char* name :
         {"members", "held", "token", "changes", "changes_seq"}) {
      keys->push_back(KindKey(kind, name));
    }
  }

  // Runs `script`, waiting at most until the context's deadline (and at
  // most command_timeout): a caller that must act by a deadline is never
  // held past it by a Redis that hangs.
  // With `granted` and grant_wait_replicas > 0: when granted(reply) says
  // the script granted something, WAIT for the replicas on the same
  // connection before returning (kUnavailable when too few acknowledged).
  absl::StatusOr<RedisReply> Eval(
      const Context& ctx, RedisScript& script,
      const std::vector<std::string>& keys,
      const std::vector<std::string>& args, const std::string& what,
      const std::function<bool(const RedisReply&)>& granted = nullptr) {
    if (absl::Status s = CheckContext(ctx); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
    }
    absl::Duration budget = absl::InfiniteDuration();
    if (ctx.deadline() != absl::InfiniteFuture()) {
      budget = ctx.deadline() - ctx.clock()->Now();
      if (budget <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError(
            absl::StrCat(what, ": no time left before the deadline"));
      }
    }
    const absl::Time start = Clock::Monotonic()->Now();
    MutexLock l(&mu);
    absl::StatusOr<RedisReply> reply = client.Eval(script, keys, args, budget);
    if (!reply.ok()) {
      return absl::Status(reply.status().code(),
                          absl::StrCat(what, ": ", reply.status().message()));
    }
    if (reply->type == RedisReply::Type::kError) {
      return ScriptError(what, reply->str);
    }
    if (granted != nullptr && options.grant_wait_replicas > 0 &&
        granted(*reply)) {
      absl::Duration left = budget - (Clock::Monotonic()->Now() - start);
      if (absl::Status s = AwaitReplicas(left, what); !s.ok()) return s;
    }
    return reply;
  }

  // WAIT for grant_wait_replicas on the connection that just wrote.
  absl::Status AwaitReplicas(absl::Duration left, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    // Leave the socket a tenth of the time to carry the answer back.
    absl::Duration wait = std::min(options.grant_wait_timeout, left * 0.9);
    int64_t wait_ms = absl::ToInt64Milliseconds(wait);
    if (wait_ms < 1) {
      return absl::DeadlineExceededError(absl::StrCat(
          what, ": granted, but no time left to wait for a replica"));
    }
    absl::StatusOr<RedisReply> reply =
        client.Command({"WAIT", absl::StrCat(options.grant_wait_replicas),
                        absl::StrCat(wait_ms)},
                       left);
    if (!reply.ok()) {
      return absl::Status(reply.status().code(),
                          absl::StrCat(what, ": granted, then WAIT failed: ",
                                       reply.status().message()));
    }
    if (reply->type == RedisReply::Type::kError) {
      return redis::StatusFromErrorReply(
          absl::StrCat(what, ": granted, then WAIT"), reply->str);
    }
    if (reply->type != RedisReply::Type::kInteger ||
        reply->integer < options.grant_wait_replicas) {
      return absl::UnavailableError(absl::StrCat(
          what, ": granted, but only ", reply->integer, " of ",
          options.grant_wait_replicas, " replicas acknowledged within ",
          absl::FormatDuration(absl::Milliseconds(wait_ms)),
          " (a failover now could lose the grant)"));
    }
    return absl::OkStatus();
  }

  // Follows +switch-master on the sentinels (one at a time, in the
  // resolver's order) and tells the clients and the listeners.
  void WatchSentinels(std::stop_token stop) {
    const std::string& master = resolver->master_name();
    auto pause = [&] {
      std::mutex m;
      std::condition_variable_any cv;
      std::unique_lock lock(m);
      cv.wait_for(lock, stop, std::chrono::milliseconds(100),
                  [] { return false; });
    };
    while (!stop.stop_requested()) {
      for (const redis::RedisEndpoint& sentinel : resolver->sentinels()) {
        if (stop.stop_requested()) return;
        RedisClient c(sentinel, resolver->sentinel_options(), logger);
        absl::StatusOr<RedisReply> ack =
            c.Command({"SUBSCRIBE", "+switch-master"});
        if (!ack.ok() || ack->type == RedisReply::Type::kError) {
          SPDLOG_LOGGER_DEBUG(logger,
                              "sentinel subscription failed sentinel={}: {}",
                              sentinel.ToString(),
                              ack.ok() ? ack->str : ack.status().ToString());
          continue;
        }
        while (!stop.stop_requested()) {
          absl::StatusOr<RedisReply> msg =
              c.ReadPushed(absl::Milliseconds(200), wake_fd);
          if (!msg.ok()) break;
          // ["message", "+switch-master", "<name> <old ip> <old port>
          // <new ip> <new port>"].
          if (msg->type != RedisReply::Type::kArray ||
              msg->elements.size() != 3) {
            continue;
          }
          std::vector<std::string> words =
              absl::StrSplit(msg->elements[2].str, ' ');
          if (words.size() != 5 || words[0] != master) continue;
          SPDLOG_LOGGER_INFO(logger,
                             "redis master switched master={} old={}:{} "
                             "new={}:{} sentinel={}",
                             master, words[1], words[2], words[3], words[4],
                             sentinel.ToString());
          resolver->MasterSwitched();
          Notify();
        }
      }
      pause();
    }
  }

  // Logs `line` at warning level, at most once per kWarnEvery for the same
  // line, with the number of repeats held back.
  void WarnLimited(const std::string& line) {
    absl::Time now = Clock::Monotonic()->Now();
    MutexLock l(&warn_mu);
    if (warned.size() > 256) warned.clear();
    auto [it, fresh] = warned.try_emplace(line, WarnState{now, 0});
    if (!fresh) {
      if (now - it->second.last < kWarnEvery) {
        ++it->second.held_back;
        return;
      }
      it->second.last = now;
    }
    int64_t repeats = it->second.held_back;
    it->second.held_back = 0;
    if (repeats > 0) {
      SPDLOG_LOGGER_WARN(logger,
                         "registry data refused prefix={} repeats={}: {}",
                         prefix, repeats, line);
    } else {
      SPDLOG_LOGGER_WARN(logger, "registry data refused prefix={}: {}", prefix,
                         line);
    }
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
          subscriber.ReadPushed(absl::Milliseconds(200), wake_fd);
      if (!msg.ok()) {
        subscriber.Disconnect();
        continue;
      }
      // A message is ["message", channel, payload]; the payload names the
      // registry that wrote it (our own writes need no nudge), and after
      // releases the shards they freed.
      if (msg->type == RedisReply::Type::kArray) {
        if (msg->elements.size() == 3) {
          redis::ParsedNotice parsed =
              redis::ParseNotice(msg->elements[2].str, instance);
          ChangeNotice notice = TakeIn(parsed);
          // Our own writes are in the cache now; nobody else here needs
          // to hear of them.
          if (!parsed.own) Notify(notice);
          continue;
        }
        Notify();
      }
    }
  }

  // Applies the entries an announcement carries to the cached views and
  // says whether they are current. Entries of a kind that has no cached
  // view are not ours to follow; a gap (a lost message, or one sent without
  // its entries) asks for a poll, which reads what was missed.
  ChangeNotice TakeIn(const redis::ParsedNotice& parsed) {
    ChangeNotice notice = parsed.notice;
    if (parsed.changes.empty()) return notice;
    MutexLock l(&poll_mu);
    bool applied = false, gap = false;
    for (const redis::NoticeChanges& section : parsed.changes) {
      // The log key names the kind: "<prefix>:kind:<kind>:changes".
      absl::string_view key = section.log_key;
      const std::string head = absl::StrCat(prefix, ":kind:");
      constexpr absl::string_view kTail = ":changes";
      if (!absl::StartsWith(key, head) || !absl::EndsWith(key, kTail) ||
          key.size() < head.size() + kTail.size()) {
        gap = true;
        continue;
      }
      const std::string kind(
          key.substr(head.size(), key.size() - head.size() - kTail.size()));
      std::vector<ChangeNotice::Resized> resized;
      const redis::PollCache::Applied outcome =
          cache.Apply(kind, section.changes, &resized);
      if (!resized.empty()) {
        auto& all = notice.resized[kind];
        all.insert(all.end(), std::make_move_iterator(resized.begin()),
                   std::make_move_iterator(resized.end()));
      }
      switch (outcome) {
        case redis::PollCache::Applied::kApplied:
          applied = true;
          break;
        case redis::PollCache::Applied::kGap:
          gap = true;
          break;
        case redis::PollCache::Applied::kNotCached:
          break;
      }
    }
    if (gap) {
      notice.membership = true;  // Poll: it catches the view up.
    } else if (applied) {
      notice.view_current = true;
    }
    return notice;
  }

  void Notify(const ChangeNotice& notice = ChangeNotice{}) {
    MutexLock l(&listeners_mu);
    for (auto& [id, listener] : listeners) listener(notice);
  }

  RedisNodeRegistryOptions options;
  std::shared_ptr<spdlog::logger> logger;
  const std::string prefix;
  const std::string channel;
  // Names this registry object in the change messages it publishes.
  const std::string instance = RandomEpoch();
  // Null without sentinels.
  std::shared_ptr<redis::SentinelResolver> resolver;
  Mutex mu;
  RedisClient client ABSL_GUARDED_BY(mu);
  // The scripts are only touched inside Eval, under mu (the analysis cannot
  // follow them through the reference Eval takes).
  RedisScript poll{std::string(kPrelude) + kPollScript};
  RedisScript release{std::string(kPrelude) + kReleaseScript};
  RedisScript grant{std::string(kPrelude) + kGrantScript};
  RedisScript deregister{std::string(kPrelude) + kDeregisterScript};
  RedisScript handoff{std::string(kPrelude) + kHandoffScript};
  RedisScript drain{std::string(kPrelude) + kDrainScript};
  RedisScript kinds{std::string(kPrelude) + kKindsScript};
  RedisScript describe{std::string(kPrelude) + kDescribeScript};

  struct WarnState {
    absl::Time last;
    int64_t held_back;
  };
  static constexpr absl::Duration kWarnEvery = absl::Seconds(10);
  // One poll: its result, or with *again an error after which the poll is
  // to be sent once more (the cached views were dropped).
  absl::StatusOr<PollResult> PollOnce(const Context& ctx,
                                      const PollRequest& request, bool* again)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(poll_mu);

  // Serializes polls: each reads and updates the cached views.
  Mutex poll_mu;
  redis::PollCache cache ABSL_GUARDED_BY(poll_mu);
  // cache.change_polls(), readable without waiting for a poll.
  std::atomic<int64_t> change_polls{0};

  Mutex warn_mu;
  std::map<std::string, WarnState> warned ABSL_GUARDED_BY(warn_mu);

  // Subscriber thread only.
  RedisClient subscriber;
  Mutex listeners_mu;
  std::map<int64_t, std::function<void(const ChangeNotice&)>> listeners
      ABSL_GUARDED_BY(listeners_mu);
  int64_t next_listener ABSL_GUARDED_BY(listeners_mu) = 1;
  std::jthread thread ABSL_GUARDED_BY(listeners_mu);  // First listener.
  // With sentinels: follows +switch-master from Create on.
  std::jthread sentinel_thread;
  // Readable once the registry is being destroyed (WakeReaders); -1 when
  // no eventfd could be made (the readers then stop at their timeout).
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
};

absl::StatusOr<std::unique_ptr<RedisNodeRegistry>> RedisNodeRegistry::Create(
    RedisNodeRegistryOptions options) {
  if (absl::Status s = ValidateRedisNodeRegistryOptions(options); !s.ok()) {
    return s;
  }
  if (!options.sentinels.empty()) {
    std::vector<redis::RedisEndpoint> sentinels;
    for (const std::string& a : options.sentinels) {
      absl::StatusOr<redis::RedisEndpoint> e = redis::ParseRedisAddress(a);
      if (!e.ok()) return e.status();
      sentinels.push_back(*e);
    }
    auto logger =
        options.logger != nullptr ? options.logger : spdlog::default_logger();
    auto resolver = std::make_shared<redis::SentinelResolver>(
        std::move(sentinels), options.master_name, options, logger);
    auto impl = std::make_unique<Impl>(std::move(resolver), std::move(options));
    Impl& d = *impl;
    d.sentinel_thread = std::jthread([&d](std::stop_token stop) {
      pthread_setname_np(pthread_self(), "sp-sentinel");
      d.WatchSentinels(stop);
    });
    return std::unique_ptr<RedisNodeRegistry>(
        new RedisNodeRegistry(std::move(impl)));
  }
  absl::StatusOr<redis::RedisEndpoint> endpoint =
      redis::ParseRedisAddress(options.address);
  if (!endpoint.ok()) return endpoint.status();
  return std::unique_ptr<RedisNodeRegistry>(new RedisNodeRegistry(
      std::make_unique<Impl>(*endpoint, std::move(options))));
}

RedisNodeRegistry::RedisNodeRegistry(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

RedisNodeRegistry::~RedisNodeRegistry() = default;  // ~Impl stops the readers.

absl::StatusOr<PollResult> RedisNodeRegistry::Poll(const Context& ctx,
                                                   const PollRequest& request) {
  if (request.lease < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("poll: lease must be >= 1ms, got ",
                     absl::FormatDuration(request.lease)));
  }
  Impl& d = *impl_;
  MutexLock poll_lock(&d.poll_mu);
  bool again = false;
  absl::StatusOr<PollResult> result = d.PollOnce(ctx, request, &again);
  // The changes did not follow the cached view, which is gone now: read
  // everything.
  if (again) result = d.PollOnce(ctx, request, &again);
  return result;
}

std::optional<KindView> RedisNodeRegistry::CachedView(const std::string& kind) {
  Impl& d = *impl_;
  MutexLock l(&d.poll_mu);
  return d.cache.View(kind);
}

bool RedisNodeRegistry::ReadCachedView(
    const std::string& kind, const CachedViewMark& since,
    absl::FunctionRef<void(const CachedViewRead&)> read) {
  Impl& d = *impl_;
  MutexLock l(&d.poll_mu);
  return d.cache.Read(kind, since, read);
}

absl::StatusOr<PollResult> RedisNodeRegistry::Impl::PollOnce(
    const Context& ctx, const PollRequest& request, bool* again) {
  *again = false;
  std::vector<std::string> keys = {
      Key("epoch"),   Key("grants_from"), Key("run"),    Key("version"),
      Key("drained"), Key("kinds"),       Key("clamped")};
  std::vector<std::string> args = {
      // A new id each time: the one written when a new epoch starts must
      // differ from every epoch anyone saw before.
      absl::StrCat(absl::ToInt64Milliseconds(request.lease)),
      RandomEpoch(),
      channel,
      absl::StrCat(request.kinds.size()),
      absl::StrCat(request.min_version),
      instance,
      request.own_held_only ? "1" : "0",
      cache.epoch()};
  std::vector<std::string> polled;
  for (const auto& [kind, ids] : request.kinds) {
    polled.push_back(kind);
    PushKindKeys(kind, &keys);
    args.push_back(kind);
    auto ring = request.ring_sizes.find(kind);
    args.push_back(ring == request.ring_sizes.end()
                       ? std::string()
                       : absl::StrCat(ring->second));
    auto token = request.min_tokens.find(kind);
    args.push_back(token == request.min_tokens.end()
                       ? std::string()
                       : absl::StrCat(token->second));
    std::optional<uint64_t> since =
        request.own_held_only ? std::nullopt : cache.Since(kind);
    args.push_back(since.has_value() ? absl::StrCat(*since) : std::string());
    args.push_back(absl::StrCat(ids.size()));
    args.insert(args.end(), ids.begin(), ids.end());
  }
  // Errors are returned, not logged (the manager logs them, rate-limited).
  absl::StatusOr<RedisReply> reply = Eval(ctx, poll, keys, args, "poll");
  if (!reply.ok()) return reply.status();
  absl::StatusOr<redis::DecodedPoll> decoded =
      redis::DecodePollReply(*reply, polled);
  if (!decoded.ok()) return decoded.status();
  const bool merged = cache.Merge(&*decoded, request, &decoded->warnings);
  change_polls.store(cache.change_polls(), std::memory_order_relaxed);
  for (const std::string& w : decoded->warnings) WarnLimited(w);
  if (!decoded->new_epoch_reason.empty()) {
    SPDLOG_LOGGER_INFO(logger,
                       "registry started a new epoch prefix={} "
                       "epoch={} version={}: {}",
                       prefix, decoded->result.epoch, decoded->result.version,
                       decoded->new_epoch_reason);
  }
  if (!merged) {
    *again = true;
    return absl::AbortedError(
        "poll: the changes did not follow the cached view");
  }
  return std::move(decoded->result);
}

absl::Status RedisNodeRegistry::Release(const Context& ctx,
                                        const std::string& kind,
                                        const std::string& node_id,
                                        Assignment keep) {
  Impl& d = *impl_;
  if (keep.range.Empty()) keep = Assignment{};
  absl::StatusOr<RedisReply> reply = d.Eval(
      ctx, d.release,
      {d.KindKey(kind, "members"), d.KindKey(kind, "held"), d.Key("version"),
       d.KindKey(kind, "changes"), d.KindKey(kind, "changes_seq")},
      {node_id, redis::RunsArg(keep.range), absl::StrCat(keep.token), d.channel,
       d.instance},
      absl::StrCat("release node=", node_id, " range=", keep.range.ToString(),
                   " token=", keep.token));
  return reply.status();
}

absl::StatusOr<uint64_t> RedisNodeRegistry::Grant(const Context& ctx,
                                                  const std::string& kind,
                                                  const std::string& node_id,
                                                  ShardSet set,
                                                  const std::string& epoch) {
  const std::string what =
      absl::StrCat("grant node=", node_id, " range=", set.ToString());
  if (set.Empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": empty range"));
  }
  Impl& d = *impl_;
  absl::StatusOr<RedisReply> reply =
      d.Eval(ctx, d.grant,
             {d.Key("epoch"), d.Key("grants_from"), d.Key("run"),
              d.Key("version"), d.KindKey(kind, "members"),
              d.KindKey(kind, "held"), d.KindKey(kind, "token"),
              d.KindKey(kind, "changes"), d.KindKey(kind, "changes_seq")},
             {node_id, redis::RunsArg(set), d.channel, epoch, d.instance}, what,
             [](const RedisReply&) { return true; });  // Any non-error reply.
  if (!reply.ok()) return reply.status();
  absl::StatusOr<uint64_t> token = redis::ParseToken(reply->str);
  if (!token.ok()) {
    return absl::InternalError(
        absl::StrCat(what, ": the script returned ", token.status().message()));
  }
  return *token;
}

absl::StatusOr<HandoffResult> RedisNodeRegistry::Handoff(
    const Context& ctx, const HandoffRequest& request) {
  Impl& d = *impl_;
  HandoffResult out;
  out.releases.resize(request.releases.size());
  out.grants.resize(request.grants.size());
  // Per kind, the indices of its operations (the script groups by kind).
  struct Ops {
    std::vector<size_t> releases, grants;
  };
  std::map<std::string, Ops> by_kind;
  for (size_t i = 0; i < request.releases.size(); ++i) {
    by_kind[request.releases[i].kind].releases.push_back(i);
  }
  for (size_t i = 0; i < request.grants.size(); ++i) {
    const HandoffRequest::GrantOp& g = request.grants[i];
    if (g.target.Empty()) {
      out.grants[i] = absl::InvalidArgumentError(
          absl::StrCat("grant node=", g.node_id, " range=", g.target.ToString(),
                       ": empty range"));
      continue;
    }
    by_kind[g.kind].grants.push_back(i);
  }
  if (by_kind.empty()) return out;
  std::vector<std::string> keys = {d.Key("epoch"), d.Key("grants_from"),
                                   d.Key("run"), d.Key("version")};
  std::vector<std::string> args = {d.channel, d.instance, request.epoch,
                                   absl::StrCat(by_kind.size())};
  for (const auto& [kind, ops] : by_kind) {
    d.PushKindKeys(kind, &keys);
    args.push_back(kind);
    args.push_back(absl::StrCat(ops.releases.size()));
    for (size_t i : ops.releases) {
      Assignment keep = request.releases[i].keep;
      if (keep.range.Empty()) keep = Assignment{};
      args.push_back(request.releases[i].node_id);
      args.push_back(redis::RunsArg(keep.range));
      args.push_back(absl::StrCat(keep.token));
    }
    args.push_back(absl::StrCat(ops.grants.size()));
    for (size_t i : ops.grants) {
      args.push_back(request.grants[i].node_id);
      args.push_back(redis::RunsArg(request.grants[i].target));
    }
  }
  absl::StatusOr<RedisReply> reply =
      d.Eval(ctx, d.handoff, keys, args,
             absl::StrCat("handoff releases=", request.releases.size(),
                          " grants=", request.grants.size()),
             [](const RedisReply& r) {
               // Per kind, one "T <token>" per grant made.
               for (const RedisReply& per : r.elements) {
                 for (const RedisReply& e : per.elements) {
                   if (absl::StartsWith(e.str, "T ")) return true;
                 }
               }
               return false;
             });
  if (!reply.ok()) return reply.status();
  auto malformed = [](const std::string& why) {
    return absl::InternalError(
        absl::StrCat("handoff: the script returned ", why));
  };
  if (reply->type != RedisReply::Type::kArray ||
      reply->elements.size() != by_kind.size()) {
    return malformed("a reply of another shape");
  }
  size_t k = 0;
  for (const auto& [kind, ops] : by_kind) {
    const RedisReply& per = reply->elements[k++];
    if (per.type != RedisReply::Type::kArray ||
        per.elements.size() != ops.releases.size() + ops.grants.size()) {
      return malformed(
          absl::StrCat("a reply of another shape for kind ", kind));
    }
    for (size_t j = 0; j < per.elements.size(); ++j) {
      const std::string& r = per.elements[j].str;
      const bool is_release = j < ops.releases.size();
      std::string what;
      if (is_release) {
        const HandoffRequest::ReleaseOp& op = request.releases[ops.releases[j]];
        what = absl::StrCat("release node=", op.node_id,
                            " range=", op.keep.range.ToString(),
                            " token=", op.keep.token);
      } else {
        const HandoffRequest::GrantOp& op =
            request.grants[ops.grants[j - ops.releases.size()]];
        what = absl::StrCat("grant node=", op.node_id,
                            " range=", op.target.ToString());
      }
      absl::StatusOr<uint64_t> result = uint64_t{0};
      if (absl::StartsWith(r, "E ")) {
        result = ScriptError(what, r.substr(2));
      } else if (is_release && r != "OK") {
        return malformed(absl::StrCat("\"", r.substr(0, 64), "\" for ", what));
      } else if (!is_release) {
        if (!absl::StartsWith(r, "T ")) {
          return malformed(
              absl::StrCat("\"", r.substr(0, 64), "\" for ", what));
        }
        result = redis::ParseToken(r.substr(2));
        if (!result.ok()) {
          return malformed(
              absl::StrCat(result.status().message(), " for ", what));
        }
      }
      if (is_release) {
        out.releases[ops.releases[j]] = result.status();
      } else {
        out.grants[ops.grants[j - ops.releases.size()]] = std::move(result);
      }
    }
  }
  return out;
}

absl::Status RedisNodeRegistry::Deregister(
    const Context& ctx, const std::string& kind,
    const std::vector<std::string>& node_ids) {
  Impl& d = *impl_;
  std::vector<std::string> args = {d.channel, d.instance};
  args.insert(args.end(), node_ids.begin(), node_ids.end());
  return d
      .Eval(ctx, d.deregister,
            {d.KindKey(kind, "members"), d.KindKey(kind, "held"),
             d.Key("version"), d.KindKey(kind, "changes"),
             d.KindKey(kind, "changes_seq")},
            args, absl::StrCat("deregister kind=", kind))
      .status();
}

absl::Status RedisNodeRegistry::SetDrained(const Context& ctx,
                                           const std::string& pod_id,
                                           bool drained) {
  const std::string what =
      absl::StrCat(drained ? "drain" : "undrain", " pod=", pod_id);
  if (absl::Status s = ValidatePodId(pod_id); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", s.message()));
  }
  Impl& d = *impl_;
  return d
      .Eval(ctx, d.drain, {d.Key("drained"), d.Key("version")},
            {pod_id, drained ? "1" : "0", d.channel, d.instance}, what)
      .status();
}

absl::StatusOr<RegistryDescription> RedisNodeRegistry::Describe(
    const Context& ctx) {
  Impl& d = *impl_;
  // Two round trips: the kinds name the keys the second one reads at once.
  absl::StatusOr<RedisReply> names =
      d.Eval(ctx, d.kinds, {d.Key("kinds")}, {}, "describe");
  if (!names.ok()) return names.status();
  std::vector<std::string> kinds;
  std::vector<std::string> warnings;
  if (names->type == RedisReply::Type::kArray) {
    for (const RedisReply& name : names->elements) kinds.push_back(name.str);
  }
  std::sort(kinds.begin(), kinds.end());
  if (kinds.size() > kDescribeMaxKinds) {
    warnings.push_back(absl::StrCat("key ", d.Key("kinds"), " names ",
                                    kinds.size(), " kinds; only the first ",
                                    kDescribeMaxKinds, " are described"));
    kinds.resize(kDescribeMaxKinds);
  }
  std::vector<std::string> keys = {d.Key("epoch"),   d.Key("grants_from"),
                                   d.Key("run"),     d.Key("version"),
                                   d.Key("drained"), d.Key("kinds")};
  for (const std::string& kind : kinds) {
    keys.push_back(d.KindKey(kind, "members"));
    keys.push_back(d.KindKey(kind, "held"));
    keys.push_back(d.KindKey(kind, "token"));
  }
  absl::StatusOr<RedisReply> reply =
      d.Eval(ctx, d.describe, keys, {}, "describe");
  if (!reply.ok()) return reply.status();
  absl::StatusOr<RegistryDescription> out =
      redis::DecodeDescribeReply(*reply, kinds);
  if (!out.ok()) return out.status();
  for (std::string& w : out->warnings) {
    w = absl::StrCat(d.prefix, ": ", w);
  }
  out->warnings.insert(out->warnings.begin(), warnings.begin(), warnings.end());
  return out;
}

int64_t RedisNodeRegistry::AddChangeListener(std::function<void()> listener) {
  return AddNoticeListener(
      [listener = std::move(listener)](const ChangeNotice&) { listener(); });
}

int64_t RedisNodeRegistry::AddNoticeListener(
    std::function<void(const ChangeNotice&)> listener) {
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

int64_t RedisNodeRegistry::polls_with_changes_only() const {
  return impl_->change_polls.load(std::memory_order_relaxed);
}

int64_t RedisNodeRegistry::round_trips() const {
  MutexLock l(&impl_->mu);
  return impl_->client.round_trips();
}

std::string RedisNodeRegistry::master_address() const {
  MutexLock l(&impl_->mu);
  const redis::RedisEndpoint& e = impl_->client.endpoint();
  if (e.host.empty() && e.unix_path.empty()) return "";
  return e.ToString();
}

const std::string& RedisNodeRegistry::prefix() const { return impl_->prefix; }

}  // namespace setpoint
