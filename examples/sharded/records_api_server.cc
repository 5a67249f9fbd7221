// records_api_server: the sharded example's fake DNS API as an HTTP service
// (records_api_service.h; the protocol is in records_wire.h), for pods in
// separate processes: `sharded --api=http://127.0.0.1:<port>`. It refuses
// a write whose fencing token is older than one it has seen for the key's
// shard (409), or for a key outside the writer's claimed range (403), and
// counts what it did per writer: GET /v1/stats.
//
//   records_api_server --listen=127.0.0.1:8080
//   records_api_server --listen=127.0.0.1:0 --unavailable_rate=0 --threads=8
//
// Prints "listening on http://<host>:<port>" once it accepts connections;
// SIGINT or SIGTERM stops it (exit 0). Bad flags: exit 2.
#include <signal.h>

#include <cstdio>
#include <string>
#include <string_view>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "records_api_service.h"

namespace {

constexpr char kUsage[] =
    "usage: records_api_server [--listen=<host>:<port>] [--threads=<n>]\n"
    "  [--latency=<duration>] [--unavailable_rate=<0..1>]\n"
    "  [--throttle_rate=<0..1>] [--seed=<n>] [--max_body_bytes=<n>]\n"
    "  [--write_log=<n>]\n"
    "Serves the sharded example's fake DNS API over HTTP; port 0 picks a\n"
    "free one. Defaults: 127.0.0.1:8080, 16 threads, latency 2ms, 3% 503s,\n"
    "2% 429s, bodies up to 65536 bytes, the last 500000 accepted writes\n"
    "kept for GET /v1/writes.\n";

bool ParseRate(std::string_view v, double* out) {
  return absl::SimpleAtod(absl::string_view(v.data(), v.size()), out) &&
         *out >= 0 && *out <= 1;
}

}  // namespace

int main(int argc, char** argv) {
  sharded::RecordsApiServiceOptions options;
  options.port = 8080;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    size_t eq = arg.find('=');
    std::string_view name = arg.substr(0, eq);
    std::string_view value =
        eq == std::string_view::npos ? std::string_view() : arg.substr(eq + 1);
    absl::string_view v(value.data(), value.size());
    bool ok = eq != std::string_view::npos;
    if (name == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (name == "--listen") {
      size_t colon = value.rfind(':');
      ok = ok && colon != std::string_view::npos && colon > 0 &&
           absl::SimpleAtoi(v.substr(colon + 1), &options.port) &&
           options.port >= 0 && options.port <= 65535;
      if (ok) options.host = std::string(value.substr(0, colon));
    } else if (name == "--threads") {
      ok = ok && absl::SimpleAtoi(v, &options.threads) &&
           options.threads >= 1 && options.threads <= 256;
    } else if (name == "--latency") {
      ok = ok && absl::ParseDuration(v, &options.api.latency) &&
           options.api.latency >= absl::ZeroDuration() &&
           options.api.latency <= absl::Seconds(10);
    } else if (name == "--unavailable_rate") {
      ok = ok && ParseRate(value, &options.api.unavailable_rate);
    } else if (name == "--throttle_rate") {
      ok = ok && ParseRate(value, &options.api.throttle_rate);
    } else if (name == "--seed") {
      ok = ok && absl::SimpleAtoi(v, &options.api.seed);
    } else if (name == "--max_body_bytes") {
      ok = ok && absl::SimpleAtoi(v, &options.max_body_bytes) &&
           options.max_body_bytes >= 64 &&
           options.max_body_bytes <= (size_t{1} << 24);
    } else if (name == "--write_log") {
      ok = ok && absl::SimpleAtoi(v, &options.api.write_log_limit) &&
           options.api.write_log_limit <= 10'000'000;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "records_api_server: bad flag %.*s\n%s",
                   static_cast<int>(name.size()), name.data(), kUsage);
      return 2;
    }
  }

  // The signals go to the waiting thread below, not to the server's.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  sharded::RecordsApiService service(options);
  if (absl::Status s = service.Start(); !s.ok()) {
    std::fprintf(stderr, "records_api_server: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("listening on %s\n", service.url().c_str());
  std::fflush(stdout);
  int signal = 0;
  sigwait(&stop_signals, &signal);
  service.Stop();
  std::fprintf(stderr, "records_api_server: stopped by signal %d\n", signal);
  return 0;
}
