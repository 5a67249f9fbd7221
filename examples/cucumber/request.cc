#include "cucumber/request.h"

#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <system_error>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "spdlog/fmt/fmt.h"
#include "yaml-cpp/yaml.h"

namespace cucumber {
namespace {

constexpr int64_t kMaxRequestFileBytes = 1 << 20;
constexpr size_t kMaxNameLength = 63;
constexpr size_t kMaxDnsNameLength = 253;
constexpr size_t kMaxLabelLength = 63;
// How much of an offending value a message quotes.
constexpr size_t kMaxQuoted = 40;

// Quotes `value` for a message, shortened when long.
std::string Quote(std::string_view value) {
  std::string out = "\"";
  for (size_t i = 0; i < value.size() && i < kMaxQuoted; ++i) {
    char c = value[i];
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    } else {
      out.push_back(c);
    }
  }
  if (value.size() > kMaxQuoted) out += "...";
  out.push_back('"');
  return out;
}

bool IsLowerAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

bool IsAlnum(char c) { return IsLowerAlnum(c) || (c >= 'A' && c <= 'Z'); }

// Checks a cluster name; returns what is wrong, or "" when fine.
std::string CheckName(std::string_view name) {
  if (name.empty()) return "name is missing (want e.g. \"demo\")";
  std::string why;
  if (name.size() > kMaxNameLength) {
    why = fmt::format("is {} characters long", name.size());
  } else if (!(name[0] >= 'a' && name[0] <= 'z')) {
    why = "does not start with a lowercase letter";
  } else if (name.back() == '-') {
    why = "ends with '-'";
  } else {
    for (char c : name) {
      if (!IsLowerAlnum(c) && c != '-') {
        why = fmt::format("contains {}", Quote(std::string_view(&c, 1)));
        break;
      }
    }
  }
  if (why.empty()) return "";
  return fmt::format(
      "name {} is invalid: it {}; use 1-{} lowercase letters, digits and '-', "
      "starting with a letter",
      Quote(name), why, kMaxNameLength);
}

// Checks a DNS name (one trailing dot allowed); returns what is wrong, or ""
// when fine.
std::string CheckDnsName(std::string_view dns_name) {
  if (dns_name.empty()) {
    return "dns_name is missing (want e.g. \"demo.example.com\")";
  }
  std::string_view name = dns_name;
  if (name.back() == '.') name.remove_suffix(1);
  auto bad = [&](std::string why) {
    return fmt::format("dns_name {} is not a valid DNS name: {}",
                       Quote(dns_name), why);
  };
  if (name.size() > kMaxDnsNameLength) {
    return bad(fmt::format("{} characters, at most {} allowed", name.size(),
                           kMaxDnsNameLength));
  }
  std::vector<std::string_view> labels;
  size_t start = 0;
  while (true) {
    size_t dot = name.find('.', start);
    labels.push_back(name.substr(start, dot == std::string_view::npos
                                            ? std::string_view::npos
                                            : dot - start));
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    std::string_view label = labels[i];
    if (label.empty()) return bad(fmt::format("label {} is empty", i + 1));
    if (label.size() > kMaxLabelLength) {
      return bad(fmt::format("label {} is {} characters, at most {} allowed",
                             i + 1, label.size(), kMaxLabelLength));
    }
    if (label.front() == '-' || label.back() == '-') {
      return bad(fmt::format("label {} starts or ends with '-'", Quote(label)));
    }
    for (char c : label) {
      if (!IsAlnum(c) && c != '-') {
        return bad(fmt::format("label {} contains {}", Quote(label),
                               Quote(std::string_view(&c, 1))));
      }
    }
  }
  if (labels.size() < 2) {
    return bad("it needs at least two labels, e.g. \"demo.example.com\"");
  }
  bool numeric_tld = true;
  for (char c : labels.back()) {
    if (!(c >= '0' && c <= '9')) numeric_tld = false;
  }
  if (numeric_tld) {
    return bad("the last label is all digits (an IP address is not a name)");
  }
  return "";
}

std::string CheckNodesNum(int64_t nodes_num) {
  if (nodes_num < 0 || nodes_num > kMaxNodes) {
    return fmt::format("nodes_num must be between 0 and {}, got {}", kMaxNodes,
                       nodes_num);
  }
  return "";
}

std::string_view NodeKind(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
      return "nothing";
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Scalar:
      return "a scalar";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
  }
  return "an unknown node";
}

// Builds the kInvalidArgument for a problem at `node`'s line.
absl::Status ErrorAt(std::string_view source, const YAML::Node& node,
                     std::string_view what) {
  YAML::Mark mark = node.Mark();
  if (mark.is_null()) {
    return absl::InvalidArgumentError(
        fmt::format("parse request {}: {}", source, what));
  }
  return absl::InvalidArgumentError(fmt::format("parse request {}: line {}: {}",
                                                source, mark.line + 1, what));
}

// Reads a string field; `value` must be a scalar.
absl::Status ReadString(std::string_view source, std::string_view key,
                        const YAML::Node& value, std::string* out) {
  if (!value.IsScalar()) {
    return ErrorAt(
        source, value,
        fmt::format("{} must be a string, got {}", key, NodeKind(value)));
  }
  *out = value.Scalar();
  return absl::OkStatus();
}

// Reads nodes_num: a plain (unquoted) integer scalar.
absl::Status ReadNodesNum(std::string_view source, const YAML::Node& value,
                          int* out) {
  if (!value.IsScalar()) {
    return ErrorAt(
        source, value,
        fmt::format("nodes_num must be an integer, got {}", NodeKind(value)));
  }
  const std::string& text = value.Scalar();
  if (value.Tag() == "!") {
    return ErrorAt(source, value,
                   fmt::format("nodes_num must be an integer, got the quoted "
                               "string {} (drop the quotes)",
                               Quote(text)));
  }
  bool digits = !text.empty();
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (!(c >= '0' && c <= '9') && !(i == 0 && (c == '-' || c == '+'))) {
      digits = false;
    }
  }
  int64_t n = 0;
  if (!digits || !absl::SimpleAtoi(text, &n)) {
    if (digits) {  // All digits, but does not fit: out of range.
      return ErrorAt(source, value,
                     fmt::format("nodes_num must be between 0 and {}, got {}",
                                 kMaxNodes, Quote(text)));
    }
    return ErrorAt(
        source, value,
        fmt::format("nodes_num must be an integer, got {}", Quote(text)));
  }
  std::string why = CheckNodesNum(n);
  if (!why.empty()) return ErrorAt(source, value, why);
  *out = static_cast<int>(n);
  return absl::OkStatus();
}

absl::StatusOr<ClusterRequest> ParseDocument(std::string_view source,
                                             const YAML::Node& root) {
  if (!root.IsDefined() || root.IsNull()) {
    return absl::InvalidArgumentError(fmt::format(
        "parse request {}: the document is empty; want a mapping with keys "
        "name, nodes_num, dns_name",
        source));
  }
  if (!root.IsMap()) {
    return ErrorAt(source, root,
                   fmt::format("want a mapping with keys name, nodes_num, "
                               "dns_name, got {}",
                               NodeKind(root)));
  }
  ClusterRequest request;
  std::set<std::string> seen;
  for (auto it = root.begin(); it != root.end(); ++it) {
    // Copies: yaml-cpp's iterator hands out a temporary pair.
    const YAML::Node key = it->first;
    const YAML::Node value = it->second;
    if (!key.IsScalar()) {
      return ErrorAt(
          source, key,
          fmt::format("keys must be strings, got {}", NodeKind(key)));
    }
    const std::string& k = key.Scalar();
    if (!seen.insert(k).second) {
      return ErrorAt(source, key, fmt::format("duplicate key {}", Quote(k)));
    }
    if (k != "name" && k != "nodes_num" && k != "dns_name") {
      return ErrorAt(source, key,
                     fmt::format("unknown key {} (allowed: name, nodes_num, "
                                 "dns_name)",
                                 Quote(k)));
    }
    if (value.IsNull()) {
      return ErrorAt(source, key, fmt::format("{} has no value", k));
    }
    absl::Status s;
    if (k == "name") {
      s = ReadString(source, k, value, &request.name);
      if (s.ok()) {
        std::string why = CheckName(request.name);
        if (!why.empty()) s = ErrorAt(source, value, why);
      }
    } else if (k == "nodes_num") {
      s = ReadNodesNum(source, value, &request.nodes_num);
    } else {  // dns_name
      s = ReadString(source, k, value, &request.dns_name);
      if (s.ok()) {
        std::string why = CheckDnsName(request.dns_name);
        if (!why.empty()) s = ErrorAt(source, value, why);
      }
    }
    if (!s.ok()) return s;
  }
  for (std::string_view k : {"name", "nodes_num", "dns_name"}) {
    if (seen.count(std::string(k)) == 0) {
      return absl::InvalidArgumentError(
          fmt::format("parse request {}: {} is missing", source, k));
    }
  }
  absl::StatusOr<ClusterRequest> normalized =
      NormalizeClusterRequest(std::move(request));
  if (!normalized.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("parse request {}: {}", source,
                    std::string(normalized.status().message())));
  }
  return normalized;
}

}  // namespace

absl::Status ValidateClusterRequest(const ClusterRequest& request) {
  for (const std::string& why :
       {CheckName(request.name), CheckNodesNum(request.nodes_num),
        CheckDnsName(request.dns_name)}) {
    if (!why.empty()) {
      return absl::InvalidArgumentError(
          fmt::format("invalid request: {}", why));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ClusterRequest> NormalizeClusterRequest(ClusterRequest request) {
  absl::Status valid = ValidateClusterRequest(request);
  if (!valid.ok()) return valid;
  if (!request.dns_name.empty() && request.dns_name.back() == '.') {
    request.dns_name.pop_back();
  }
  absl::AsciiStrToLower(&request.dns_name);
  return request;
}

absl::StatusOr<ClusterRequest> ParseClusterRequest(std::string_view yaml_text,
                                                   std::string_view source) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) {
      return absl::InvalidArgumentError(
          fmt::format("parse request {}: malformed YAML: {}", source, e.msg));
    }
    return absl::InvalidArgumentError(fmt::format(
        "parse request {}: malformed YAML at line {}, column {}: {}", source,
        e.mark.line + 1, e.mark.column + 1, e.msg));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        fmt::format("parse request {}: malformed YAML: {}", source, e.what()));
  }
  if (documents.size() > 1) {
    return absl::InvalidArgumentError(
        fmt::format("parse request {}: want one YAML document, got {}", source,
                    documents.size()));
  }
  try {
    return ParseDocument(source,
                         documents.empty() ? YAML::Node() : documents[0]);
  } catch (const std::exception& e) {
    // yaml-cpp accessors may throw on odd input; refuse it, never crash.
    return absl::InvalidArgumentError(
        fmt::format("parse request {}: {}", source, e.what()));
  }
}

absl::StatusOr<ClusterRequest> LoadClusterRequest(const std::string& path) {
  std::error_code ec;
  std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(st)) {
    return absl::NotFoundError(
        fmt::format("read request {}: no such file", path));
  }
  if (!std::filesystem::is_regular_file(st)) {
    return absl::InvalidArgumentError(
        fmt::format("read request {}: not a regular file", path));
  }
  uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        fmt::format("read request {}: {}", path, ec.message()));
  }
  if (size > static_cast<uintmax_t>(kMaxRequestFileBytes)) {
    return absl::InvalidArgumentError(
        fmt::format("read request {}: {} bytes, at most {} allowed", path, size,
                    kMaxRequestFileBytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        fmt::format("read request {}: cannot open the file", path));
  }
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  if (in.bad()) {
    return absl::InvalidArgumentError(
        fmt::format("read request {}: read failed", path));
  }
  return ParseClusterRequest(text, path);
}

}  // namespace cucumber
