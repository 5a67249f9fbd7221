#include "setpoint/pod/ops_server.h"

#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "httplib.h"
#include "setpoint/prometheus/prometheus_metrics.h"
#include "spdlog/spdlog.h"

namespace setpoint {
namespace {

// `threads` workers and a queue of as many; beyond that the listener thread
// serves the connection itself, so it stops accepting meanwhile and the
// kernel's backlog bounds the rest.
class BoundedQueue final : public httplib::TaskQueue {
 public:
  explicit BoundedQueue(int threads) : capacity_(static_cast<size_t>(threads)) {
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
  }
  ~BoundedQueue() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    {
      std::unique_lock<std::mutex> l(mu_);
      if (!stop_ && queue_.size() < capacity_) {
        queue_.push_back(std::move(fn));
        cv_.notify_one();
        return;
      }
    }
    fn();  // Full (or stopping): served here; the socket is always closed.
  }

  void shutdown() override {
    {
      std::unique_lock<std::mutex> l(mu_);
      if (stop_) return;
      stop_ = true;
      cv_.notify_all();
    }
    for (auto& t : workers_) t.join();
  }

 private:
  void Work() {
    while (true) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // Stopping, and nothing left.
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }

  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

void Probe(const std::function<std::vector<std::string>()>& check,
           const char* what, httplib::Response& res) {
  std::vector<std::string> problems;
  if (check) problems = check();
  if (problems.empty()) {
    res.status = 200;
    res.set_content("ok\n", "text/plain; charset=utf-8");
    return;
  }
  res.status = 503;
  res.set_content(absl::StrCat(what, ": ", absl::StrJoin(problems, "\n"), "\n"),
                  "text/plain; charset=utf-8");
}

}  // namespace

absl::Status ParseHostPort(const std::string& address, std::string* host,
                           int* port) {
  auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", address, "\": ", why,
                     " (want host:port, for example 127.0.0.1:9464)"));
  };
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("no host:port");
  std::string h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') {
    h = h.substr(1, h.size() - 2);
  } else if (h.find(':') != std::string::npos) {
    return bad("an IPv6 host needs brackets");
  }
  if (h.empty()) return bad("empty host");
  int p = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &p) || p < 0 || p > 65535)
    return bad("the port is not a number in 0..65535");
  *host = h;
  *port = p;
  return absl::OkStatus();
}

struct OpsServer::Impl {
  OpsServerOptions options;
  std::string host;
  httplib::Server server;
  std::thread thread;
  bool stopped = false;
};

OpsServer::OpsServer(std::unique_ptr<Impl> impl, int port)
    : impl_(std::move(impl)), port_(port) {}

OpsServer::~OpsServer() { Stop(); }

std::string OpsServer::address() const {
  return impl_->host.find(':') != std::string::npos
             ? absl::StrCat("[", impl_->host, "]:", port_)
             : absl::StrCat(impl_->host, ":", port_);
}

absl::StatusOr<std::unique_ptr<OpsServer>> OpsServer::Start(
    OpsServerOptions options) {
  if (options.threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ops server: threads must be >= 1, got ", options.threads));
  }
  auto impl = std::make_unique<Impl>();
  int port = 0;
  if (absl::Status s = ParseHostPort(options.address, &impl->host, &port);
      !s.ok()) {
    return s;
  }
  if (options.logger == nullptr) options.logger = spdlog::default_logger();
  impl->options = std::move(options);
  Impl* p = impl.get();
  httplib::Server& srv = impl->server;
  const int threads = p->options.threads;
  srv.new_task_queue = [threads] { return new BoundedQueue(threads); };
  srv.set_payload_max_length(p->options.max_request_bytes);
  const int64_t us = absl::ToInt64Microseconds(p->options.timeout);
  srv.set_read_timeout(us / 1000000, us % 1000000);
  srv.set_write_timeout(us / 1000000, us % 1000000);
  srv.set_keep_alive_max_count(16);
  // SO_REUSEADDR only: the library's default adds SO_REUSEPORT, with which a
  // second pod on the same port would bind too and share the traffic.
  srv.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  srv.set_exception_handler([p](const httplib::Request& req,
                                httplib::Response& res, std::exception_ptr e) {
    std::string what = "a non-standard exception";
    try {
      if (e) std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
    p->options.logger->error("ops server: handler threw path={} err=\"{}\"",
                             req.path, what);
    res.status = 500;
    res.set_content("internal error\n", "text/plain; charset=utf-8");
  });
  srv.Get("/metrics", [p](const httplib::Request&, httplib::Response& res) {
    std::string text;
    if (p->options.metrics != nullptr)
      text = PrometheusText(*p->options.metrics);
    res.set_content(text, kPrometheusTextContentType);
  });
  srv.Get("/healthz", [p](const httplib::Request&, httplib::Response& res) {
    Probe(p->options.liveness, "not healthy", res);
  });
  srv.Get("/readyz", [p](const httplib::Request&, httplib::Response& res) {
    Probe(p->options.readiness, "not ready", res);
  });
  srv.Get("/statusz", [p](const httplib::Request&, httplib::Response& res) {
    std::string body = p->options.status ? p->options.status() : "{}";
    body.push_back('\n');
    res.set_content(body, "application/json");
  });
  // Known paths with another method: 405.
  auto not_allowed = [](const httplib::Request& req, httplib::Response& res) {
    const bool known = req.path == "/metrics" || req.path == "/healthz" ||
                       req.path == "/readyz" || req.path == "/statusz";
    res.status = known ? 405 : 404;
    if (known) res.set_header("Allow", "GET, HEAD");
  };
  srv.Post(".*", not_allowed);
  srv.Put(".*", not_allowed);
  srv.Delete(".*", not_allowed);
  srv.Patch(".*", not_allowed);
  srv.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    const char* what = "error";
    switch (res.status) {
      case 400:
        what = "bad request";
        break;
      case 404:
        what = "not found (try /metrics, /healthz, /readyz, /statusz)";
        break;
      case 405:
        what = "method not allowed";
        break;
      case 413:
        what = "request too large";
        break;
      case 414:
        what = "request URI too long";
        break;
      default:
        break;
    }
    res.set_content(absl::StrCat(what, "\n"), "text/plain; charset=utf-8");
  });
  int bound = port == 0 ? srv.bind_to_any_port(impl->host)
                        : (srv.bind_to_port(impl->host, port) ? port : -1);
  if (bound <= 0) {
    return absl::UnavailableError(
        absl::StrCat("ops server: cannot listen on ", p->options.address,
                     " (in use, or not an address of this machine)"));
  }
  auto ended = std::make_shared<std::atomic<bool>>(false);
  impl->thread = std::thread([p, ended] {
    p->server.listen_after_bind();
    ended->store(true);
  });
  // Stop() only reaches a server that runs: wait until it does (or gave
  // up), so a Stop right after Start cannot leave the loop running.
  while (!srv.is_running() && !ended->load()) std::this_thread::yield();
  if (!srv.is_running()) {
    impl->thread.join();
    return absl::UnavailableError(
        absl::StrCat("ops server: cannot serve on ", p->options.address));
  }
  auto server =
      std::unique_ptr<OpsServer>(new OpsServer(std::move(impl), bound));
  server->impl_->options.logger->info("ops server listening address={}",
                                      server->address());
  return server;
}

void OpsServer::Stop() {
  if (impl_ == nullptr || impl_->stopped) return;
  impl_->stopped = true;
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace setpoint
