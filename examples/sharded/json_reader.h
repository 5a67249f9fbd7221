// A small JSON reader for the fleet demo's programs: the API service reads
// request bodies with it, the HTTP client reads the service's answers, and
// the orchestrator reads the service's stats and the pods' JSON logs.
//
//   absl::StatusOr<JsonValue> v = ParseJson(R"({"a": [1, "x"]})");
//   const JsonValue* a = v->Find("a");  // nullptr when absent
//   a->items()[1].str();                // "x"
//
// Numbers keep their text (tokens are 64-bit and must not go through a
// double); AsInt64/AsUint64 convert. Bounded: input size is the caller's
// business, nesting is at most kMaxJsonDepth deep.
//
// Thread safety: values are immutable once parsed; ParseJson is pure.
#ifndef SETPOINT_EXAMPLES_SHARDED_JSON_READER_H_
#define SETPOINT_EXAMPLES_SHARDED_JSON_READER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace sharded {

inline constexpr int kMaxJsonDepth = 32;

class JsonValue {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

  Type type() const { return type_; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_object() const { return type_ == Type::kObject; }
  bool is_array() const { return type_ == Type::kArray; }
  bool boolean() const { return bool_; }
  // The text of a string (unescaped) or of a number (as written).
  const std::string& str() const { return text_; }
  const std::vector<JsonValue>& items() const { return items_; }
  const std::map<std::string, JsonValue>& fields() const { return fields_; }

  // The member `key` of an object, or nullptr.
  const JsonValue* Find(std::string_view key) const {
    auto it = fields_.find(std::string(key));
    return it == fields_.end() ? nullptr : &it->second;
  }
  std::optional<int64_t> AsInt64() const {
    int64_t v = 0;
    if (type_ != Type::kNumber || !absl::SimpleAtoi(text_, &v)) {
      return std::nullopt;
    }
    return v;
  }
  std::optional<uint64_t> AsUint64() const {
    uint64_t v = 0;
    if (type_ != Type::kNumber || !absl::SimpleAtoi(text_, &v)) {
      return std::nullopt;
    }
    return v;
  }
  // Member `key` as a 64-bit integer, or `fallback`.
  int64_t IntOr(std::string_view key, int64_t fallback) const {
    const JsonValue* v = Find(key);
    if (v == nullptr) return fallback;
    return v->AsInt64().value_or(fallback);
  }
  // Member `key` as a string, or "".
  std::string StringOr(std::string_view key) const {
    const JsonValue* v = Find(key);
    return v != nullptr && v->is_string() ? v->str() : std::string();
  }

 private:
  friend class JsonParser;
  Type type_ = Type::kNull;
  bool bool_ = false;
  std::string text_;
  std::vector<JsonValue> items_;
  std::map<std::string, JsonValue> fields_;
};

class JsonParser {
 public:
  explicit JsonParser(std::string_view in) : in_(in) {}

  absl::StatusOr<JsonValue> ParseDocument() {
    JsonValue v;
    if (!Value(&v, 0)) return Error();
    Space();
    if (pos_ != in_.size()) {
      error_ = "trailing characters";
      return Error();
    }
    return v;
  }

 private:
  absl::Status Error() const {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON: ", error_, " at byte ", pos_));
  }
  void Space() {
    while (pos_ < in_.size() && (in_[pos_] == ' ' || in_[pos_] == '\n' ||
                                 in_[pos_] == '\r' || in_[pos_] == '\t')) {
      ++pos_;
    }
  }
  bool Fail(const char* what) {
    error_ = what;
    return false;
  }
  bool Literal(std::string_view word) {
    if (in_.substr(pos_, word.size()) != word) return Fail("bad literal");
    pos_ += word.size();
    return true;
  }
  bool Value(JsonValue* out, int depth) {
    if (depth > kMaxJsonDepth) return Fail("nested too deep");
    Space();
    if (pos_ >= in_.size()) return Fail("unexpected end");
    char c = in_[pos_];
    switch (c) {
      case '{':
        return Object(out, depth);
      case '[':
        return Array(out, depth);
      case '"':
        out->type_ = JsonValue::Type::kString;
        return String(&out->text_);
      case 't':
        out->type_ = JsonValue::Type::kBool;
        out->bool_ = true;
        return Literal("true");
      case 'f':
        out->type_ = JsonValue::Type::kBool;
        return Literal("false");
      case 'n':
        return Literal("null");
      default:
        return Number(out);
    }
  }
  bool Number(JsonValue* out) {
    size_t start = pos_;
    if (pos_ < in_.size() && in_[pos_] == '-') ++pos_;
    size_t digits = pos_;
    while (pos_ < in_.size() &&
           ((in_[pos_] >= '0' && in_[pos_] <= '9') || in_[pos_] == '.' ||
            in_[pos_] == 'e' || in_[pos_] == 'E' || in_[pos_] == '+' ||
            in_[pos_] == '-')) {
      ++pos_;
    }
    if (pos_ == digits || in_[digits] < '0' || in_[digits] > '9') {
      return Fail("bad value");
    }
    out->type_ = JsonValue::Type::kNumber;
    out->text_ = std::string(in_.substr(start, pos_ - start));
    return true;
  }
  static int Hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  bool Hex4(uint32_t* out) {
    if (pos_ + 4 > in_.size()) return Fail("short \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      int h = Hex(in_[pos_++]);
      if (h < 0) return Fail("bad \\u escape");
      v = v * 16 + static_cast<uint32_t>(h);
    }
    *out = v;
    return true;
  }
  static void Utf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  bool String(std::string* out) {
    ++pos_;  // The opening quote.
    while (pos_ < in_.size()) {
      char c = in_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) {
        return Fail("control byte in string");
      }
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (pos_ >= in_.size()) break;
      char e = in_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out->push_back(e);
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t cp = 0;
          if (!Hex4(&cp)) return false;
          if (cp >= 0xD800 && cp < 0xDC00 && pos_ + 6 <= in_.size() &&
              in_[pos_] == '\\' && in_[pos_ + 1] == 'u') {
            pos_ += 2;
            uint32_t low = 0;
            if (!Hex4(&low)) return false;
            if (low < 0xDC00 || low >= 0xE000) return Fail("bad surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xD800 && cp < 0xE000) {
            cp = 0xFFFD;
          }
          Utf8(cp, out);
          break;
        }
        default:
          return Fail("bad escape");
      }
    }
    return Fail("unterminated string");
  }
  bool Array(JsonValue* out, int depth) {
    out->type_ = JsonValue::Type::kArray;
    ++pos_;
    Space();
    if (pos_ < in_.size() && in_[pos_] == ']') {
      ++pos_;
      return true;
    }
    while (true) {
      JsonValue item;
      if (!Value(&item, depth + 1)) return false;
      out->items_.push_back(std::move(item));
      Space();
      if (pos_ >= in_.size()) return Fail("unterminated array");
      char c = in_[pos_++];
      if (c == ']') return true;
      if (c != ',') return Fail("expected , or ]");
    }
  }
  bool Object(JsonValue* out, int depth) {
    out->type_ = JsonValue::Type::kObject;
    ++pos_;
    Space();
    if (pos_ < in_.size() && in_[pos_] == '}') {
      ++pos_;
      return true;
    }
    while (true) {
      Space();
      if (pos_ >= in_.size() || in_[pos_] != '"') return Fail("expected key");
      std::string key;
      if (!String(&key)) return false;
      Space();
      if (pos_ >= in_.size() || in_[pos_++] != ':') return Fail("expected :");
      JsonValue item;
      if (!Value(&item, depth + 1)) return false;
      out->fields_[std::move(key)] = std::move(item);
      Space();
      if (pos_ >= in_.size()) return Fail("unterminated object");
      char c = in_[pos_++];
      if (c == '}') return true;
      if (c != ',') return Fail("expected , or }");
    }
  }

  std::string_view in_;
  size_t pos_ = 0;
  std::string error_ = "bad JSON";
};

inline absl::StatusOr<JsonValue> ParseJson(std::string_view text) {
  return JsonParser(text).ParseDocument();
}

}  // namespace sharded

#endif  // SETPOINT_EXAMPLES_SHARDED_JSON_READER_H_
