// The records API service's fencing rule and the pods' HTTP client,
// against a service in this process on an ephemeral loopback port.
#include <httplib.h>

#include <chrono>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "json_reader.h"
#include "records_api_service.h"
#include "records_http_client.h"
#include "records_wire.h"
#include "setpoint/base/context.h"
#include "setpoint/base/status.h"
#include "setpoint/controller/controller.h"

namespace sharded {
namespace {

constexpr uint32_t kRing = 64;

setpoint::Context As(const std::string& node, setpoint::ShardRange range,
                     uint64_t token, const setpoint::Context& base = {}) {
  auto a = std::make_shared<setpoint::Assignment>();
  a->node_id = node;
  a->kind = "records";
  a->range = range;
  a->token = token;
  a->ring_size = kRing;
  return base.WithValue(std::shared_ptr<const setpoint::Assignment>(a));
}

// A name whose shard in the ring of kRing is `shard`.
std::string NameIn(uint32_t shard, int skip = 0) {
  for (int i = 0;; ++i) {
    std::string name = "host-" + std::to_string(i) + ".example.com";
    if (setpoint::ShardOf(name, kRing) == shard && skip-- == 0) return name;
  }
}

class RecordsHttpTest : public ::testing::Test {
 protected:
  void SetUp() override { Serve({}); }

  void Serve(RecordsApiOptions api) {
    client_.reset();
    service_.reset();
    service_ = std::make_unique<RecordsApiService>(RecordsApiServiceOptions{
        .threads = 4, .max_body_bytes = 1024, .api = api});
    ASSERT_TRUE(service_->Start().ok());
    auto made = HttpRecordsApi::Create({.url = service_->url()});
    ASSERT_TRUE(made.ok()) << made.status();
    client_ = *std::move(made);
  }
  static RecordsApiOptions Quiet() {
    return {.latency = absl::ZeroDuration(),
            .unavailable_rate = 0,
            .throttle_rate = 0,
            .write_log_limit = 1000};
  }
  JsonValue Stats() {
    httplib::Client raw("127.0.0.1", service_->port());
    auto res = raw.Get("/v1/stats");
    EXPECT_TRUE(res && res->status == 200);
    auto v = ParseJson(res ? res->body : "");
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : JsonValue();
  }

  std::unique_ptr<RecordsApiService> service_;
  std::unique_ptr<HttpRecordsApi> client_;
};

TEST_F(RecordsHttpTest, AWriteOlderThanTheShardsNewestTokenIsStale) {
  Serve(Quiet());
  std::string name = NameIn(5);
  ASSERT_TRUE(
      client_->Put(As("a/records/0", {0, 32}, 7), name, {"10.0.0.1"}).ok());
  absl::Status stale =
      client_->Put(As("b/records/0", {0, 32}, 6), name, {"10.0.0.2"});
  EXPECT_TRUE(setpoint::IsStaleOwner(stale)) << stale;
  // The same token as the newest is the owner's own: accepted.
  EXPECT_TRUE(
      client_->Put(As("a/records/0", {0, 32}, 7), name, {"10.0.0.3"}).ok());
  EXPECT_TRUE(
      client_->Put(As("c/records/0", {0, 32}, 8), name, {"10.0.0.4"}).ok());
  EXPECT_TRUE(setpoint::IsStaleOwner(
      client_->Delete(As("a/records/0", {0, 32}, 7), name)));

  auto records = client_->List(setpoint::Context());
  ASSERT_TRUE(records.ok()) << records.status();
  EXPECT_EQ(records->at(name).address, "10.0.0.4");
  JsonValue stats = Stats();
  EXPECT_EQ(stats.IntOr("writes", -1), 3);
  EXPECT_EQ(stats.IntOr("stale_refused", -1), 2);
  const JsonValue* by_pod = stats.Find("stale_refused_by_pod");
  ASSERT_NE(by_pod, nullptr);
  EXPECT_EQ(by_pod->IntOr("a", -1), 1);
  EXPECT_EQ(by_pod->IntOr("b", -1), 1);
}

TEST_F(RecordsHttpTest, ATokenIsSeenForEveryShardItsWriterClaims) {
  Serve(Quiet());
  // The new owner of [0,32) writes one key of shard 3...
  ASSERT_TRUE(
      client_->Put(As("new/records/0", {0, 32}, 9), NameIn(3), {"10.0.0.1"})
          .ok());
  // ...so the old owner cannot write any key of [0,32), even one whose
  // shard nobody wrote since.
  absl::Status s =
      client_->Put(As("old/records/0", {0, 64}, 4), NameIn(20), {"10.0.0.2"});
  EXPECT_TRUE(setpoint::IsStaleOwner(s)) << s;
  // Shards outside the new owner's claim are still the old owner's.
  EXPECT_TRUE(
      client_->Put(As("old/records/0", {0, 64}, 4), NameIn(40), {"10.0.0.3"})
          .ok());
}

TEST_F(RecordsHttpTest, AWriteForAKeyOutsideTheClaimedRangeIsRefused) {
  Serve(Quiet());
  absl::Status s =
      client_->Put(As("a/records/0", {0, 10}, 1), NameIn(30), {"10.0.0.1"});
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  // Without an assignment the client sends none: refused the same way.
  s = client_->Put(setpoint::Context(), NameIn(30), {"10.0.0.1"});
  EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
  EXPECT_EQ(Stats().IntOr("unowned_refused", -1), 2);
  EXPECT_EQ(Stats().IntOr("writes", -1), 0);
}

TEST_F(RecordsHttpTest, TheLeadersSerialIsFencedToo) {
  Serve(Quiet());
  auto leader = [](uint64_t token) {
    auto a = std::make_shared<setpoint::Assignment>();
    a->node_id = "a/zone/0";
    a->kind = "zone";
    a->range = {0, 1};
    a->token = token;
    a->ring_size = 1;
    return setpoint::Context().WithValue(
        std::shared_ptr<const setpoint::Assignment>(a));
  };
  ASSERT_TRUE(client_->PublishSerial(leader(5), 12).ok());
  EXPECT_EQ(client_->serial(), 12);
  EXPECT_TRUE(setpoint::IsStaleOwner(client_->PublishSerial(leader(4), 13)));
  EXPECT_EQ(client_->serial(), 12);
}

TEST_F(RecordsHttpTest, InjectedErrorsComeBackRetryable) {
  Serve({.latency = absl::ZeroDuration(), .unavailable_rate = 1});
  absl::Status s =
      client_->Put(As("a/records/0", {0, 64}, 1), NameIn(1), {"10.0.0.1"});
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  Serve({.latency = absl::ZeroDuration(),
         .unavailable_rate = 0,
         .throttle_rate = 1});
  s = client_->Put(As("a/records/0", {0, 64}, 1), NameIn(1), {"10.0.0.1"});
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_EQ(setpoint::RetryAfterHint(s), absl::Milliseconds(200));
}

TEST_F(RecordsHttpTest, BadRequestsGet4xx) {
  Serve(Quiet());
  httplib::Client raw("127.0.0.1", service_->port());
  httplib::Headers claim = {{wire::kNodeHeader, "a/records/0"},
                            {wire::kKindHeader, "records"},
                            {wire::kRangeHeader, "0-64"},
                            {wire::kTokenHeader, "1"},
                            {wire::kRingHeader, "64"}};
  auto put = [&](const std::string& path, const std::string& body,
                 httplib::Headers headers) {
    auto res = raw.Put(path, headers, body, "application/json");
    return res ? res->status : -1;
  };
  EXPECT_EQ(put("/v1/records/h1", "not json", claim), 400);
  EXPECT_EQ(put("/v1/records/h1", "{\"address\": 5}", claim), 400);
  EXPECT_EQ(put("/v1/records/h1", "{\"address\": \"\"}", claim), 400);
  EXPECT_EQ(put("/v1/records/bad%20name", "{\"address\": \"a\"}", claim), 400);
  EXPECT_EQ(put("/v1/records/h1", std::string(2000, ' '), claim), 413);
  httplib::Headers bad_token = claim;
  bad_token.erase(wire::kTokenHeader);
  bad_token.emplace(wire::kTokenHeader, "-3");
  EXPECT_EQ(put("/v1/records/h1", "{\"address\": \"a\"}", bad_token), 400);
  httplib::Headers bad_range = claim;
  bad_range.erase(wire::kRangeHeader);
  bad_range.emplace(wire::kRangeHeader, "9-2");
  EXPECT_EQ(put("/v1/records/h1", "{\"address\": \"a\"}", bad_range), 400);
  httplib::Headers huge_ring = claim;
  huge_ring.erase(wire::kRingHeader);
  huge_ring.emplace(wire::kRingHeader, "4294967295");
  EXPECT_EQ(put("/v1/records/h1", "{\"address\": \"a\"}", huge_ring), 400);
  EXPECT_EQ(put("/v1/serial", "{\"serial\": -1}", claim), 400);
  auto missing = raw.Get("/v1/nothing");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  auto bad_from = raw.Get("/v1/writes?from=x");
  ASSERT_TRUE(bad_from);
  EXPECT_EQ(bad_from->status, 400);
  EXPECT_EQ(put("/v1/records/h1", "{\"address\": \"a\"}", claim), 200);
  EXPECT_GE(Stats().IntOr("bad_requests", -1), 10);
}

TEST_F(RecordsHttpTest, TheWriteLogHoldsEveryAcceptedWrite) {
  Serve(Quiet());
  ASSERT_TRUE(
      client_->Put(As("a/records/0", {0, 64}, 3), NameIn(7), {"10.0.0.1"})
          .ok());
  ASSERT_FALSE(
      client_->Put(As("b/records/0", {0, 64}, 2), NameIn(7), {"10.0.0.2"})
          .ok());
  httplib::Client raw("127.0.0.1", service_->port());
  auto res = raw.Get("/v1/writes?from=0");
  ASSERT_TRUE(res && res->status == 200);
  auto log = ParseJson(res->body);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(log->IntOr("next", -1), 1);
  const JsonValue* writes = log->Find("writes");
  ASSERT_TRUE(writes != nullptr && writes->items().size() == 1);
  const auto& w = writes->items()[0].items();
  ASSERT_EQ(w.size(), 6u);
  EXPECT_EQ(w[1].str(), "a/records/0");
  EXPECT_EQ(w[3].AsInt64(), 7);
  EXPECT_EQ(w[4].AsUint64(), 3u);
  ASSERT_EQ(w[5].items().size(), 1u);  // The claimed runs: [[0,64]].
  EXPECT_EQ(w[5].items()[0].items()[0].AsInt64(), 0);
  EXPECT_EQ(w[5].items()[0].items()[1].AsInt64(), 64);
}

TEST_F(RecordsHttpTest, TheClientSkipsAWriteThatIsAlreadyDone) {
  Serve(Quiet());
  auto writer = As("a/records/0", {0, 64}, 1);
  ASSERT_TRUE(client_->Put(writer, NameIn(2), {"10.0.0.1"}).ok());
  ASSERT_TRUE(client_->Put(writer, NameIn(2), {"10.0.0.1"}).ok());
  ASSERT_TRUE(client_->Delete(writer, NameIn(9)).ok());  // Never existed.
  EXPECT_EQ(Stats().IntOr("writes", -1), 1);
}

TEST_F(RecordsHttpTest, TheClientHonoursTheContextsDeadline) {
  // Every call waits 3 s in the API.
  Serve({.latency = absl::Seconds(3), .unavailable_rate = 0});
  absl::Time start = absl::Now();
  absl::Status s =
      client_->Put(As("a/records/0", {0, 64}, 1,
                      setpoint::Context().WithTimeout(absl::Milliseconds(200))),
                   NameIn(1), {"10.0.0.1"});
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  auto listed =
      client_->List(setpoint::Context().WithTimeout(absl::Milliseconds(200)));
  EXPECT_TRUE(absl::IsDeadlineExceeded(listed.status())) << listed.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_F(RecordsHttpTest, TheClientHonoursCancellation) {
  Serve({.latency = absl::Seconds(3), .unavailable_rate = 0});
  std::stop_source stop;
  setpoint::Context ctx(stop.get_token());
  absl::Time start = absl::Now();
  std::jthread cancel([&] {
    // Cancels the write once the API is busy with it.
    absl::Time until = absl::Now() + absl::Seconds(10);
    while (service_->api().stats().max_concurrent_per_key == 0 &&
           absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    stop.request_stop();
  });
  absl::Status s =
      client_->Put(As("a/records/0", {0, 64}, 1, ctx), NameIn(1), {"10.0.0.1"});
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  // Already cancelled: nothing is sent.
  EXPECT_TRUE(absl::IsCancelled(client_->List(ctx).status()));
  EXPECT_TRUE(absl::IsCancelled(client_->Put(As("a/records/0", {0, 64}, 1, ctx),
                                             NameIn(2), {"10.0.0.1"})));
}

TEST(HttpRecordsApiCreate, RefusesBadUrls) {
  for (const char* url :
       {"", "127.0.0.1:80", "http://", "http://h", "http://h:0",
        "http://h:70000", "http://h/x:80", "https://h:80"}) {
    EXPECT_FALSE(HttpRecordsApi::Create({.url = url}).ok()) << url;
  }
  EXPECT_TRUE(HttpRecordsApi::Create({.url = "http://127.0.0.1:80"}).ok());
}

TEST(JsonReader, ReadsWhatTheServiceWrites) {
  auto v = ParseJson(
      R"({"a": [1, -2.5e3, "x\u00e9\n", true, null], "t": 18446744073709551615})");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->Find("a")->items()[2].str(), "x\xc3\xa9\n");
  EXPECT_EQ(v->Find("t")->AsUint64(), 18446744073709551615u);
  EXPECT_FALSE(ParseJson("{\"a\": }").ok());
  EXPECT_FALSE(ParseJson("[1] x").ok());
  EXPECT_FALSE(ParseJson(std::string(100, '[')).ok());  // Too deep.
}

}  // namespace
}  // namespace sharded
