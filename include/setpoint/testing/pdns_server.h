// PdnsServer: a real PowerDNS Authoritative server (Debian's pdns-server
// with pdns-backend-sqlite3) for integration tests. Start() makes a fresh
// directory with its own configuration, a sqlite database created from the
// schema the package ships, and an API key; runs pdns_server on free
// loopback ports (DNS and the HTTP API); and waits until the API answers.
// CreateZone() creates a zone through the API, with soa_edit_api so that
// PowerDNS itself raises the serial on every change made through the API.
//
//   PdnsServer pdns;
//   ASSERT_OK(pdns.Start());
//   ASSERT_OK(pdns.CreateZone("example.org."));
//   // pdns.api_url() is "http://127.0.0.1:<port>", pdns.api_key() its key.
//
// Stop() kills the process and keeps the database, so a later Start() plays
// a server that was down for a while (the same ports, the same zone);
// Kill() is Stop() by another name for tests that say SIGKILL. When
// pdns_server, its sqlite backend or sqlite3 is not installed, Start()
// returns kNotFound: tests skip locally and fail when the CI environment
// variable is set (SETPOINT_START_PDNS_OR_SKIP). Part of setpoint::testing;
// it needs the programs at run time only (Debian: pdns-server,
// pdns-backend-sqlite3, sqlite3).
//
// Thread safety: one owner thread.
#ifndef SETPOINT_TESTING_PDNS_SERVER_H_
#define SETPOINT_TESTING_PDNS_SERVER_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "setpoint/testing/redis_server.h"  // RedisRequired, FreeLoopbackPort

namespace setpoint::testing {

class PdnsServer {
 public:
  PdnsServer();
  ~PdnsServer();  // Stops the server and removes the directory.
  PdnsServer(const PdnsServer&) = delete;
  PdnsServer& operator=(const PdnsServer&) = delete;

  // Starts it (creating the database the first time) and waits until the
  // API answers. kNotFound without the programs; kDeadlineExceeded if it
  // does not answer within 20 s; kInternal, naming its log, if it exits.
  absl::Status Start();
  // SIGKILL, and wait for the process. The database stays.
  void Stop();
  void Kill() { Stop(); }
  bool running() const { return pid_ > 0; }

  // Creates a native zone named `zone` (with the trailing dot) through the
  // API: an SOA and one NS record, soa_edit_api DEFAULT.
  absl::Status CreateZone(const std::string& zone);

  // One request to the API (the key is added); the status code and body.
  // For tests that read the zone or count what it holds.
  struct Response {
    int status = 0;
    std::string body;
  };
  absl::StatusOr<Response> Request(const std::string& method,
                                   const std::string& path,
                                   const std::string& body = "");

  // "http://127.0.0.1:<api port>".
  std::string api_url() const;
  const std::string& api_key() const { return api_key_; }
  int api_port() const { return api_port_; }
  int dns_port() const { return dns_port_; }
  pid_t pid() const { return pid_; }
  // The server's log (stdout and stderr).
  std::string log_path() const { return dir_ + "/pdns.log"; }

 private:
  absl::Status MakeDatabase();
  std::string dir_;
  std::string api_key_ = "setpoint-test-key";
  int api_port_ = 0;
  int dns_port_ = 0;
  pid_t pid_ = -1;
  bool database_made_ = false;
};

// pdns_server, or "" when it is not installed.
std::string FindPdnsServer();

}  // namespace setpoint::testing

// In a test: start `server` or skip (locally) / fail (CI) when the programs
// are missing.
#define SETPOINT_START_PDNS_OR_SKIP(server)                                    \
  do {                                                                         \
    absl::Status started_ = (server).Start();                                  \
    if (absl::IsNotFound(started_) && !::setpoint::testing::RedisRequired()) { \
      GTEST_SKIP() << started_;                                                \
    }                                                                          \
    ASSERT_TRUE(started_.ok()) << started_;                                    \
  } while (false)

#endif  // SETPOINT_TESTING_PDNS_SERVER_H_
