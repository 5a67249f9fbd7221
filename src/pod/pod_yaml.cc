#include "pod_yaml.h"

#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/exceptions.h"
#include "yaml-cpp/mark.h"
#include "yaml-cpp/parser.h"

namespace setpoint {
namespace {

// A pod config nests three levels (document, registry or kinds, a kind);
// anything much deeper is not a pod config.
constexpr size_t kMaxDepth = 32;
// With aliases refused a node costs input bytes, so this bounds memory at a
// few MB whatever the text.
constexpr int kMaxNodes = 100'000;

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      field.empty() ? std::string(what) : absl::StrCat(field, " ", what));
}

// Builds the tree of one document without expanding anything: aliases are
// refused where they appear (so an alias bomb costs its own bytes), as are a
// second document, nesting deeper than kMaxDepth and more than kMaxNodes
// nodes. After the first refusal every event is ignored.
class TreeBuilder final : public YAML::EventHandler {
 public:
  const absl::Status& status() const { return status_; }
  const Yaml& root() const { return root_; }

  void OnDocumentStart(const YAML::Mark& mark) override {
    if (status_.ok() && ++documents_ > 1) {
      Fail(mark,
           "a second YAML document starts here; a pod config is one "
           "document");
    }
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override {
    Add(mark, Yaml::Type::kNull, "");
  }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override {
    Fail(mark,
         "YAML aliases (*name) are refused: a pod config has no need for "
         "them, and they let a small file expand exponentially");
  }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string& value) override {
    Add(mark, Yaml::Type::kScalar, value);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&,
                       YAML::anchor_t, YAML::EmitterStyle::value) override {
    Open(mark, Yaml::Type::kSequence);
  }
  void OnSequenceEnd() override { Close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    Open(mark, Yaml::Type::kMap);
  }
  void OnMapEnd() override { Close(); }

 private:
  static int Line(const YAML::Mark& mark) {
    return mark.is_null() ? 0 : mark.line + 1;
  }
  void Fail(const YAML::Mark& mark, absl::string_view what) {
    if (!status_.ok()) return;
    status_ = Line(mark) > 0 ? Bad(absl::StrCat("line ", Line(mark), ":"), what)
                             : Bad("", what);
  }
  Yaml* Add(const YAML::Mark& mark, Yaml::Type type, const std::string& v) {
    if (!status_.ok()) return nullptr;
    if (++nodes_ > kMaxNodes) {
      Fail(mark, absl::StrCat("more than ", kMaxNodes,
                              " YAML nodes; a pod config needs a few dozen"));
      return nullptr;
    }
    Yaml node{.type = type, .line = Line(mark), .scalar = v, .items = {}};
    if (stack_.empty()) {
      root_ = std::move(node);
      return &root_;
    }
    // Only the innermost open node grows, so pointers to the open nodes
    // (its ancestors) stay valid.
    stack_.back()->items.push_back(std::move(node));
    return &stack_.back()->items.back();
  }
  void Open(const YAML::Mark& mark, Yaml::Type type) {
    Yaml* node = Add(mark, type, "");
    if (node == nullptr) return;
    if (stack_.size() >= kMaxDepth) {
      Fail(mark, absl::StrCat("nests deeper than ", kMaxDepth, " levels"));
      return;
    }
    stack_.push_back(node);
  }
  void Close() {
    if (status_.ok() && !stack_.empty()) stack_.pop_back();
  }

  absl::Status status_;
  Yaml root_;
  std::vector<Yaml*> stack_;
  int documents_ = 0;
  int nodes_ = 0;
};

}  // namespace

absl::StatusOr<Yaml> ParseYaml(const std::string& text) {
  std::istringstream in(text);
  TreeBuilder builder;
  try {
    YAML::Parser parser(in);
    while (builder.status().ok() && parser.HandleNextDocument(builder)) {
    }
  } catch (const YAML::Exception& e) {
    if (e.mark.is_null()) {
      return Bad("", absl::StrCat("not valid YAML: ", e.msg));
    }
    return Bad("", absl::StrCat("not valid YAML at line ", e.mark.line + 1,
                                ", column ", e.mark.column + 1, ": ", e.msg));
  }
  if (!builder.status().ok()) return builder.status();
  return builder.root();
}

const char* TypeName(Yaml::Type t) {
  switch (t) {
    case Yaml::Type::kNull:
      return "empty";
    case Yaml::Type::kScalar:
      return "a value";
    case Yaml::Type::kSequence:
      return "a list";
    case Yaml::Type::kMap:
      return "a map";
  }
  return "?";
}

}  // namespace setpoint
