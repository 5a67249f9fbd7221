// TcpProxy: a small userspace TCP proxy for the chaos test. It listens on
// 127.0.0.1 (a free port) and forwards every connection to a loopback
// upstream port (redis-server), so the test can cut or slow one pod's link
// to Redis without touching the others or the kernel's network settings.
//
//   auto proxy = TcpProxy::Start(redis_port);
//   pod --redis=(*proxy)->address() ...
//   (*proxy)->Partition(true);   // calls hang until the client's timeout
//   (*proxy)->Partition(false);  // held bytes flow again
//   (*proxy)->SetDelay(absl::Milliseconds(300));  // a slow link
//   (*proxy)->KillConnections();  // RST both ends of every connection
//
// Partition(on): nothing is read or written on any connection, in either
// direction; connections stay open (the kernel's buffers hold what was
// sent), so a client's call waits until its own timeout. When the
// partition heals, whatever is still buffered is delivered late, as TCP
// retransmission would after a real partition (a client that gave up and
// closed its socket still has its last command executed). With
// refuse_new, connections arriving during the partition are reset at once;
// otherwise they are accepted and held like the others.
// SetDelay(d): every chunk read from either side is written to the other
// side no earlier than d after it was read (order kept).
// KillConnections(): closes both ends of every current connection with a
// reset (SO_LINGER 0).
// A connection whose upstream cannot be reached (Redis down) is reset.
//
// Thread safety: thread-safe. One thread ("chaos-proxy") does all IO.
#ifndef SETPOINT_TESTS_CHAOS_TCP_PROXY_H_
#define SETPOINT_TESTS_CHAOS_TCP_PROXY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "setpoint/base/mutex.h"

namespace setpoint::chaos {

struct TcpProxyStats {
  int64_t accepted = 0;
  int64_t refused = 0;  // Reset at accept: partition with refuse_new, or
                        // the upstream did not answer.
  int64_t killed = 0;   // Reset by KillConnections.
  int64_t bytes = 0;    // Forwarded, both directions.
  int64_t open = 0;     // Connections open now.
};

class TcpProxy {
 public:
  // Listens on 127.0.0.1:0 and forwards to 127.0.0.1:upstream_port.
  // kInternal if the listening socket cannot be set up.
  static absl::StatusOr<std::unique_ptr<TcpProxy>> Start(int upstream_port);
  // Stops the thread and closes every socket.
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }
  // "127.0.0.1:<port>".
  std::string address() const;

  void Partition(bool on, bool refuse_new = false);
  void SetDelay(absl::Duration delay);
  void KillConnections();
  // No partition, no delay.
  void Heal();
  TcpProxyStats stats() const;

 private:
  struct Conn;
  TcpProxy(int listen_fd, int port, int upstream_port, int wake_fd[2]);
  void Loop(std::stop_token stop);
  void Wake();

  const int listen_fd_;
  const int port_;
  const int upstream_port_;
  const int wake_read_;
  const int wake_write_;

  mutable Mutex mu_;
  bool partitioned_ ABSL_GUARDED_BY(mu_) = false;
  bool refuse_new_ ABSL_GUARDED_BY(mu_) = false;
  int64_t delay_ns_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t kill_generation_ ABSL_GUARDED_BY(mu_) = 0;
  // SetDelay waits until the forwarding loop has read the new delay, so
  // the bytes a caller sends after it returns are delayed.
  int64_t delay_generation_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t delay_seen_ ABSL_GUARDED_BY(mu_) = 0;
  CondVar delay_seen_cv_;
  TcpProxyStats stats_ ABSL_GUARDED_BY(mu_);
  std::jthread thread_;  // Last: started after everything it reads.
};

}  // namespace setpoint::chaos

#endif  // SETPOINT_TESTS_CHAOS_TCP_PROXY_H_
