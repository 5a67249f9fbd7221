#include "http_request.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace setpoint {
namespace {

using ::testing::HasSubstr;

constexpr HttpLimits kLimits = {.max_head_bytes = 256, .max_body_bytes = 100};

HttpHeadResult Parse(const std::string& s) { return ParseHttpHead(s, kLimits); }

TEST(ParseHttpHeadTest, ReadsACompleteHead) {
  HttpHeadResult r = Parse(
      "GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc");
  ASSERT_EQ(r.state, HttpHeadResult::kComplete) << r.why;
  EXPECT_EQ(r.head.method, "GET");
  EXPECT_EQ(r.head.path, "/metrics");
  EXPECT_EQ(r.head.minor_version, 1);
  EXPECT_FALSE(r.head.close);
  EXPECT_EQ(r.head.content_length, 3u);
  EXPECT_EQ(r.head.head_bytes, 57u);  // The body starts there.
}

TEST(ParseHttpHeadTest, WaitsForTheRestWhileNothingIsWrong) {
  const std::string full = "GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n";
  for (size_t n = 0; n < full.size(); ++n) {
    EXPECT_EQ(Parse(full.substr(0, n)).state, HttpHeadResult::kIncomplete) << n;
  }
  EXPECT_EQ(Parse(full).state, HttpHeadResult::kComplete);
}

TEST(ParseHttpHeadTest, SkipsEmptyLinesBeforeTheRequest) {
  HttpHeadResult r = Parse("\r\n\r\nGET / HTTP/1.1\r\n\r\n");
  ASSERT_EQ(r.state, HttpHeadResult::kComplete);
  EXPECT_EQ(r.head.head_bytes, 22u);
}

TEST(ParseHttpHeadTest, ConnectionCloseAndHttp10) {
  EXPECT_TRUE(Parse("GET / HTTP/1.1\r\nConnection: close\r\n\r\n").head.close);
  EXPECT_TRUE(Parse("GET / HTTP/1.0\r\n\r\n").head.close);
  EXPECT_FALSE(
      Parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").head.close);
}

TEST(ParseHttpHeadTest, AbsoluteFormTargetsGiveTheirPath) {
  EXPECT_EQ(Parse("GET http://h:1/readyz HTTP/1.1\r\n\r\n").head.path,
            "/readyz");
}

void ExpectRefused(const std::string& input, int status,
                   const std::string& why) {
  HttpHeadResult r = Parse(input);
  EXPECT_EQ(r.state, HttpHeadResult::kRefused) << input;
  EXPECT_EQ(r.status, status) << input;
  EXPECT_THAT(r.why, HasSubstr(why)) << input;
}

TEST(ParseHttpHeadTest, RefusesGarbageOnItsFirstBadByte) {
  // Not complete, and still refused: no waiting for a line that cannot be.
  ExpectRefused("\x16\x03\x01", 400, "method");  // A TLS hello.
  ExpectRefused("GE\x01", 400, "method");
  ExpectRefused(" GET", 400, "method");
  ExpectRefused("GET /a\x7f", 400, "control byte");
  ExpectRefused("GET / FTP/", 400, "HTTP/1.x");
  ExpectRefused("GET / HTTP/x", 400, "not a number");
  ExpectRefused("GET /\nHost", 400, "bare CR or LF");
}

TEST(ParseHttpHeadTest, RefusesBadRequestLinesAndHeaders) {
  ExpectRefused("GET\r\n\r\n", 400, "no target");
  ExpectRefused("GET /\r\n\r\n", 400, "no HTTP version");
  ExpectRefused("GET / HTTP/2.0\r\n\r\n", 505, "HTTP/2.0");
  ExpectRefused("GET / HTTP/1.10\r\n", 505, "");
  ExpectRefused("GET metrics HTTP/1.1\r\n\r\n", 400, "not a path");
  ExpectRefused("GET / HTTP/1.1\r\nno colon\r\n\r\n", 400, "no name");
  ExpectRefused("GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", 400, "header name");
  ExpectRefused("GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", 400, "folded");
  ExpectRefused("GET / HTTP/1.1\r\nA: b\x01\r\n\r\n", 400, "control byte");
  ExpectRefused("GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400,
                "not a number");
  ExpectRefused(
      "GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", 400,
      "twice");
}

TEST(ParseHttpHeadTest, RefusesLargeBodiesBeforeTheyArrive) {
  // The head is not complete: the Content-Length alone decides.
  ExpectRefused("POST / HTTP/1.1\r\nContent-Length: 104857600\r\n", 413,
                "the limit is 100");
  ExpectRefused("GET / HTTP/1.1\r\nContent-Length: 101\r\n\r\n", 413, "");
  EXPECT_EQ(Parse("GET / HTTP/1.1\r\nContent-Length: 100\r\n\r\n").state,
            HttpHeadResult::kComplete);
  ExpectRefused("GET / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n",
                400, "not a number");
}

TEST(ParseHttpHeadTest, RefusesExpectAndTransferEncoding) {
  ExpectRefused("POST / HTTP/1.1\r\nExpect: 100-continue\r\n", 417,
                "no 100 Continue");
  ExpectRefused("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n", 501,
                "Content-Length");
}

TEST(ParseHttpHeadTest, RefusesOversizedHeads) {
  ExpectRefused("GET /" + std::string(300, 'a'), 414, "longer than 256");
  ExpectRefused("GET / HTTP/1.1\r\nX: " + std::string(300, 'a'), 431,
                "longer than 256");
  ExpectRefused(std::string(150, '\r'), 400, "bare CR or LF");
  std::string blank_lines;
  for (int i = 0; i < 200; ++i) blank_lines += "\r\n";
  ExpectRefused(blank_lines, 400, "empty lines");
}

TEST(ParseHttpHeadTest, NeverCrashesOnAnyPrefixOfMixedInput) {
  const std::string inputs[] = {
      "GET / HTTP/1.1\r\nA:\r\n\r\n", "\r\n\r\n\r",
      "GET  HTTP/1.1\r\n\r\n",        "G / HTTP/1.1\r\n\r\n\r\n",
      "GET / HTTP/1.1\r\n:\r\n\r\n",  std::string("\0\0\0", 3)};
  for (const std::string& in : inputs) {
    for (size_t n = 0; n <= in.size(); ++n) {
      HttpHeadResult r = Parse(in.substr(0, n));
      if (r.state == HttpHeadResult::kRefused) {
        EXPECT_GE(r.status, 400);
        EXPECT_FALSE(r.why.empty());
      }
    }
  }
}

}  // namespace
}  // namespace setpoint
