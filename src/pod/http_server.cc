// Design. One loop thread owns every socket: it accepts, reads, parses
// (ParseHttpHead, a pure function), writes and enforces the deadlines; it
// never runs a handler. A complete request goes to its lane's worker
// (a queue and a thread each); the answer comes back through `done_` and an
// eventfd. Each connection is in one phase:
//
//   kIdle      no byte of the next request yet (deadline: accept +
//              request_timeout for a first request, else keep_alive_timeout)
//   kHead      receiving a head; kBody receiving its body (deadline: first
//              byte + request_timeout, never moved by later bytes)
//   kServing   a worker has the request; bytes that arrive (pipelined
//              requests) wait in `in`, reading stops once `in` holds a
//              head and a body's worth
//   kWriting   the answer goes out (deadline: write_timeout)
//   kDraining  answered and shut for writing, unread input is read and
//              dropped for a moment, so closing does not reset the answer
//
// The loop wakes for IO, for an answer, or at the earliest deadline (a
// scan of the connections: at most max_connections). One annotated mutex
// guards the lanes' queues and `done_`.
#include "http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "setpoint/base/callback.h"
#include "setpoint/base/format.h"
#include "setpoint/base/mutex.h"
#include "spdlog/spdlog.h"

namespace setpoint {
namespace {

using Clock = std::chrono::steady_clock;
using Tp = Clock::time_point;

Tp After(Tp now, absl::Duration d) {
  return now + std::chrono::duration_cast<Clock::duration>(
                   absl::ToChronoNanoseconds(d));
}

constexpr uint64_t kListenId = 0;
// Connections taken per wake-up of the listening socket (Accept).
constexpr int kAcceptBatch = 16;
constexpr uint64_t kWakeId = 1;
// How long a closing connection's unread input is drained.
constexpr auto kDrainFor = std::chrono::milliseconds(500);

std::string Serialize(const HttpAnswer& a, bool head_only, bool close) {
  std::string out =
      absl::StrCat("HTTP/1.1 ", a.status, " ", HttpReason(a.status),
                   "\r\nContent-Type: ", a.content_type,
                   "\r\nContent-Length: ", a.body.size(), "\r\n");
  for (const auto& [name, value] : a.headers) {
    absl::StrAppend(&out, name, ": ", value, "\r\n");
  }
  if (close) out.append("Connection: close\r\n");
  out.append("\r\n");
  if (!head_only) out.append(a.body);
  return out;
}

}  // namespace

struct HttpServer::Impl {
  enum class Phase { kIdle, kHead, kBody, kServing, kWriting, kDraining };
  struct Conn {
    int fd = -1;
    uint64_t id = 0;
    Phase phase = Phase::kIdle;
    Tp deadline;
    Tp since;  // Entered this phase (the eviction order of idle ones).
    std::string in;
    std::string out;
    size_t out_sent = 0;
    int requests = 0;
    bool close_after = false;
    bool first = true;
    // The client shut its side: nothing more to read; a request that is
    // complete is still answered, then the connection closes.
    bool peer_closed = false;
    HttpHead head;
    uint32_t events = 0;  // What epoll watches now.
  };
  struct Job {
    uint64_t conn = 0;
    HttpHead head;
  };
  struct Done {
    uint64_t conn = 0;
    HttpAnswer answer;
  };
  struct Lane {
    std::deque<Job> queue;
    std::thread thread;
  };

  Options options;
  int listen_fd = -1;
  int epoll_fd = -1;
  int wake_fd = -1;
  int port = 0;
  std::thread loop;
  std::atomic<bool> stopping{false};
  bool stopped = false;

  // Loop thread only.
  absl::flat_hash_map<uint64_t, std::unique_ptr<Conn>> conns;
  uint64_t next_id = 2;

  mutable Mutex mu;
  CondVar work_cv;
  std::vector<Lane> lanes ABSL_GUARDED_BY(mu);
  std::vector<Done> done ABSL_GUARDED_BY(mu);
  bool workers_stop ABSL_GUARDED_BY(mu) = false;
  std::vector<std::thread> workers;

  // Written by the loop, read by stats().
  struct Counts {
    std::atomic<int64_t> open{0}, accepted{0}, closed_for_limit{0},
        closed_request_timeout{0}, closed_idle{0}, closed_write_timeout{0},
        refused_full{0}, requests{0}, refused_requests{0};
  } counts;

  // ---- Loop --------------------------------------------------------------

  void Loop() {
    pthread_setname_np(pthread_self(), "sp-ops-http");
    epoll_event events[64];
    while (!stopping.load()) {
      const int timeout_ms = NextTimeoutMs();
      int n = epoll_wait(epoll_fd, events, 64, timeout_ms);
      if (n < 0 && errno != EINTR) {
        SPDLOG_LOGGER_ERROR(options.logger, "ops listener stopped: epoll: {}",
                            strerror(errno));
        break;
      }
      // New connections are taken after what the others sent is read: at
      // the connection limit an accept may close an idle one, and one whose
      // request is in must be read first.
      bool accept = false;
      for (int i = 0; i < n; ++i) {
        const uint64_t id = events[i].data.u64;
        if (id == kListenId) {
          accept = true;
        } else if (id == kWakeId) {
          uint64_t v;
          (void)!read(wake_fd, &v, sizeof(v));
          TakeAnswers();
        } else if (auto it = conns.find(id); it != conns.end()) {
          OnEvents(*it->second, events[i].events);
        }
      }
      if (accept) Accept();
      ExpireDeadlines();
      ReportShedding();
    }
    for (auto& [id, c] : conns) close(c->fd);
    conns.clear();
    counts.open.store(0);
  }

  // At most one warning per kShedReportEvery, naming what the listener
  // closed or refused since the last one (the clients see only a closed
  // connection or a 408/503).
  static constexpr auto kShedReportEvery = std::chrono::seconds(10);
  Tp next_shed_report{};
  int64_t shed_reported[5] = {0, 0, 0, 0, 0};
  void ReportShedding() {
    const Tp now = Clock::now();
    if (now < next_shed_report) return;
    const int64_t now_counts[5] = {
        counts.closed_for_limit.load(), counts.closed_request_timeout.load(),
        counts.closed_write_timeout.load(), counts.refused_full.load(),
        counts.refused_requests.load()};
    int64_t d[5];
    bool any = false;
    for (int i = 0; i < 5; ++i) {
      d[i] = now_counts[i] - shed_reported[i];
      any = any || d[i] > 0;
    }
    if (!any) return;  // The first shedding is reported at once.
    for (int i = 0; i < 5; ++i) shed_reported[i] = now_counts[i];
    next_shed_report = now + kShedReportEvery;
    SPDLOG_LOGGER_WARN(options.logger,
                       "ops listener shedding clients closed_oldest_idle={} "
                       "request_timeouts={} write_timeouts={} refused_busy={} "
                       "refused_requests={} open={} max_connections={}",
                       d[0], d[1], d[2], d[3], d[4], counts.open.load(),
                       options.max_connections);
  }

  int NextTimeoutMs() const {
    Tp next = Tp::max();
    for (const auto& [id, c] : conns) {
      if (c->phase != Phase::kServing) next = std::min(next, c->deadline);
    }
    if (next == Tp::max()) return 1000;
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now())
                  .count();
    return static_cast<int>(std::clamp<int64_t>(ms, 0, 1000));
  }

  // Takes up to kAcceptBatch waiting connections, then lets the loop read
  // what the ones taken sent (the listening socket stays ready): at the
  // connection limit every accept closes the oldest idle connection, and a
  // probe whose request had not arrived when it was taken must get its turn
  // to be read before a burst of reconnecting idle clients makes it the
  // oldest.
  void Accept() {
    for (int taken = 0; taken < kAcceptBatch; ++taken) {
      int fd =
          accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE) {
          // Out of descriptors: make room by the same rule as the limit.
          if (Evict()) continue;
        }
        return;  // EAGAIN, or nothing more can be done now.
      }
      if (static_cast<int>(conns.size()) >= options.max_connections &&
          !Evict()) {
        counts.refused_full.fetch_add(1);
        const std::string busy = Serialize(
            TextAnswer(503, "busy: every connection is being served\n"), false,
            true);
        (void)!send(fd, busy.data(), busy.size(), MSG_NOSIGNAL);
        close(fd);
        continue;
      }
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->id = next_id++;
      const Tp now = Clock::now();
      c->since = now;
      c->deadline = After(now, options.request_timeout);
      epoll_event ev{.events = EPOLLIN | EPOLLRDHUP, .data = {.u64 = c->id}};
      c->events = ev.events;
      if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        close(fd);
        continue;
      }
      counts.accepted.fetch_add(1);
      counts.open.fetch_add(1);
      Conn& added = *c;
      conns.emplace(c->id, std::move(c));
      // A request that came with the connection (a probe's does) is read
      // now: once being served, it is not among those a later accept may
      // close at the limit.
      if (ReadIn(added)) Advance(added);
    }
  }

  // Closes the oldest idle connection, else the oldest receiving a head.
  // False when every connection is being served.
  bool Evict() {
    Conn* oldest = nullptr;
    for (Phase phase : {Phase::kIdle, Phase::kDraining, Phase::kHead}) {
      for (const auto& [id, c] : conns) {
        if (c->phase != phase ||
            (oldest != nullptr && c->since >= oldest->since)) {
          continue;
        }
        // An idle connection whose next request is arriving is not idle:
        // closing it now would reset the request.
        int unread = 0;
        if (phase == Phase::kIdle && ioctl(c->fd, FIONREAD, &unread) == 0 &&
            unread > 0) {
          continue;
        }
        oldest = c.get();
      }
      if (oldest != nullptr) break;
    }
    if (oldest == nullptr) return false;
    counts.closed_for_limit.fetch_add(1);
    Close(*oldest);
    return true;
  }

  void Close(Conn& c) {
    epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);
    close(c.fd);
    counts.open.fetch_sub(1);
    conns.erase(c.id);  // Destroys c.
  }

  void Watch(Conn& c) {
    uint32_t want = c.peer_closed ? 0u : static_cast<uint32_t>(EPOLLRDHUP);
    const size_t hold =
        options.limits.max_head_bytes + options.limits.max_body_bytes;
    if (c.phase == Phase::kWriting) want |= EPOLLOUT;
    if (c.peer_closed) {
      // Nothing more to read.
    } else if (c.phase != Phase::kServing && c.phase != Phase::kWriting) {
      want |= EPOLLIN;
    } else if (c.in.size() < hold) {
      want |= EPOLLIN;  // Pipelined requests, up to one more's worth.
    }
    if (want == c.events) return;
    epoll_event ev{.events = want, .data = {.u64 = c.id}};
    epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c.fd, &ev);
    c.events = want;
  }

  void OnEvents(Conn& c, uint32_t events) {
    const uint64_t id = c.id;
    if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) {
      if (!ReadIn(c)) return;  // Closed.
    }
    if (!conns.contains(id)) return;
    if ((events & EPOLLOUT) != 0 && c.phase == Phase::kWriting) {
      if (!WriteOut(c)) return;
    }
    if (conns.contains(id)) Advance(c);
  }

  // Reads what is there. False when the connection is gone.
  bool ReadIn(Conn& c) {
    char buf[16 << 10];
    const size_t hold =
        options.limits.max_head_bytes + options.limits.max_body_bytes;
    for (;;) {
      if (c.phase != Phase::kDraining && c.in.size() >= hold + sizeof(buf)) {
        break;  // Enough buffered; Watch stops reading.
      }
      ssize_t n = recv(c.fd, buf, sizeof(buf), 0);
      if (n > 0) {
        if (c.phase == Phase::kDraining) continue;  // Dropped.
        if (c.phase == Phase::kIdle) {
          c.phase = Phase::kHead;
          const Tp now = Clock::now();
          c.since = now;
          if (!c.first) c.deadline = After(now, options.request_timeout);
        }
        c.in.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      // EOF or an error. A client that shut its side after a request may
      // still read the answer; an idle or draining one is done.
      if (n == 0 && c.phase != Phase::kIdle && c.phase != Phase::kDraining) {
        c.peer_closed = true;
        c.close_after = true;
        Watch(c);
        return true;
      }
      Close(c);
      return false;
    }
    return true;
  }

  // Parses and dispatches what `in` holds, request by request.
  void Advance(Conn& c) {
    const uint64_t id = c.id;
    while (c.phase == Phase::kHead || c.phase == Phase::kBody ||
           (c.phase == Phase::kIdle && !c.in.empty())) {
      if (c.phase == Phase::kIdle) {
        c.phase = Phase::kHead;
        c.since = Clock::now();
        c.deadline = After(c.since, options.request_timeout);
      }
      if (c.phase == Phase::kHead) {
        HttpHeadResult r = ParseHttpHead(c.in, options.limits);
        if (r.state == HttpHeadResult::kIncomplete) break;
        if (r.state == HttpHeadResult::kRefused) {
          counts.refused_requests.fetch_add(1);
          Answer(c, TextAnswer(r.status, absl::StrCat(r.why, "\n")), false,
                 true);
          return;
        }
        c.head = std::move(r.head);
        c.in.erase(0, c.head.head_bytes);
        c.phase = Phase::kBody;
      }
      if (c.in.size() < c.head.content_length) break;
      c.in.erase(0, c.head.content_length);  // Bodies are not used.
      Dispatch(c);
      if (!conns.contains(id)) return;
    }
    if (c.peer_closed && (c.phase == Phase::kHead || c.phase == Phase::kBody ||
                          c.phase == Phase::kIdle)) {
      Close(c);  // The rest of the request will not come.
      return;
    }
    Watch(c);
  }

  void Dispatch(Conn& c) {
    c.phase = Phase::kServing;
    c.first = false;
    int lane = options.lane ? options.lane(c.head) : 0;
    lane = std::clamp(lane, 0, options.lanes - 1);
    {
      MutexLock l(&mu);
      if (static_cast<int>(lanes[lane].queue.size()) < options.max_queued) {
        lanes[lane].queue.push_back({.conn = c.id, .head = c.head});
        work_cv.SignalAll();
        return;
      }
    }
    Answer(c, TextAnswer(503, "busy: too many requests waiting\n"),
           c.head.method == "HEAD", false);
  }

  void TakeAnswers() {
    std::vector<Done> answers;
    {
      MutexLock l(&mu);
      answers.swap(done);
    }
    for (Done& d : answers) {
      auto it = conns.find(d.conn);
      if (it == conns.end()) continue;  // Closed meanwhile.
      Conn& c = *it->second;
      counts.requests.fetch_add(1);
      Answer(c, d.answer, c.head.method == "HEAD", false);
      // Pipelined requests behind it.
      if (auto again = conns.find(d.conn); again != conns.end()) {
        Advance(*again->second);
      }
    }
  }

  // Starts writing `a`; a refusal (`refused`) closes after it.
  void Answer(Conn& c, const HttpAnswer& a, bool head_only, bool refused) {
    c.requests++;
    c.close_after = c.close_after || refused || c.head.close ||
                    c.requests >= options.max_requests;
    if (refused) c.in.clear();
    c.out = Serialize(a, head_only, c.close_after);
    c.out_sent = 0;
    c.phase = Phase::kWriting;
    c.since = Clock::now();
    c.deadline = After(c.since, options.write_timeout);
    if (WriteOut(c)) Watch(c);
  }

  // Writes what the socket takes. False when the connection is gone.
  bool WriteOut(Conn& c) {
    while (c.out_sent < c.out.size()) {
      ssize_t n = send(c.fd, c.out.data() + c.out_sent,
                       c.out.size() - c.out_sent, MSG_NOSIGNAL);
      if (n > 0) {
        c.out_sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      Close(c);
      return false;
    }
    c.out.clear();
    c.out_sent = 0;
    const Tp now = Clock::now();
    c.since = now;
    if (c.close_after) {
      shutdown(c.fd, SHUT_WR);
      c.phase = Phase::kDraining;
      c.in.clear();
      c.deadline = now + kDrainFor;
    } else {
      c.phase = Phase::kIdle;
      c.deadline = After(now, options.keep_alive_timeout);
    }
    Watch(c);
    return true;
  }

  void ExpireDeadlines() {
    const Tp now = Clock::now();
    std::vector<uint64_t> late;
    for (const auto& [id, c] : conns) {
      if (c->phase != Phase::kServing && c->deadline <= now) late.push_back(id);
    }
    for (uint64_t id : late) {
      auto it = conns.find(id);
      if (it == conns.end()) continue;
      Conn& c = *it->second;
      switch (c.phase) {
        case Phase::kHead:
        case Phase::kBody:
          counts.closed_request_timeout.fetch_add(1);
          c.head = HttpHead{};
          Answer(c,
                 TextAnswer(408,
                            "request timeout: the request did not arrive in "
                            "time\n"),
                 false, true);
          break;
        case Phase::kIdle:
          if (c.first) {
            counts.closed_request_timeout.fetch_add(1);
          } else {
            counts.closed_idle.fetch_add(1);
          }
          Close(c);
          break;
        case Phase::kWriting:
          counts.closed_write_timeout.fetch_add(1);
          Close(c);
          break;
        case Phase::kDraining:
          Close(c);
          break;
        case Phase::kServing:
          break;
      }
    }
  }

  // ---- Workers -----------------------------------------------------------

  void Work(int lane) {
    pthread_setname_np(pthread_self(), "sp-ops-work");
    for (;;) {
      Job job;
      {
        MutexLock l(&mu);
        while (!workers_stop && lanes[lane].queue.empty()) work_cv.Wait(&mu);
        if (workers_stop) return;
        job = std::move(lanes[lane].queue.front());
        lanes[lane].queue.pop_front();
      }
      Done d{.conn = job.conn, .answer = Call(job.head)};
      {
        MutexLock l(&mu);
        done.push_back(std::move(d));
      }
      uint64_t one = 1;
      (void)!write(wake_fd, &one, sizeof(one));
    }
  }

  HttpAnswer Call(const HttpHead& head) {
    absl::StatusOr<HttpAnswer> answer =
        CallUserCode("handler", [&] { return options.handler(head); });
    if (answer.ok()) return *std::move(answer);
    SPDLOG_LOGGER_ERROR(options.logger,
                        "ops listener handler failed path={}: {}", head.path,
                        answer.status());
    return TextAnswer(500, "internal error\n");
  }
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(Options options) {
  auto impl = std::make_unique<Impl>();
  const std::string where = absl::StrCat(options.host, ":", options.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  // Numeric only: a listener never waits for a name server.
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV | AI_NUMERICHOST;
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(options.port);
  const std::string host =
      options.host == "localhost" ? "127.0.0.1" : options.host;
  if (int err = getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
      err != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen on ", where, ": the host is not an IP address (",
                     gai_strerror(err), ")"));
  }
  int fd = -1;
  int bind_errno = 0;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                a->ai_protocol);
    if (fd < 0) continue;
    int yes = 1;
    // SO_REUSEADDR only: with SO_REUSEPORT a second pod would bind too.
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 ||
        listen(fd, std::max(options.backlog, 128)) != 0) {
      bind_errno = errno;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("listen on ", where, ": ", strerror(bind_errno)));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  impl->port = ntohs(bound.ss_family == AF_INET6
                         ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                         : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  impl->listen_fd = fd;
  impl->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  impl->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl->epoll_fd < 0 || impl->wake_fd < 0) {
    const int err = errno;
    close(fd);
    if (impl->epoll_fd >= 0) close(impl->epoll_fd);
    if (impl->wake_fd >= 0) close(impl->wake_fd);
    return absl::UnavailableError(
        absl::StrCat("listen on ", where, ": epoll: ", strerror(err)));
  }
  epoll_event lev{.events = EPOLLIN, .data = {.u64 = kListenId}};
  epoll_ctl(impl->epoll_fd, EPOLL_CTL_ADD, fd, &lev);
  epoll_event wev{.events = EPOLLIN, .data = {.u64 = kWakeId}};
  epoll_ctl(impl->epoll_fd, EPOLL_CTL_ADD, impl->wake_fd, &wev);
  options.lanes = std::max(options.lanes, 1);
  impl->options = std::move(options);
  Impl* p = impl.get();
  {
    MutexLock l(&p->mu);
    p->lanes.resize(static_cast<size_t>(p->options.lanes));
  }
  for (int i = 0; i < p->options.lanes; ++i) {
    p->workers.emplace_back([p, i] { p->Work(i); });
  }
  p->loop = std::thread([p] { p->Loop(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  if (impl_ == nullptr || impl_->stopped) return;
  impl_->stopped = true;
  impl_->stopping.store(true);
  uint64_t one = 1;
  (void)!write(impl_->wake_fd, &one, sizeof(one));
  impl_->loop.join();
  {
    MutexLock l(&impl_->mu);
    impl_->workers_stop = true;
    impl_->work_cv.SignalAll();
  }
  for (auto& t : impl_->workers) t.join();
  close(impl_->listen_fd);
  close(impl_->epoll_fd);
  close(impl_->wake_fd);
}

int HttpServer::port() const { return impl_->port; }

HttpServerStats HttpServer::stats() const {
  const Impl::Counts& c = impl_->counts;
  return {
      .connections_open = c.open.load(),
      .connections_accepted = c.accepted.load(),
      .closed_for_limit = c.closed_for_limit.load(),
      .closed_request_timeout = c.closed_request_timeout.load(),
      .closed_idle = c.closed_idle.load(),
      .closed_write_timeout = c.closed_write_timeout.load(),
      .refused_full = c.refused_full.load(),
      .requests = c.requests.load(),
      .refused_requests = c.refused_requests.load(),
  };
}

}  // namespace setpoint
