// The Redis registry's cached views against a real redis-server: a poll
// answered with the changes since the last one must give exactly what a
// poll that reads everything gives, through every kind of write, and must
// fall back to reading everything whenever the log cannot be trusted.
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "node/view_sync.h"
#include "registry/redis/redis_client.h"
#include "setpoint/base/mutex.h"
#include "setpoint/node/node_registry.h"
#include "setpoint/registry/redis_node_registry.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/redis_server.h"
#include "setpoint/testing/status_matchers.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"

namespace setpoint {
namespace {

using ::setpoint::testing::AwaitCondition;
using ::setpoint::testing::IsOk;
using ::setpoint::testing::NullLogger;
using ::setpoint::testing::RedisServer;
using ::setpoint::testing::StatusIs;
using ::testing::HasSubstr;

std::unique_ptr<RedisNodeRegistry> Registry(
    const std::string& address,
    std::shared_ptr<spdlog::logger> logger = NullLogger()) {
  auto r = RedisNodeRegistry::Create({.address = address, .logger = logger});
  EXPECT_THAT(r.status(), IsOk());
  return r.ok() ? std::move(*r) : nullptr;
}

redis::RedisReply Raw(const std::string& address,
                      const std::vector<std::string>& argv) {
  auto endpoint = redis::ParseRedisAddress(address);
  redis::RedisClient client(*endpoint, {}, NullLogger());
  auto reply = client.Command(argv);
  EXPECT_THAT(reply.status(), IsOk());
  return reply.ok() ? *reply : redis::RedisReply{};
}

class RedisChangeLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SETPOINT_START_REDIS_OR_SKIP(server_);
    writer_ = Registry(server_.address());
    reader_ = Registry(server_.address());
    ASSERT_THAT(Poll(*writer_, {}).status(), IsOk());
    Raw(server_.address(), {"SET", writer_->prefix() + ":grants_from", "0"});
  }
  std::string Key(const std::string& name) const {
    return absl::StrCat(writer_->prefix(), ":kind:vm:", name);
  }
  absl::StatusOr<PollResult> Poll(RedisNodeRegistry& r,
                                  std::vector<std::string> ids) {
    auto v = r.Poll(ctx_, {.kinds = {{"vm", std::move(ids)}},
                           .lease = absl::Seconds(30),
                           .min_version = version_});
    if (v.ok()) {
      epoch_ = v->epoch;
      version_ = std::max(version_, v->version);
    }
    return v;
  }
  // The reader's view (cached, answered with changes where it can) and a
  // view read whole by a registry with no cache must be the same.
  void ExpectReaderSeesWhatAFullReadSees(const std::string& when) {
    auto cached = Poll(*reader_, {"r/vm/0"});
    auto fresh = Registry(server_.address());
    auto full = Poll(*fresh, {"r/vm/0"});
    ASSERT_THAT(cached.status(), IsOk()) << when;
    ASSERT_THAT(full.status(), IsOk()) << when;
    EXPECT_EQ(cached->kinds["vm"].members, full->kinds["vm"].members) << when;
    EXPECT_EQ(cached->kinds["vm"].held, full->kinds["vm"].held) << when;
  }

  RedisServer server_;
  Context ctx_ = Context::Background();
  std::unique_ptr<RedisNodeRegistry> writer_, reader_;
  std::string epoch_;
  uint64_t version_ = 0;
};

TEST_F(RedisChangeLogTest, CachedViewsMatchAFullReadThroughEveryKindOfWrite) {
  // Ten nodes of pod "w" that join, get, shrink, hand off, release and
  // leave at random (a fixed seed); after every write the reader's view
  // must be exactly what a full read gives.
  std::mt19937 rng(20261203);
  struct Node {
    bool member = false;
    std::optional<Assignment> held;
  };
  std::vector<Node> nodes(10);
  auto id = [](int i) { return absl::StrCat("w/vm/", i); };
  auto members = [&] {
    std::vector<std::string> out;
    for (int i = 0; i < 10; ++i) {
      if (nodes[i].member) out.push_back(id(i));
    }
    return out;
  };
  ExpectReaderSeesWhatAFullReadSees("start");
  const int64_t before = reader_->polls_with_changes_only();
  for (int step = 0; step < 200; ++step) {
    const int i = static_cast<int>(rng() % 10);
    Node& n = nodes[i];
    const uint32_t lo = 100 * static_cast<uint32_t>(i);
    std::string what;
    if (!n.member) {
      n.member = true;
      ASSERT_THAT(Poll(*writer_, members()).status(), IsOk());
      what = "join";
    } else if (!n.held.has_value()) {
      const uint32_t len = 1 + rng() % 100;
      auto t = writer_->Grant(ctx_, "vm", id(i), {lo, lo + len}, epoch_);
      ASSERT_THAT(t.status(), IsOk());
      n.held = Assignment{{lo, lo + len}, *t};
      what = "grant";
    } else {
      switch (rng() % 4) {
        case 0: {  // Shrink to the first shard.
          Assignment keep{{lo, lo + 1}, n.held->token};
          ASSERT_THAT(writer_->Release(ctx_, "vm", id(i), keep), IsOk());
          n.held = keep;
          what = "shrink";
          break;
        }
        case 1:
          ASSERT_THAT(writer_->Release(ctx_, "vm", id(i), {}), IsOk());
          n.held.reset();
          what = "release";
          break;
        case 2: {  // Hand off: release everything and take two runs.
          HandoffRequest h{.epoch = epoch_};
          h.releases.push_back({"vm", id(i), {}});
          h.grants.push_back(
              {"vm", id(i), ShardSet::Of({{lo, lo + 10}, {lo + 20, lo + 30}})});
          auto r = writer_->Handoff(ctx_, h);
          ASSERT_THAT(r.status(), IsOk());
          ASSERT_THAT(r->grants[0].status(), IsOk());
          n.held = Assignment{ShardSet::Of({{lo, lo + 10}, {lo + 20, lo + 30}}),
                              *r->grants[0]};
          what = "handoff";
          break;
        }
        default:
          ASSERT_THAT(writer_->Deregister(ctx_, "vm", {id(i)}), IsOk());
          n = Node{};
          what = "leave";
          break;
      }
    }
    ExpectReaderSeesWhatAFullReadSees(
        absl::StrCat("step ", step, ": ", what, " ", id(i)));
  }
  // Most of those polls were answered with changes only (every 16th of a
  // kind reads everything).
  EXPECT_GE(reader_->polls_with_changes_only() - before, 180);
}

TEST_F(RedisChangeLogTest, PollsThatLeaveTheFleetInTheCacheGiveTheSameView) {
  // With cached_view_ok a poll answered from the cache carries only the
  // caller's own records (read from Redis); the cached view supplies the
  // rest. Together they must be what a full read gives, after every write.
  ASSERT_THAT(Poll(*reader_, {"r/vm/0"}).status(), IsOk());
  auto own = reader_->Grant(ctx_, "vm", "r/vm/0", {4000, 4096}, epoch_);
  ASSERT_THAT(own.status(), IsOk());
  std::mt19937 rng(20261207);
  int from_cache = 0, named = 0;
  KindView kept;
  CachedViewMark mark;
  for (int step = 0; step < 60; ++step) {
    const std::string id = absl::StrCat("w/vm/", rng() % 5);
    const uint32_t lo = 100 * static_cast<uint32_t>(id.back() - '0');
    switch (rng() % 3) {
      case 0:
        ASSERT_THAT(Poll(*writer_, {id}).status(), IsOk());
        break;
      case 1: {
        const uint32_t len = 1 + static_cast<uint32_t>(rng() % 50);
        auto t = writer_->Grant(ctx_, "vm", id, {lo, lo + len}, epoch_);
        // Refused when it is not a member (it left): that is fine.
        (void)t;
        break;
      }
      default:
        ASSERT_THAT(writer_->Deregister(ctx_, "vm", {id}), IsOk());
        break;
    }
    const std::string when = absl::StrCat("step ", step, " ", id);
    auto answer = reader_->Poll(ctx_, {.kinds = {{"vm", {"r/vm/0"}}},
                                       .lease = absl::Seconds(30),
                                       .min_version = version_,
                                       .cached_view_ok = true});
    ASSERT_THAT(answer.status(), IsOk()) << when;
    KindView view = answer->kinds["vm"];
    if (answer->from_cache.contains("vm")) {
      ++from_cache;
      EXPECT_TRUE(view.members.empty()) << when;
      ASSERT_EQ(view.held.size(), 1u) << when;
      EXPECT_EQ(view.held.at("r/vm/0").token, *own) << when;
      KindView cached;
      ASSERT_TRUE(reader_->ReadCachedView(
          "vm", {}, [&](const CachedViewRead& v) { cached = v.view; }))
          << when;
      // A copy kept up by the ids the cache names since the last look is
      // the same view.
      ASSERT_TRUE(reader_->ReadCachedView("vm", mark,
                                          [&](const CachedViewRead& v) {
                                            if (v.changed != nullptr) ++named;
                                            SyncView(v.view, {}, &kept,
                                                     v.changed);
                                            mark = v.at;
                                          }))
          << when;
      EXPECT_EQ(kept.members, cached.members) << when;
      EXPECT_EQ(kept.held, cached.held) << when;
      cached.held["r/vm/0"] = view.held.at("r/vm/0");
      view = cached;
    }
    auto full = Poll(*Registry(server_.address()), {"r/vm/0"});
    ASSERT_THAT(full.status(), IsOk()) << when;
    EXPECT_EQ(view.members, full->kinds["vm"].members) << when;
    EXPECT_EQ(view.held, full->kinds["vm"].held) << when;
  }
  // Every 16th poll of a kind reads everything; the rest use the cache,
  // and the cache named what changed (not at the first look, nor after a
  // full read that found something the log had not said).
  EXPECT_GE(from_cache, 50);
  EXPECT_GE(named, 40);
}

TEST_F(RedisChangeLogTest, AnnouncementsKeepAViewCurrentWithoutPolls) {
  // The reader polls once; from then on the writer's announcements alone
  // must keep its cached view exactly what a full read gives, through
  // joins, grants, shrinks, handoffs, releases and leaves.
  Mutex mu;
  int current = 0, other = 0;
  const int64_t listener =
      reader_->AddNoticeListener([&](const ChangeNotice& n) {
        MutexLock l(&mu);
        ++(n.view_current ? current : other);
      });
  // The subscription is live once its plain notice (anything may have
  // changed while away) came: from then on no message is missed.
  ASSERT_TRUE(AwaitCondition([&] {
    MutexLock l(&mu);
    return other >= 1;
  }));
  ASSERT_THAT(Poll(*reader_, {"r/vm/0"}).status(), IsOk());
  auto same_as_a_full_read = [&](const std::string& when) {
    auto fresh = Registry(server_.address());
    auto full = Poll(*fresh, {"r/vm/0"});
    EXPECT_THAT(full.status(), IsOk()) << when;
    if (!full.ok()) return false;
    return AwaitCondition([&] {
      std::optional<KindView> v = reader_->CachedView("vm");
      return v.has_value() && v->members == full->kinds["vm"].members &&
             v->held == full->kinds["vm"].held;
    });
  };
  ASSERT_TRUE(same_as_a_full_read("start"));
  const int64_t trips = reader_->round_trips();
  std::mt19937 rng(20261204);
  std::vector<std::optional<Assignment>> held(6);
  std::vector<bool> member(6, false);
  auto id = [](int i) { return absl::StrCat("w/vm/", i); };
  for (int step = 0; step < 60; ++step) {
    const int i = static_cast<int>(rng() % 6);
    const uint32_t lo = 100 * static_cast<uint32_t>(i);
    std::string what;
    if (!member[i]) {
      member[i] = true;
      std::vector<std::string> ids;
      for (int k = 0; k < 6; ++k) {
        if (member[k]) ids.push_back(id(k));
      }
      ASSERT_THAT(Poll(*writer_, ids).status(), IsOk());
      what = "join";
    } else if (!held[i].has_value()) {
      auto t = writer_->Grant(ctx_, "vm", id(i), {lo, lo + 50}, epoch_);
      ASSERT_THAT(t.status(), IsOk());
      held[i] = Assignment{{lo, lo + 50}, *t};
      what = "grant";
    } else if (rng() % 3 == 0) {
      HandoffRequest h{.epoch = epoch_};
      h.releases.push_back(
          {"vm", id(i), Assignment{ShardSet(lo, lo + 5), held[i]->token}});
      h.grants.push_back({"vm", id(i), ShardSet(lo, lo + 20)});
      auto r = writer_->Handoff(ctx_, h);
      ASSERT_THAT(r.status(), IsOk());
      ASSERT_THAT(r->grants[0].status(), IsOk());
      held[i] = Assignment{{lo, lo + 20}, *r->grants[0]};
      what = "handoff";
    } else if (rng() % 2 == 0) {
      ASSERT_THAT(writer_->Release(ctx_, "vm", id(i), {}), IsOk());
      held[i].reset();
      what = "release";
    } else {
      ASSERT_THAT(writer_->Deregister(ctx_, "vm", {id(i)}), IsOk());
      member[i] = false;
      held[i].reset();
      what = "leave";
    }
    ASSERT_TRUE(same_as_a_full_read(absl::StrCat("step ", step, ": ", what)));
  }
  // The reader sent nothing all along.
  EXPECT_EQ(reader_->round_trips(), trips);
  // Not under mu: the registry holds its listeners' lock while it calls
  // ours.
  reader_->RemoveChangeListener(listener);
  MutexLock l(&mu);
  EXPECT_GE(current, 60);
}

TEST_F(RedisChangeLogTest, AnAnnouncementThatSkipsAnEntryAsksForAPoll) {
  Mutex mu;
  std::vector<ChangeNotice> heard;
  const int64_t listener =
      reader_->AddNoticeListener([&](const ChangeNotice& n) {
        MutexLock l(&mu);
        heard.push_back(n);
      });
  // The subscription is live once its plain notice came.
  ASSERT_TRUE(AwaitCondition([&] {
    MutexLock l(&mu);
    return !heard.empty();
  }));
  ASSERT_THAT(Poll(*reader_, {"r/vm/0"}).status(), IsOk());
  const std::optional<KindView> before = reader_->CachedView("vm");
  ASSERT_TRUE(before.has_value());
  // Entry 1000 of a log that is nowhere near it: the view stays, and the
  // pod is told to look again.
  Raw(server_.address(), {"PUBLISH", writer_->prefix() + ":changed",
                          absl::StrCat("someone\tc\t", Key("changes"),
                                       "\t1\t1000 + 6 x/vm/0", "\tg")});
  ASSERT_TRUE(AwaitCondition([&] {
    MutexLock l(&mu);
    return heard.size() >= 2;
  }));
  {
    MutexLock l(&mu);
    ASSERT_EQ(heard.size(), 2u);
    EXPECT_TRUE(heard.back().membership);
    EXPECT_FALSE(heard.back().view_current);
  }
  EXPECT_EQ(reader_->CachedView("vm")->members, before->members);
  reader_->RemoveChangeListener(listener);
}

TEST_F(RedisChangeLogTest, AMemberWhoseLeaseEndsLeavesEveryView) {
  ASSERT_THAT(writer_
                  ->Poll(ctx_, {.kinds = {{"vm", {"x/vm/0"}}},
                                .lease = absl::Milliseconds(100),
                                .min_version = version_})
                  .status(),
              IsOk());
  auto t = writer_->Grant(ctx_, "vm", "x/vm/0", {0, 10}, epoch_);
  ASSERT_THAT(t.status(), IsOk());
  ExpectReaderSeesWhatAFullReadSees("granted");
  EXPECT_TRUE(AwaitCondition([&] {
    auto v = Poll(*reader_, {"r/vm/0"});
    return v.ok() && !v->kinds["vm"].held.contains("x/vm/0") &&
           v->kinds["vm"].members == std::vector<std::string>{"r/vm/0"};
  }));
  ExpectReaderSeesWhatAFullReadSees("expired");
}

TEST_F(RedisChangeLogTest, OwnRecordsComeFromRedisEvenWhenWrittenPastTheLog) {
  ASSERT_THAT(Poll(*reader_, {"r/vm/0"}).status(), IsOk());
  auto t = reader_->Grant(ctx_, "vm", "r/vm/0", {0, 10}, epoch_);
  ASSERT_THAT(t.status(), IsOk());
  auto v = Poll(*reader_, {"r/vm/0"});
  ASSERT_THAT(v.status(), IsOk());
  ASSERT_TRUE(v->kinds["vm"].held.contains("r/vm/0"));
  const int64_t with_changes = reader_->polls_with_changes_only();
  // Someone else drops the record without the scripts: the very next poll
  // must not show it (the lease protocol stops the node on that).
  Raw(server_.address(), {"HDEL", Key("held"), "r/vm/0"});
  v = Poll(*reader_, {"r/vm/0"});
  ASSERT_THAT(v.status(), IsOk());
  EXPECT_FALSE(v->kinds["vm"].held.contains("r/vm/0"));
  // It disagreed with the cached view: that poll read everything.
  EXPECT_EQ(reader_->polls_with_changes_only(), with_changes);
  ExpectReaderSeesWhatAFullReadSees("after the hand edit");
}

TEST_F(RedisChangeLogTest, OthersRecordsWrittenPastTheLogAreSeenAtAFullRead) {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  auto logger = std::make_shared<spdlog::logger>("reader", sink);
  reader_ = Registry(server_.address(), logger);
  ASSERT_THAT(Poll(*writer_, {"w/vm/0"}).status(), IsOk());
  ASSERT_THAT(Poll(*reader_, {"r/vm/0"}).status(), IsOk());
  // An older setpoint, or a hand edit, writes a record without logging it.
  Raw(server_.address(), {"HSET", Key("held"), "w/vm/0", "0 5 7"});
  int polls = 0;
  EXPECT_TRUE(AwaitCondition([&] {
    ++polls;
    auto v = Poll(*reader_, {"r/vm/0"});
    return v.ok() && v->kinds["vm"].held.contains("w/vm/0");
  }));
  EXPECT_LE(polls, 16);
  bool warned = false;
  for (const std::string& line : sink->last_formatted()) {
    if (line.find("without an entry in the change log") != std::string::npos) {
      warned = true;
    }
  }
  EXPECT_TRUE(warned);
}

TEST_F(RedisChangeLogTest, AViewOlderThanTheLogReadsEverything) {
  ASSERT_THAT(Poll(*writer_, {"w/vm/0"}).status(), IsOk());
  ExpectReaderSeesWhatAFullReadSees("start");
  // More changes than the log keeps (4096): grant and release 2100 times.
  for (int k = 0; k < 2100; ++k) {
    auto t = writer_->Grant(ctx_, "vm", "w/vm/0",
                            {0, static_cast<uint32_t>(1 + k % 7)}, epoch_);
    ASSERT_THAT(t.status(), IsOk());
    if (k + 1 < 2100) {
      ASSERT_THAT(writer_->Release(ctx_, "vm", "w/vm/0", {}), IsOk());
    }
  }
  EXPECT_EQ(Raw(server_.address(), {"LLEN", Key("changes")}).integer, 4096);
  const int64_t with_changes = reader_->polls_with_changes_only();
  ExpectReaderSeesWhatAFullReadSees("after 4200 changes");
  EXPECT_EQ(reader_->polls_with_changes_only(), with_changes);
  // From there on, changes again.
  ASSERT_THAT(writer_->Release(ctx_, "vm", "w/vm/0", {}), IsOk());
  ExpectReaderSeesWhatAFullReadSees("one more");
  EXPECT_EQ(reader_->polls_with_changes_only(), with_changes + 1);
}

TEST_F(RedisChangeLogTest, GarbageInTheLogIsNamedAndCostsAFullRead) {
  ASSERT_THAT(Poll(*writer_, {"w/vm/0"}).status(), IsOk());
  ExpectReaderSeesWhatAFullReadSees("start");
  // An entry that is not ours, then a real change after it.
  Raw(server_.address(), {"RPUSH", Key("changes"), "not an entry"});
  Raw(server_.address(), {"INCR", Key("changes_seq")});
  ASSERT_THAT(writer_->Grant(ctx_, "vm", "w/vm/0", {0, 4}, epoch_).status(),
              IsOk());
  ExpectReaderSeesWhatAFullReadSees("after the garbage entry");
  // The wrong type in the log's keys is refused naming the key, as in every
  // other key of ours, and polls work again once it is removed.
  Raw(server_.address(), {"DEL", Key("changes")});
  Raw(server_.address(), {"SET", Key("changes"), "x"});
  EXPECT_THAT(Poll(*reader_, {"r/vm/0"}).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("changes")));
  Raw(server_.address(), {"DEL", Key("changes")});
  ExpectReaderSeesWhatAFullReadSees("after the key was removed");
}

}  // namespace
}  // namespace setpoint
