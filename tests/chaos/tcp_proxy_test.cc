// TcpProxy against a loopback echo server: forwarding, a partition that
// holds bytes and connections, refused connections, delay, resets.
#include "chaos/tcp_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace setpoint::chaos {
namespace {

int64_t NowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
}

// Echoes every byte back, one thread per connection.
class EchoServer {
 public:
  EchoServer() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(fd_, 16);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::jthread([this](std::stop_token stop) {
      while (!stop.stop_requested()) {
        pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
        if (poll(&p, 1, 50) != 1) continue;
        int c = accept(fd_, nullptr, nullptr);
        if (c < 0) continue;
        conns_.emplace_back([c](std::stop_token s) {
          char buf[256];
          while (!s.stop_requested()) {
            pollfd q{.fd = c, .events = POLLIN, .revents = 0};
            if (poll(&q, 1, 50) != 1) continue;
            ssize_t n = read(c, buf, sizeof(buf));
            if (n <= 0 || write(c, buf, n) != n) break;
          }
          close(c);
        });
      }
    });
  }
  ~EchoServer() {
    thread_.request_stop();
    thread_.join();
    conns_.clear();
    close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::vector<std::jthread> conns_;
  std::jthread thread_;
};

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Reads `n` bytes within `timeout_ms`; returns what arrived. Sets *err on
// a reset or close.
std::string ReadSome(int fd, size_t n, int timeout_ms, int* err = nullptr) {
  std::string out;
  int64_t deadline = NowMs() + timeout_ms;
  while (out.size() < n) {
    int left = static_cast<int>(deadline - NowMs());
    if (left <= 0) break;
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    if (poll(&p, 1, left) != 1) break;
    char buf[256];
    ssize_t r = read(fd, buf, sizeof(buf));
    if (r <= 0) {
      if (err != nullptr) *err = r == 0 ? -1 : errno;
      break;
    }
    out.append(buf, static_cast<size_t>(r));
  }
  return out;
}

bool Send(int fd, const std::string& s) {
  return send(fd, s.data(), s.size(), MSG_NOSIGNAL) ==
         static_cast<ssize_t>(s.size());
}

TEST(TcpProxyTest, ForwardsBothWays) {
  EchoServer echo;
  auto proxy = TcpProxy::Start(echo.port());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  int fd = Connect((*proxy)->port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(Send(fd, "ping"));
  EXPECT_EQ(ReadSome(fd, 4, 2000), "ping");
  EXPECT_EQ((*proxy)->stats().accepted, 1);
  close(fd);
}

TEST(TcpProxyTest, APartitionHoldsBytesAndConnectionsUntilItHeals) {
  EchoServer echo;
  auto proxy = TcpProxy::Start(echo.port());
  ASSERT_TRUE(proxy.ok());
  int fd = Connect((*proxy)->port());
  ASSERT_TRUE(Send(fd, "a"));
  EXPECT_EQ(ReadSome(fd, 1, 2000), "a");
  (*proxy)->Partition(true);
  ASSERT_TRUE(Send(fd, "held"));
  int err = 0;
  EXPECT_EQ(ReadSome(fd, 4, 300, &err), "");
  EXPECT_EQ(err, 0) << "the connection must stay open";
  // A new connection is accepted and held too.
  int fd2 = Connect((*proxy)->port());
  ASSERT_GE(fd2, 0);
  ASSERT_TRUE(Send(fd2, "b"));
  EXPECT_EQ(ReadSome(fd2, 1, 200, &err), "");
  (*proxy)->Partition(false);
  EXPECT_EQ(ReadSome(fd, 4, 2000), "held");
  EXPECT_EQ(ReadSome(fd2, 1, 2000), "b");
  close(fd);
  close(fd2);
}

TEST(TcpProxyTest, APartitionCanRefuseNewConnections) {
  EchoServer echo;
  auto proxy = TcpProxy::Start(echo.port());
  ASSERT_TRUE(proxy.ok());
  (*proxy)->Partition(true, /*refuse_new=*/true);
  int fd = Connect((*proxy)->port());  // The kernel accepts; the proxy resets.
  ASSERT_GE(fd, 0);
  int err = 0;
  EXPECT_EQ(ReadSome(fd, 1, 2000, &err), "");
  EXPECT_NE(err, 0);
  EXPECT_EQ((*proxy)->stats().refused, 1);
  close(fd);
}

TEST(TcpProxyTest, DelayAppliesToEachDirection) {
  EchoServer echo;
  auto proxy = TcpProxy::Start(echo.port());
  ASSERT_TRUE(proxy.ok());
  int fd = Connect((*proxy)->port());
  (*proxy)->SetDelay(absl::Milliseconds(150));
  int64_t start = NowMs();
  ASSERT_TRUE(Send(fd, "slow"));
  EXPECT_EQ(ReadSome(fd, 4, 3000), "slow");
  EXPECT_GE(NowMs() - start, 300);  // 150 ms there and 150 ms back.
  (*proxy)->Heal();
  start = NowMs();
  ASSERT_TRUE(Send(fd, "fast"));
  EXPECT_EQ(ReadSome(fd, 4, 3000), "fast");
  EXPECT_LT(NowMs() - start, 250);
  close(fd);
}

TEST(TcpProxyTest, KillConnectionsResetsThem) {
  EchoServer echo;
  auto proxy = TcpProxy::Start(echo.port());
  ASSERT_TRUE(proxy.ok());
  int fd = Connect((*proxy)->port());
  ASSERT_TRUE(Send(fd, "x"));
  EXPECT_EQ(ReadSome(fd, 1, 2000), "x");
  (*proxy)->KillConnections();
  int err = 0;
  EXPECT_EQ(ReadSome(fd, 1, 2000, &err), "");
  EXPECT_EQ(err, ECONNRESET);
  EXPECT_EQ((*proxy)->stats().killed, 1);
  close(fd);
}

TEST(TcpProxyTest, AnUnreachableUpstreamResetsTheClient) {
  int port = 0;
  {
    EchoServer gone;
    port = gone.port();
  }
  auto proxy = TcpProxy::Start(port);
  ASSERT_TRUE(proxy.ok());
  int fd = Connect((*proxy)->port());
  ASSERT_GE(fd, 0);
  int err = 0;
  EXPECT_EQ(ReadSome(fd, 1, 2000, &err), "");
  EXPECT_NE(err, 0);
  close(fd);
}

}  // namespace
}  // namespace setpoint::chaos
