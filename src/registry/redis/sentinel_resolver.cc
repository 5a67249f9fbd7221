#include "registry/redis/sentinel_resolver.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/format.h"
#include "spdlog/spdlog.h"

namespace setpoint::redis {

SentinelResolver::SentinelResolver(std::vector<RedisEndpoint> sentinels,
                                   std::string master_name,
                                   const RedisNodeRegistryOptions& options,
                                   std::shared_ptr<spdlog::logger> logger)
    : master_name_(std::move(master_name)),
      sentinel_options_(options),
      logger_(std::move(logger)),
      order_(std::move(sentinels)) {
  sentinel_options_.username = options.sentinel_username;
  sentinel_options_.password = options.sentinel_password;
  sentinel_options_.db = 0;
}

std::vector<RedisEndpoint> SentinelResolver::sentinels() const {
  MutexLock l(&mu_);
  return order_;
}

absl::StatusOr<RedisEndpoint> ParseMasterAddrReply(const RedisReply& reply) {
  if (reply.type == RedisReply::Type::kNil ||
      (reply.type == RedisReply::Type::kArray && reply.elements.empty())) {
    return absl::NotFoundError("does not know the master name");
  }
  if (reply.type == RedisReply::Type::kError) {
    return absl::InternalError(absl::StrCat("said \"", reply.str, "\""));
  }
  if (reply.type != RedisReply::Type::kArray || reply.elements.size() != 2 ||
      reply.elements[0].type != RedisReply::Type::kString ||
      reply.elements[1].type != RedisReply::Type::kString) {
    return absl::InternalError("answered something that is not [host, port]");
  }
  RedisEndpoint e;
  e.host = reply.elements[0].str;
  if (e.host.empty() || !absl::SimpleAtoi(reply.elements[1].str, &e.port) ||
      e.port <= 0 || e.port > 65535) {
    return absl::InternalError(absl::StrCat("answered a bad address \"",
                                            reply.elements[0].str, ":",
                                            reply.elements[1].str, "\""));
  }
  return e;
}

bool RoleIsMaster(const RedisReply& reply, std::string* role) {
  if (reply.type == RedisReply::Type::kError) {
    *role = reply.str;
    return false;
  }
  if (reply.type != RedisReply::Type::kArray || reply.elements.empty()) {
    *role = "a reply that is not a role";
    return false;
  }
  *role = reply.elements[0].str;
  return *role == "master";
}

absl::StatusOr<RedisEndpoint> SentinelResolver::Resolve(absl::Duration budget) {
  const absl::Time start = Clock::Monotonic()->Now();
  std::vector<RedisEndpoint> order = sentinels();
  std::vector<std::string> said;
  bool all_denied = true;
  for (const RedisEndpoint& sentinel : order) {
    absl::Duration left = budget - (Clock::Monotonic()->Now() - start);
    if (left <= absl::ZeroDuration()) {
      said.push_back(absl::StrCat("sentinel=", sentinel.ToString(),
                                  ": not asked, no time left"));
      all_denied = false;
      break;
    }
    RedisClient client(sentinel, sentinel_options_, logger_);
    absl::StatusOr<RedisReply> reply = client.Command(
        {"SENTINEL", "get-master-addr-by-name", master_name_}, left);
    absl::StatusOr<RedisEndpoint> master =
        reply.ok() ? ParseMasterAddrReply(*reply) : reply.status();
    if (master.ok()) {
      MutexLock l(&mu_);
      auto it = std::find_if(order_.begin(), order_.end(),
                             [&](const RedisEndpoint& e) {
                               return e.ToString() == sentinel.ToString();
                             });
      if (it != order_.end()) std::rotate(order_.begin(), it, it + 1);
      SPDLOG_LOGGER_DEBUG(logger_,
                          "sentinel named the master sentinel={} master={} "
                          "address={}",
                          sentinel.ToString(), master_name_,
                          master->ToString());
      return master;
    }
    if (!absl::IsPermissionDenied(master.status())) all_denied = false;
    said.push_back(absl::StrCat("sentinel=", sentinel.ToString(), " ",
                                master.status().message()));
  }
  std::string msg =
      absl::StrCat("resolve master=", master_name_,
                   ": no sentinel named it: ", absl::StrJoin(said, "; "));
  if (all_denied && !said.empty()) return absl::PermissionDeniedError(msg);
  return absl::UnavailableError(msg);
}

}  // namespace setpoint::redis
