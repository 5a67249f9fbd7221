// HTTP load for a pod's ops listener, the way misbehaving clients load it:
// idle connections that send nothing, slowloris connections that send a
// header byte a second, keep-alive scrapers, and fresh probes timed one by
// one. The listener test (a real pod process) and bench/ops_listener_bench
// use it against the same targets.
//
//   setpoint::http_load::Load load(port, {.idle = 300, .slowloris = 50,
//                                         .scrapers = 4});
//   load.Start();
//   auto answer = setpoint::http_load::Fetch(port, "GET /healthz ...",
//                                            absl::Seconds(1));
//   load.Stop();
//
// Only loopback addresses; every loop is bounded by Stop().
//
// Thread safety: Fetch and Percentile are reentrant. Load belongs to its
// owner; its threads are its own and Stop() joins them.
#ifndef SETPOINT_TESTS_POD_HTTP_LOAD_H_
#define SETPOINT_TESTS_POD_HTTP_LOAD_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace setpoint::http_load {

// A non-blocking TCP socket connecting to 127.0.0.1:port (the connect may
// still be in progress), or -1.
inline int ConnectAsync(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 &&
      errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

// Waits for `events` on fd until `deadline`; false when it passed.
inline bool WaitFor(int fd, short events, absl::Time deadline) {
  for (;;) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms < 0) return false;
    pollfd p{.fd = fd, .events = events, .revents = 0};
    int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms + 1, 60000)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

// One answer read off a connection.
struct Answer {
  int status = 0;  // 0: none (see error).
  std::string head;
  std::string body;
  absl::Duration took;
  std::string error;  // Why there is no answer: "timeout", "closed", ...
  bool ok() const { return status != 0; }
};

// Reads one response (a head, then Content-Length bytes of body; the body
// of a HEAD request when `head_only`) from fd by `deadline`. Bytes past it
// stay in `*buffer` (pipelined answers).
inline Answer ReadAnswer(int fd, absl::Time deadline, std::string* buffer,
                         bool head_only = false) {
  Answer a;
  size_t head_end = std::string::npos;
  size_t length = 0;
  char chunk[64 << 10];
  for (;;) {
    if (head_end == std::string::npos) {
      head_end = buffer->find("\r\n\r\n");
      if (head_end != std::string::npos) {
        a.head = buffer->substr(0, head_end + 4);
        // "HTTP/1.1 200 OK"
        if (a.head.size() < 12 || !absl::StartsWith(a.head, "HTTP/1.") ||
            !absl::SimpleAtoi(a.head.substr(9, 3), &a.status)) {
          a.status = 0;
          a.error = "not an HTTP response";
          return a;
        }
        for (absl::string_view line : absl::StrSplit(a.head, "\r\n")) {
          if (absl::StartsWithIgnoreCase(line, "content-length:")) {
            std::string v(absl::StripAsciiWhitespace(line.substr(15)));
            (void)absl::SimpleAtoi(v, &length);
          }
        }
        if (head_only) length = 0;
      }
    }
    if (head_end != std::string::npos &&
        buffer->size() >= head_end + 4 + length) {
      a.body = buffer->substr(head_end + 4, length);
      buffer->erase(0, head_end + 4 + length);
      return a;
    }
    if (!WaitFor(fd, POLLIN, deadline)) {
      a.status = 0;
      a.error = "timeout";
      return a;
    }
    ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
    if (n > 0) {
      buffer->append(chunk, static_cast<size_t>(n));
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
      a.status = 0;
      a.error = n == 0 ? "closed" : "reset";
      return a;
    }
  }
}

// Sends all of `data` by `deadline`.
inline bool SendAll(int fd, absl::string_view data, absl::Time deadline) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 &&
               (errno == EAGAIN || errno == ENOTCONN || errno == EINTR)) {
      if (!WaitFor(fd, POLLOUT, deadline)) return false;
    } else {
      return false;
    }
  }
  return true;
}

// Connects, sends `request` as it is, reads one answer: all by `timeout`
// from the call (connecting included).
inline Answer Fetch(int port, absl::string_view request,
                    absl::Duration timeout) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  Answer a;
  int fd = ConnectAsync(port);
  if (fd < 0) {
    a.error = "connect failed";
    return a;
  }
  std::string buffer;
  if (!SendAll(fd, request, deadline)) {
    a.error = absl::Now() >= deadline ? "timeout" : "send failed";
  } else {
    a = ReadAnswer(fd, deadline, &buffer, absl::StartsWith(request, "HEAD "));
  }
  a.took = absl::Now() - start;
  close(fd);
  return a;
}

// "GET <path> HTTP/1.1" with a Host header, keeping the connection open
// unless `close`.
inline std::string Get(absl::string_view path, bool close_after = true) {
  return absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                      close_after ? "Connection: close\r\n" : "", "\r\n");
}

// The q-quantile (0..1) of `v` by the nearest rank; 0 for none.
inline double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank = static_cast<size_t>(q * static_cast<double>(v.size()) + 0.999);
  rank = std::clamp<size_t>(rank, 1, v.size());
  return v[rank - 1];
}

struct LoadOptions {
  // Connections that connect and send nothing; reopened when closed.
  int idle = 300;
  // Connections that send a request line, then one header byte every
  // `slowloris_interval`; reopened when closed.
  int slowloris = 50;
  absl::Duration slowloris_interval = absl::Seconds(1);
  // Keep-alive clients that GET `scrape_path` every `scrape_interval`,
  // each answer within `scrape_timeout`.
  int scrapers = 4;
  std::string scrape_path = "/metrics";
  absl::Duration scrape_interval = absl::Milliseconds(100);
  absl::Duration scrape_timeout = absl::Seconds(5);
};

// Runs the load on its own threads until Stop().
class Load {
 public:
  Load(int port, LoadOptions options) : port_(port), options_(options) {}
  ~Load() { Stop(); }
  Load(const Load&) = delete;
  Load& operator=(const Load&) = delete;

  void Start() {
    threads_.emplace_back([this] { Hold(); });
    for (int i = 0; i < options_.scrapers; ++i) {
      threads_.emplace_back([this] { Scrape(); });
    }
  }
  void Stop() {
    stop_.store(true);
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  int64_t scrapes() const { return scrapes_.load(); }
  int64_t scrape_failures() const { return scrape_failures_.load(); }
  // Idle and slowloris connections the server closed (and were reopened).
  int64_t reopened() const { return reopened_.load(); }
  // Idle and slowloris connections open now (connected or connecting).
  int64_t open() const { return open_.load(); }
  std::vector<double> scrape_seconds() const {
    std::lock_guard<std::mutex> l(mu_);
    return scrape_seconds_;
  }

 private:
  struct Held {
    int fd = -1;
    bool slow = false;
    size_t sent = 0;  // Slowloris: header bytes sent so far.
  };

  // Idle and slowloris connections, on one thread.
  void Hold() {
    std::vector<Held> held(options_.idle + options_.slowloris);
    for (size_t i = 0; i < held.size(); ++i) {
      held[i].slow = static_cast<int>(i) >= options_.idle;
    }
    absl::Time next_byte = absl::Now();
    while (!stop_.load()) {
      int open = 0;
      const bool byte_due = absl::Now() >= next_byte;
      if (byte_due) next_byte = absl::Now() + options_.slowloris_interval;
      for (Held& h : held) {
        if (h.fd >= 0 && Closed(h.fd)) {
          close(h.fd);
          h.fd = -1;
          reopened_.fetch_add(1);
        }
        if (h.fd < 0) {
          h.fd = ConnectAsync(port_);
          h.sent = 0;
          if (h.fd >= 0 && h.slow) {
            // The request line at once, the headers a byte at a time.
            (void)send(h.fd, "GET /metrics HTTP/1.1\r\n", 23, MSG_NOSIGNAL);
          }
        }
        if (h.fd >= 0) ++open;
        if (h.fd >= 0 && h.slow && byte_due) {
          char c = "X-Slow: a"[std::min<size_t>(h.sent, 8)];
          if (send(h.fd, &c, 1, MSG_NOSIGNAL) == 1) ++h.sent;
        }
      }
      open_.store(open);
      WaitAny(held, absl::Milliseconds(50));
    }
    for (Held& h : held) {
      if (h.fd >= 0) close(h.fd);
    }
    open_.store(0);
  }

  // True when the peer closed fd (or reset it).
  static bool Closed(int fd) {
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK;
    // An answer (a 408, a 503): the server is done with it; close.
    return true;
  }

  void WaitAny(const std::vector<Held>& held, absl::Duration at_most) {
    std::vector<pollfd> fds;
    for (const Held& h : held) {
      if (h.fd >= 0)
        fds.push_back({.fd = h.fd, .events = POLLIN, .revents = 0});
    }
    (void)poll(fds.data(), fds.size(),
               static_cast<int>(absl::ToInt64Milliseconds(at_most)));
  }

  void Scrape() {
    int fd = -1;
    std::string buffer;
    while (!stop_.load()) {
      const absl::Time start = absl::Now();
      Answer a = ScrapeOnce(&fd, &buffer, start + options_.scrape_timeout);
      if (a.status == 200) {
        scrapes_.fetch_add(1);
        AddScrapeSeconds(absl::ToDoubleSeconds(absl::Now() - start));
      } else if (!stop_.load()) {
        scrape_failures_.fetch_add(1);
      }
      const absl::Time next = start + options_.scrape_interval;
      while (!stop_.load() && absl::Now() < next) {
        absl::SleepFor(std::min(next - absl::Now(), absl::Milliseconds(20)));
      }
    }
    if (fd >= 0) close(fd);
  }

  // One GET on the kept connection (opened if there is none). A kept
  // connection that the server closed before any byte of the answer (its
  // idle timeout, request cap or connection limit raced the request) is
  // retried once on a new one, as HTTP clients do for idempotent requests.
  Answer ScrapeOnce(int* fd, std::string* buffer, absl::Time deadline) {
    Answer a;
    for (int attempt = 0; attempt < 2; ++attempt) {
      const bool reused = *fd >= 0;
      if (!reused) {
        *fd = ConnectAsync(port_);
        buffer->clear();
      }
      a = Answer{};
      if (*fd >= 0 &&
          SendAll(*fd, Get(options_.scrape_path, /*close_after=*/false),
                  deadline)) {
        a = ReadAnswer(*fd, deadline, buffer);
      }
      const bool keep =
          a.status == 200 && !absl::StrContains(absl::AsciiStrToLower(a.head),
                                                "connection: close");
      if (!keep && *fd >= 0) {
        close(*fd);
        *fd = -1;
      }
      const bool raced = reused && a.status == 0 && a.head.empty() &&
                         (a.error == "closed" || a.error == "reset");
      if (!raced) break;
    }
    return a;
  }

  void AddScrapeSeconds(double s) {
    std::lock_guard<std::mutex> l(mu_);
    if (scrape_seconds_.size() < 100'000) scrape_seconds_.push_back(s);
  }

  const int port_;
  const LoadOptions options_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  std::atomic<int64_t> scrapes_{0}, scrape_failures_{0}, reopened_{0}, open_{0};
  mutable std::mutex mu_;
  std::vector<double> scrape_seconds_;  // Guarded by mu_; at most 100,000.
};

}  // namespace setpoint::http_load

#endif  // SETPOINT_TESTS_POD_HTTP_LOAD_H_
