#include "chaos/tcp_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <vector>

#include "absl/strings/str_cat.h"

namespace setpoint::chaos {
namespace {

// Stop reading a side once this much waits to be written to the other.
constexpr size_t kMaxQueued = 1 << 20;

int64_t NowNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void SetNonBlocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Closes with a reset instead of a FIN: the peer sees ECONNRESET.
void ResetClose(int fd) {
  if (fd < 0) return;
  linger l{.l_onoff = 1, .l_linger = 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  close(fd);
}

// A non-blocking connect to 127.0.0.1:port, waiting at most 200 ms (a
// stopped server's kernel still completes the handshake; a dead one
// refuses at once). Returns the socket, or -1.
int ConnectLoopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  SetNonBlocking(fd);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    return fd;
  }
  if (errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
  int err = 0;
  socklen_t len = sizeof(err);
  if (poll(&p, 1, 200) != 1 ||
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

struct TcpProxy::Conn {
  struct Chunk {
    int64_t due;
    std::string data;
    size_t off = 0;
  };
  int client = -1;
  int upstream = -1;
  std::deque<Chunk> to_upstream, to_client;
  size_t queued_upstream = 0, queued_client = 0;
  bool client_eof = false, upstream_eof = false;
  bool dead = false;  // An error on either side: reset both.
};

absl::StatusOr<std::unique_ptr<TcpProxy>> TcpProxy::Start(int upstream_port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("tcp proxy: socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, 128) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return absl::InternalError("tcp proxy: cannot listen on 127.0.0.1");
  }
  SetNonBlocking(fd);
  int wake[2];
  if (pipe2(wake, O_CLOEXEC | O_NONBLOCK) != 0) {
    close(fd);
    return absl::InternalError("tcp proxy: pipe failed");
  }
  return std::unique_ptr<TcpProxy>(
      new TcpProxy(fd, ntohs(addr.sin_port), upstream_port, wake));
}

TcpProxy::TcpProxy(int listen_fd, int port, int upstream_port, int wake_fd[2])
    : listen_fd_(listen_fd),
      port_(port),
      upstream_port_(upstream_port),
      wake_read_(wake_fd[0]),
      wake_write_(wake_fd[1]) {
  thread_ = std::jthread([this](std::stop_token stop) {
    pthread_setname_np(pthread_self(), "chaos-proxy");
    Loop(stop);
  });
}

TcpProxy::~TcpProxy() {
  thread_.request_stop();
  Wake();
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(wake_read_);
  close(wake_write_);
}

std::string TcpProxy::address() const {
  return absl::StrCat("127.0.0.1:", port_);
}

void TcpProxy::Wake() {
  char c = 1;
  ssize_t n = write(wake_write_, &c, 1);
  (void)n;  // A full pipe already wakes the loop.
}

void TcpProxy::Partition(bool on, bool refuse_new) {
  {
    MutexLock l(&mu_);
    partitioned_ = on;
    refuse_new_ = on && refuse_new;
  }
  Wake();
}

void TcpProxy::SetDelay(absl::Duration delay) {
  int64_t generation;
  {
    MutexLock l(&mu_);
    delay_ns_ = std::max<int64_t>(0, absl::ToInt64Nanoseconds(delay));
    generation = ++delay_generation_;
  }
  Wake();
  // Until the loop has read it (bounded: a stopped loop reads nothing).
  MutexLock l(&mu_);
  delay_seen_cv_.WaitUntil(
      &mu_, {}, std::chrono::steady_clock::now() + std::chrono::seconds(2),
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return delay_seen_ >= generation;
      });
}

void TcpProxy::KillConnections() {
  {
    MutexLock l(&mu_);
    ++kill_generation_;
  }
  Wake();
}

void TcpProxy::Heal() {
  {
    MutexLock l(&mu_);
    partitioned_ = false;
    refuse_new_ = false;
    delay_ns_ = 0;
  }
  Wake();
}

TcpProxyStats TcpProxy::stats() const {
  MutexLock l(&mu_);
  return stats_;
}

void TcpProxy::Loop(std::stop_token stop) {
  std::vector<std::unique_ptr<Conn>> conns;
  int64_t seen_kill = 0;
  std::vector<char> buf(64 * 1024);
  auto close_all = [&](bool reset) {
    for (auto& c : conns) {
      if (reset) {
        ResetClose(c->client);
        ResetClose(c->upstream);
      } else {
        close(c->client);
        close(c->upstream);
      }
    }
    conns.clear();
  };
  // The controls as of the last wake-up: what to watch while waiting.
  bool partitioned = false;
  int64_t delay = 0;
  while (!stop.stop_requested()) {
    int64_t now = NowNanos();
    int64_t next_due = INT64_MAX;
    std::vector<pollfd> fds;
    fds.push_back({.fd = listen_fd_, .events = POLLIN, .revents = 0});
    fds.push_back({.fd = wake_read_, .events = POLLIN, .revents = 0});
    for (auto& c : conns) {
      short ce = 0, ue = 0;
      if (!partitioned) {
        if (!c->client_eof && c->queued_upstream < kMaxQueued) ce |= POLLIN;
        if (!c->upstream_eof && c->queued_client < kMaxQueued) ue |= POLLIN;
        if (!c->to_upstream.empty()) {
          if (c->to_upstream.front().due <= now) {
            ue |= POLLOUT;
          } else {
            next_due = std::min(next_due, c->to_upstream.front().due);
          }
        }
        if (!c->to_client.empty()) {
          if (c->to_client.front().due <= now) {
            ce |= POLLOUT;
          } else {
            next_due = std::min(next_due, c->to_client.front().due);
          }
        }
      }
      // During a partition the connections are not watched at all (a
      // reset peer would make poll return at once, forever).
      fds.push_back(
          {.fd = partitioned ? -1 : c->client, .events = ce, .revents = 0});
      fds.push_back(
          {.fd = partitioned ? -1 : c->upstream, .events = ue, .revents = 0});
    }
    int timeout_ms = 100;
    if (next_due != INT64_MAX) {
      int64_t wait = (next_due - now + 999'999) / 1'000'000;
      timeout_ms = static_cast<int>(std::clamp<int64_t>(wait, 0, 100));
    }
    int ready = poll(fds.data(), fds.size(), timeout_ms);
    if (ready < 0 && errno != EINTR) break;
    if (fds[1].revents & POLLIN) {
      char drain[64];
      while (read(wake_read_, drain, sizeof(drain)) > 0) {
      }
    }
    // Controls changed while we waited apply to everything read below.
    int64_t kill_generation;
    {
      MutexLock l(&mu_);
      partitioned = partitioned_;
      delay = delay_ns_;
      delay_seen_ = delay_generation_;
      delay_seen_cv_.SignalAll();
      kill_generation = kill_generation_;
      if (kill_generation != seen_kill) {
        stats_.killed += static_cast<int64_t>(conns.size());
      }
      stats_.open = static_cast<int64_t>(conns.size());
    }
    if (kill_generation != seen_kill) {
      seen_kill = kill_generation;
      close_all(/*reset=*/true);
    }
    if (fds[0].revents & POLLIN) {
      while (true) {
        int client =
            accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (client < 0) break;
        bool refuse_now;
        {
          MutexLock l(&mu_);
          refuse_now = partitioned_ && refuse_new_;
        }
        int upstream = refuse_now ? -1 : ConnectLoopback(upstream_port_);
        if (upstream < 0) {
          {
            // Counted before the reset, so a client that saw the reset
            // also sees the count.
            MutexLock l(&mu_);
            ++stats_.refused;
          }
          ResetClose(client);
          continue;
        }
        NoDelay(client);
        NoDelay(upstream);
        auto c = std::make_unique<Conn>();
        c->client = client;
        c->upstream = upstream;
        conns.push_back(std::move(c));
        MutexLock l(&mu_);
        ++stats_.accepted;
      }
    }
    if (partitioned) continue;
    // Every connection is tried (non-blocking): a few per proxy.
    int64_t forwarded = 0;
    now = NowNanos();
    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = *conns[i];
      auto read_side = [&](int fd, bool& eof, std::deque<Conn::Chunk>& queue,
                           size_t& queued) {
        if (eof || queued >= kMaxQueued) return;
        ssize_t n = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
        if (n > 0) {
          queue.push_back({.due = now + delay,
                           .data = std::string(buf.data(), n),
                           .off = 0});
          queued += static_cast<size_t>(n);
        } else if (n == 0) {
          eof = true;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          c.dead = true;
        }
      };
      auto write_side = [&](int fd, std::deque<Conn::Chunk>& queue,
                            size_t& queued) {
        while (!queue.empty() && queue.front().due <= now && !c.dead) {
          Conn::Chunk& chunk = queue.front();
          ssize_t n =
              send(fd, chunk.data.data() + chunk.off,
                   chunk.data.size() - chunk.off, MSG_NOSIGNAL | MSG_DONTWAIT);
          if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
              c.dead = true;
            }
            return;
          }
          chunk.off += static_cast<size_t>(n);
          queued -= static_cast<size_t>(n);
          forwarded += n;
          if (chunk.off < chunk.data.size()) return;
          queue.pop_front();
        }
      };
      read_side(c.client, c.client_eof, c.to_upstream, c.queued_upstream);
      read_side(c.upstream, c.upstream_eof, c.to_client, c.queued_client);
      write_side(c.upstream, c.to_upstream, c.queued_upstream);
      write_side(c.client, c.to_client, c.queued_client);
    }
    for (size_t i = 0; i < conns.size();) {
      Conn& c = *conns[i];
      if (c.dead) {
        ResetClose(c.client);
        ResetClose(c.upstream);
      } else if ((c.client_eof && c.to_upstream.empty()) ||
                 (c.upstream_eof && c.to_client.empty())) {
        close(c.client);
        close(c.upstream);
      } else {
        ++i;
        continue;
      }
      conns.erase(conns.begin() + static_cast<ptrdiff_t>(i));
    }
    MutexLock l(&mu_);
    stats_.bytes += forwarded;
    stats_.open = static_cast<int64_t>(conns.size());
  }
  close_all(/*reset=*/false);
}

}  // namespace setpoint::chaos
