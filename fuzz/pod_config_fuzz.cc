// libFuzzer target for ParsePodConfig. The input is YAML, optionally
// followed by a NUL and NUL-separated overrides:
//
//   "lease: 3s\nkinds: [{kind: vm}]\0--lease=5s\0--kinds.vm.count=2"
//
// Whatever the input, ParsePodConfig must return without crashing, hanging
// or leaking; an error must be kInvalidArgument starting "pod config: ", and
// a config it accepts must obey the rules in pod_config.h (checked here
// independently, so a validation bug aborts too).
//
//   scripts/fuzz 60        # build the fuzz preset, run every target 60 s
//
// Thread safety: libFuzzer calls it from one thread.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "setpoint/pod/pod_config.h"

namespace {

[[noreturn]] void Fail(const char* what, const setpoint::PodConfig& c) {
  std::fprintf(stderr, "pod_config_fuzz: accepted a config with %s: %s\n", what,
               c.ToString().c_str());
  std::abort();
}

bool WholeMillis(absl::Duration d) {
  return d % absl::Milliseconds(1) == absl::ZeroDuration();
}

bool Printable(const std::string& s) {
  if (s.empty()) return false;
  for (char ch : s) {
    auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c >= 0x7f) return false;
  }
  return true;
}

// The rules of pod_config.h, restated.
void CheckAccepted(const setpoint::PodConfig& c) {
  const setpoint::NodeManagerOptions& m = c.manager;
  const absl::Duration ms = absl::Milliseconds(1);
  const absl::Duration day = absl::Hours(24);
  for (absl::Duration d : {m.poll_interval, m.lease, m.operation_timeout,
                           c.redis.connect_timeout, c.redis.command_timeout}) {
    if (d < ms || d > day || !WholeMillis(d)) Fail("a bad duration", c);
  }
  if (m.fence_margin != absl::ZeroDuration() &&
      (m.fence_margin < ms || m.fence_margin > day ||
       !WholeMillis(m.fence_margin))) {
    Fail("a bad fence_margin", c);
  }
  if (m.lease < 2 * m.poll_interval) Fail("lease < 2 * poll_interval", c);
  absl::Duration margin = m.fence_margin > absl::ZeroDuration()
                              ? m.fence_margin
                              : std::max(m.lease / 5, m.poll_interval);
  if (margin >= m.lease - m.poll_interval) {
    Fail("a margin that fences every cycle", c);
  }
  if (m.kinds.empty() || m.kinds.size() > setpoint::kPodConfigMaxKinds) {
    Fail("a bad number of kinds", c);
  }
  for (const setpoint::NodeKindOptions& k : m.kinds) {
    if (!Printable(k.kind) || k.kind.find_first_of("./") != std::string::npos) {
      Fail("a bad kind name", c);
    }
    if (k.count < 1 || k.count > setpoint::kPodConfigMaxCount) {
      Fail("a bad count", c);
    }
    if (k.ring_size < 1 || k.ring_size > setpoint::kPodConfigMaxRingSize) {
      Fail("a bad ring_size", c);
    }
  }
  if (!m.pod_id.empty() &&
      (!Printable(m.pod_id) || m.pod_id.find('/') != std::string::npos)) {
    Fail("a bad pod_id", c);
  }
  if (c.registry_type != "memory" && c.registry_type != "redis") {
    Fail("a bad registry type", c);
  }
  if (!Printable(c.redis.ns)) Fail("a bad namespace", c);
  if (!c.redis.username.empty() && !Printable(c.redis.username)) {
    Fail("a bad username", c);
  }
  if (c.redis.db < 0) Fail("a negative db", c);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  size_t nul = input.find('\0');
  std::string yaml(input.substr(0, nul));
  std::vector<std::string> overrides;
  if (nul != absl::string_view::npos) {
    overrides = absl::StrSplit(input.substr(nul + 1), '\0');
  }
  absl::StatusOr<setpoint::PodConfig> config =
      setpoint::ParsePodConfig(yaml, overrides);
  if (config.ok()) {
    CheckAccepted(*config);
  } else if (config.status().code() != absl::StatusCode::kInvalidArgument ||
             !absl::StartsWith(config.status().message(), "pod config: ")) {
    std::fprintf(stderr, "pod_config_fuzz: unexpected error: %s\n",
                 config.status().ToString().c_str());
    std::abort();
  }
  return 0;
}
