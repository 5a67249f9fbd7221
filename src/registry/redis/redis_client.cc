#include "registry/redis/redis_client.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "registry/redis/sentinel_resolver.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/format.h"
#include "spdlog/spdlog.h"

namespace setpoint::redis {
namespace {

timeval TimevalOf(absl::Duration d) {
  timeval tv = absl::ToTimeval(d);
  if (tv.tv_sec == 0 && tv.tv_usec == 0) tv.tv_usec = 1;
  return tv;
}

RedisReply Copy(const redisReply* r) {
  RedisReply out;
  if (r == nullptr) return out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = RedisReply::Type::kString;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::kStatus;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = RedisReply::Type::kError;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::kArray;
      out.elements.reserve(r->elements);
      for (size_t i = 0; i < r->elements; ++i) {
        out.elements.push_back(Copy(r->element[i]));
      }
      break;
    default:
      out.type = RedisReply::Type::kNil;
      break;
  }
  return out;
}

// Writing to a connection Redis closed raises SIGPIPE, which kills the
// process by default; a library must not. While this lives, SIGPIPE is
// blocked on this thread, and one raised meanwhile is consumed.
class ScopedNoSigpipe {
 public:
  ScopedNoSigpipe() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigpending(&pending_before_);
    pthread_sigmask(SIG_BLOCK, &pipe, &old_);
  }
  ~ScopedNoSigpipe() {
    sigset_t pending;
    sigpending(&pending);
    if (sigismember(&pending, SIGPIPE) &&
        !sigismember(&pending_before_, SIGPIPE)) {
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      timespec zero{0, 0};
      while (sigtimedwait(&pipe, nullptr, &zero) == -1 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  ScopedNoSigpipe(const ScopedNoSigpipe&) = delete;
  ScopedNoSigpipe& operator=(const ScopedNoSigpipe&) = delete;

 private:
  sigset_t old_;
  sigset_t pending_before_;
};

}  // namespace

absl::Status StatusFromErrorReply(const std::string& what,
                                  const std::string& msg) {
  if (absl::StartsWith(msg, "NOPERM") || absl::StartsWith(msg, "WRONGPASS") ||
      absl::StartsWith(msg, "NOAUTH")) {
    return absl::PermissionDeniedError(absl::StrCat(what, ": ", msg));
  }
  if (absl::StartsWith(msg, "LOADING") || absl::StartsWith(msg, "BUSY") ||
      absl::StartsWith(msg, "MASTERDOWN") ||
      absl::StartsWith(msg, "TRYAGAIN") ||
      absl::StartsWith(msg, "CLUSTERDOWN") ||
      absl::StrContains(msg, "READONLY")) {
    return absl::UnavailableError(absl::StrCat(what, ": ", msg));
  }
  return absl::InternalError(absl::StrCat(what, ": ", msg));
}

std::string RedisEndpoint::ToString() const {
  if (!unix_path.empty()) return "unix://" + unix_path;
  if (host.find(':') != std::string::npos) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<RedisEndpoint> ParseRedisAddress(const std::string& address) {
  auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(
        absl::StrCat("redis address \"", address, "\": ", why));
  };
  RedisEndpoint e;
  std::string rest = address;
  if (absl::StartsWith(rest, "unix://")) {
    e.unix_path = rest.substr(7);
    if (e.unix_path.empty() || e.unix_path[0] != '/') {
      return bad("a unix socket needs an absolute path (unix:///path)");
    }
    return e;
  }
  if (absl::StartsWith(rest, "tcp://")) rest = rest.substr(6);
  if (rest.empty()) return bad("empty");
  std::string port;
  if (rest[0] == '[') {
    size_t close = rest.find(']');
    if (close == std::string::npos || close + 1 >= rest.size() ||
        rest[close + 1] != ':') {
      return bad("expected [ipv6]:port");
    }
    e.host = rest.substr(1, close - 1);
    port = rest.substr(close + 2);
  } else {
    size_t colon = rest.rfind(':');
    if (colon == std::string::npos) return bad("expected host:port");
    e.host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    if (e.host.find(':') != std::string::npos) {
      return bad("put an IPv6 address in brackets: [::1]:6379");
    }
  }
  if (e.host.empty()) return bad("empty host");
  if (!absl::SimpleAtoi(port, &e.port) || e.port <= 0 || e.port > 65535) {
    return bad("port must be a number in 1..65535");
  }
  return e;
}

RedisClient::RedisClient(RedisEndpoint endpoint,
                         const RedisNodeRegistryOptions& options,
                         std::shared_ptr<spdlog::logger> logger)
    : endpoint_(std::move(endpoint)),
      username_(options.username),
      password_(options.password),
      db_(options.db),
      connect_timeout_(options.connect_timeout),
      command_timeout_(options.command_timeout),
      logger_(std::move(logger)),
      backoff_(options.reconnect_backoff) {}

RedisClient::RedisClient(std::shared_ptr<SentinelResolver> resolver,
                         const RedisNodeRegistryOptions& options,
                         std::shared_ptr<spdlog::logger> logger)
    : RedisClient(RedisEndpoint{}, options, std::move(logger)) {
  resolver_ = std::move(resolver);
}

RedisClient::~RedisClient() { Disconnect(); }

void RedisClient::Disconnect() {
  if (ctx_ != nullptr) redisFree(ctx_);
  ctx_ = nullptr;
  timeout_in_force_ = absl::ZeroDuration();
}

bool RedisClient::Switched() const {
  return resolver_ != nullptr && resolver_->generation() != generation_;
}

absl::Status RedisClient::Fail(const char* what) {
  std::string err = ctx_ != nullptr ? std::string(ctx_->errstr) : "no context";
  bool timeout = ctx_ != nullptr && ctx_->err == REDIS_ERR_IO &&
                 (errno == EAGAIN || errno == EWOULDBLOCK);
  const absl::Duration waited = timeout_in_force_;
  Disconnect();
  if (timeout) {
    // hiredis reports a read that timed out as EAGAIN's text ("Resource
    // temporarily unavailable"): say what happened instead.
    return absl::DeadlineExceededError(
        absl::StrCat(what, " redis=", endpoint_.ToString(),
                     ": no reply within ", HumanDuration(waited)));
  }
  std::string msg =
      absl::StrCat(what, " redis=", endpoint_.ToString(), ": ", err);
  return absl::UnavailableError(msg);
}

absl::Status RedisClient::UseTimeout(absl::Duration budget) {
  absl::Duration want = std::min(command_timeout_, budget);
  if (want == timeout_in_force_) return absl::OkStatus();
  if (redisSetTimeout(ctx_, TimevalOf(want)) != REDIS_OK) {
    return Fail("set timeout");
  }
  timeout_in_force_ = want;
  return absl::OkStatus();
}

absl::StatusOr<RedisReply> RedisClient::Handshake(
    const std::vector<std::string>& args, const char* what) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  redisReply* r;
  {
    ScopedNoSigpipe no_sigpipe;
    r = static_cast<redisReply*>(redisCommandArgv(
        ctx_, static_cast<int>(argv.size()), argv.data(), lens.data()));
  }
  if (r == nullptr) return Fail(what);
  RedisReply reply = Copy(r);
  freeReplyObject(r);
  return reply;
}

absl::Status RedisClient::EnsureConnected(absl::Duration budget) {
  if (ctx_ != nullptr) return absl::OkStatus();
  absl::Time now = Clock::Monotonic()->Now();
  if (Switched()) {
    // The master moved since the last failure: the wait was for the old one.
    next_connect_ = absl::InfinitePast();
    backoff_.Reset();
  }
  if (now < next_connect_) {
    return absl::UnavailableError(
        absl::StrCat("connect redis=", endpoint_.ToString(),
                     ": waiting to reconnect after a failure, retry in ",
                     HumanDuration(next_connect_ - now)));
  }
  auto failed = [&](absl::Status s) {
    Disconnect();
    absl::Duration wait = backoff_.Next();
    next_connect_ = Clock::Monotonic()->Now() + wait;
    SPDLOG_LOGGER_DEBUG(logger_, "redis connect failed retry_in={}: {}", wait,
                        s);
    return s;
  };
  if (resolver_ != nullptr) {
    // Read the generation first: a switch announced while we resolve must
    // still drop what we connect to now.
    generation_ = resolver_->generation();
    absl::StatusOr<RedisEndpoint> master = resolver_->Resolve(budget);
    if (!master.ok()) return failed(master.status());
    endpoint_ = *master;
    budget -= Clock::Monotonic()->Now() - now;
    if (budget <= absl::ZeroDuration()) {
      return failed(absl::DeadlineExceededError(
          absl::StrCat("connect redis=", endpoint_.ToString(),
                       ": no time left after asking the sentinels")));
    }
  }
  timeval tv = TimevalOf(std::min(connect_timeout_, budget));
  ctx_ =
      endpoint_.unix_path.empty()
          ? redisConnectWithTimeout(endpoint_.host.c_str(), endpoint_.port, tv)
          : redisConnectUnixWithTimeout(endpoint_.unix_path.c_str(), tv);
  if (ctx_ == nullptr || ctx_->err != 0) {
    std::string err = ctx_ != nullptr ? ctx_->errstr : "out of memory";
    return failed(absl::UnavailableError(
        absl::StrCat("connect redis=", endpoint_.ToString(), ": ", err)));
  }
  if (redisSetTimeout(ctx_, TimevalOf(command_timeout_)) != REDIS_OK) {
    return failed(Fail("set timeout"));
  }
  timeout_in_force_ = command_timeout_;
  if (!password_.empty()) {
    std::vector<std::string> auth = {"AUTH"};
    if (!username_.empty()) auth.push_back(username_);
    auth.push_back(password_);
    absl::StatusOr<RedisReply> reply = Handshake(auth, "auth");
    if (!reply.ok()) return failed(reply.status());
    if (reply->type == RedisReply::Type::kError) {
      // The password is never part of a message.
      return failed(absl::PermissionDeniedError(absl::StrCat(
          "auth redis=", endpoint_.ToString(),
          username_.empty() ? "" : " user=", username_, ": ", reply->str)));
    }
  }
  if (db_ != 0) {
    absl::StatusOr<RedisReply> reply =
        Handshake({"SELECT", absl::StrCat(db_)}, "select");
    if (!reply.ok()) return failed(reply.status());
    if (reply->type == RedisReply::Type::kError) {
      return failed(absl::InvalidArgumentError(
          absl::StrCat("select db=", db_, " redis=", endpoint_.ToString(), ": ",
                       reply->str)));
    }
  }
  if (resolver_ != nullptr) {
    absl::StatusOr<RedisReply> reply = Handshake({"ROLE"}, "role");
    if (!reply.ok()) return failed(reply.status());
    std::string role;
    if (!RoleIsMaster(*reply, &role)) {
      absl::Status s = absl::UnavailableError(absl::StrCat(
          "confirm master=", resolver_->master_name(),
          " redis=", endpoint_.ToString(), ": ROLE says \"", role,
          "\", not master (the sentinels are behind or a failover is under "
          "way)"));
      if (reply->type == RedisReply::Type::kError &&
          absl::StartsWith(reply->str, "NOPERM")) {
        s = absl::PermissionDeniedError(absl::StrCat(
            "confirm master=", resolver_->master_name(),
            " redis=", endpoint_.ToString(), ": ROLE refused: ", reply->str,
            " (the user needs +role)"));
      }
      return failed(s);
    }
  }
  backoff_.Reset();
  SPDLOG_LOGGER_DEBUG(logger_, "redis connected redis={}",
                      endpoint_.ToString());
  return absl::OkStatus();
}

absl::StatusOr<RedisReply> RedisClient::Command(
    const std::vector<std::string>& args, absl::Duration budget) {
  absl::Time start = Clock::Monotonic()->Now();
  if (ctx_ != nullptr && Switched()) {
    SPDLOG_LOGGER_INFO(logger_,
                       "redis master switched, reconnecting old_redis={}",
                       endpoint_.ToString());
    Disconnect();
  }
  if (absl::Status s = EnsureConnected(budget); !s.ok()) return s;
  absl::Duration left = budget - (Clock::Monotonic()->Now() - start);
  if (left <= absl::ZeroDuration()) {
    return absl::DeadlineExceededError(
        absl::StrCat("command redis=", endpoint_.ToString(),
                     ": no time left after connecting"));
  }
  if (absl::Status s = UseTimeout(left); !s.ok()) return s;
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  argv.reserve(args.size());
  lens.reserve(args.size());
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  ++round_trips_;
  redisReply* r;
  {
    ScopedNoSigpipe no_sigpipe;
    r = static_cast<redisReply*>(redisCommandArgv(
        ctx_, static_cast<int>(argv.size()), argv.data(), lens.data()));
  }
  if (r == nullptr) {
    return Fail(args.empty() ? "command" : args[0].c_str());
  }
  RedisReply reply = Copy(r);
  freeReplyObject(r);
  if (resolver_ != nullptr && reply.type == RedisReply::Type::kError &&
      absl::StrContains(reply.str, "READONLY")) {
    // A master that became a replica: the next command asks the sentinels.
    SPDLOG_LOGGER_INFO(logger_,
                       "redis answered READONLY, reconnecting old_redis={}",
                       endpoint_.ToString());
    Disconnect();
  }
  return reply;
}

absl::StatusOr<RedisReply> RedisClient::Eval(
    RedisScript& script, const std::vector<std::string>& keys,
    const std::vector<std::string>& args, absl::Duration budget) {
  const absl::Time start = Clock::Monotonic()->Now();
  auto left = [&] { return budget - (Clock::Monotonic()->Now() - start); };
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (script.sha.empty()) {
      absl::StatusOr<RedisReply> loaded =
          Command({"SCRIPT", "LOAD", script.source}, left());
      if (!loaded.ok()) return loaded.status();
      if (loaded->type != RedisReply::Type::kString) {
        return StatusFromErrorReply("script load", loaded->str);
      }
      script.sha = loaded->str;
    }
    std::vector<std::string> argv = {"EVALSHA", script.sha,
                                     absl::StrCat(keys.size())};
    argv.insert(argv.end(), keys.begin(), keys.end());
    argv.insert(argv.end(), args.begin(), args.end());
    absl::StatusOr<RedisReply> reply = Command(argv, left());
    if (!reply.ok()) return reply;
    if (reply->type == RedisReply::Type::kError) {
      if (absl::StartsWith(reply->str, "NOSCRIPT")) {
        script.sha.clear();  // Redis restarted or flushed its scripts.
        continue;
      }
    }
    return reply;
  }
  return absl::UnavailableError("script: NOSCRIPT twice in a row");
}

absl::StatusOr<RedisReply> RedisClient::ReadPushed(absl::Duration timeout,
                                                   int wake_fd) {
  if (ctx_ == nullptr) {
    return absl::UnavailableError("read: not connected");
  }
  if (Switched()) {
    Disconnect();
    return absl::UnavailableError("read: the master switched");
  }
  void* raw = nullptr;
  if (redisGetReplyFromReader(ctx_, &raw) != REDIS_OK) {
    return Fail("read");
  }
  if (raw == nullptr) {
    pollfd pfd[2] = {{ctx_->fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    int ready = ::poll(pfd, wake_fd >= 0 ? 2 : 1,
                       static_cast<int>(absl::ToInt64Milliseconds(timeout)));
    if (ready == 0) return RedisReply{};  // Nothing yet.
    if (ready < 0) {
      if (errno == EINTR) return RedisReply{};
      return Fail("poll");
    }
    // Only the wake descriptor: the owner is stopping. Anything on the
    // socket (data, an error, POLLNVAL) is read as before.
    if (pfd[0].revents == 0) return RedisReply{};
    if (redisBufferRead(ctx_) != REDIS_OK) return Fail("read");
    if (redisGetReplyFromReader(ctx_, &raw) != REDIS_OK) return Fail("read");
    if (raw == nullptr) return RedisReply{};
  }
  RedisReply reply = Copy(static_cast<redisReply*>(raw));
  freeReplyObject(raw);
  return reply;
}

}  // namespace setpoint::redis
