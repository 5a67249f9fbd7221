#include "setpoint/planner/execution_report.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "setpoint/base/json.h"

namespace setpoint {
namespace {

// Appends `s` as a DOT double-quoted string.
void AppendDotString(std::string* out, std::string_view s) {
  out->push_back('"');
  for (char c : s) {
    if (c == '"' || c == '\\') out->push_back('\\');
    if (c == '\n') {
      out->append("\\n");
      continue;
    }
    out->push_back(c);
  }
  out->push_back('"');
}

double Millis(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

std::string_view StepOutcomeName(StepOutcome outcome) {
  switch (outcome) {
    case StepOutcome::kSucceeded:
      return "succeeded";
    case StepOutcome::kFailed:
      return "failed";
    case StepOutcome::kNotRun:
      return "not_run";
  }
  return "unknown";
}

std::string ExecutionReport::Summary() const {
  std::string out = absl::StrCat(
      "plan=", plan, " execution=", execution_id,
      " status=", status.ok() ? "ok" : absl::StatusCodeToString(status.code()),
      " rounds=", rounds, " steps=", steps_run, " failed=", steps_failed,
      " not_run=", steps_not_run, " retries=", retries, " duration=",
      absl::FormatDuration(absl::Trunc(duration, absl::Microseconds(1))));
  if (!stopped_before.empty()) {
    absl::StrAppend(&out, " stopped_before=\"", stopped_before, "\"");
  }
  if (!status.ok()) absl::StrAppend(&out, " err=\"", status.message(), "\"");
  return out;
}

std::string ExecutionReport::ToJson() const {
  std::string out = "{\"plan\":";
  AppendJsonString(&out, plan);
  absl::StrAppend(&out, ",\"execution_id\":", execution_id,
                  ",\"ok\":", status.ok() ? "true" : "false", ",\"code\":");
  AppendJsonString(&out, absl::StatusCodeToString(status.code()));
  out.append(",\"message\":");
  AppendJsonString(&out, std::string(status.message()));
  absl::StrAppend(&out, ",\"rounds\":", rounds, ",\"steps_run\":", steps_run,
                  ",\"steps_failed\":", steps_failed,
                  ",\"steps_not_run\":", steps_not_run,
                  ",\"retries\":", retries);
  absl::StrAppendFormat(&out, ",\"duration_ms\":%.3f", Millis(duration));
  out.append(",\"started\":");
  AppendJsonString(
      &out, absl::FormatTime(absl::RFC3339_full, started, absl::UTCTimeZone()));
  out.append(",\"stopped_before\":");
  AppendJsonString(&out, stopped_before);
  absl::StrAppend(&out,
                  ",\"steps_truncated\":", steps_truncated ? "true" : "false",
                  ",\"steps\":[");
  for (size_t i = 0; i < steps.size(); ++i) {
    const StepRecord& s = steps[i];
    if (i > 0) out.push_back(',');
    absl::StrAppend(&out, "{\"id\":", s.id, ",\"parent\":", s.parent,
                    ",\"round\":", s.round, ",\"name\":");
    AppendJsonString(&out, s.name);
    out.append(",\"outcome\":");
    AppendJsonString(&out, StepOutcomeName(s.outcome));
    if (!s.status.ok()) {
      out.append(",\"error\":");
      AppendJsonString(&out, s.status.ToString());
    }
    absl::StrAppend(&out, ",\"attempts\":", s.attempts);
    absl::StrAppendFormat(&out, ",\"start_ms\":%.3f,\"duration_ms\":%.3f}",
                          Millis(s.start), Millis(s.duration));
  }
  out.append("]}");
  return out;
}

std::string ExecutionReport::ToDot() const {
  std::string out =
      "digraph execution {\n  rankdir=LR;\n  node [shape=box, style=filled, "
      "fontname=\"sans\"];\n  label=";
  AppendDotString(&out, Summary());
  out.append(";\n");
  int last_round = 0;
  for (const StepRecord& s : steps) {
    if (s.round > last_round) {
      for (int r = last_round + 1; r <= s.round; ++r) {
        absl::StrAppend(&out, "  round", r, " [label=\"round ", r,
                        "\", shape=ellipse, fillcolor=lightgrey];\n");
      }
      last_round = s.round;
    }
    const char* color = s.outcome == StepOutcome::kSucceeded ? "palegreen"
                        : s.outcome == StepOutcome::kFailed  ? "salmon"
                                                             : "white";
    std::string label = s.name;
    if (s.outcome == StepOutcome::kFailed) {
      absl::StrAppend(&label, "\n", s.status.ToString());
    } else if (s.outcome == StepOutcome::kNotRun) {
      absl::StrAppend(&label, "\n(not run)");
    }
    absl::StrAppend(&out, "  s", s.id, " [label=");
    AppendDotString(&out, label);
    absl::StrAppend(&out, ", fillcolor=", color, "];\n");
    if (s.parent >= 0) {
      absl::StrAppend(&out, "  s", s.parent, " -> s", s.id, ";\n");
    } else {
      absl::StrAppend(&out, "  round", s.round, " -> s", s.id, ";\n");
    }
  }
  if (steps_truncated) {
    out.append(
        "  truncated [label=\"... more steps not recorded\", "
        "shape=plaintext];\n");
  }
  out.append("}\n");
  return out;
}

}  // namespace setpoint
