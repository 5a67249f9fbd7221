// Checks that every C++ snippet of the docs is compiled code: each ```cpp
// block of the markdown files must appear, whitespace aside, in one of the
// source files this test is given. Those are the files under docs/snippets/
// (compiled into this test, or next to it) and the example and test files
// the docs quote (compiled by their own targets). tests/CMakeLists.txt
// passes both lists (SETPOINT_DOC_MARKDOWN, SETPOINT_DOC_SOURCES: paths
// relative to SETPOINT_DOC_ROOT, separated by spaces).
//
// A block matches when the text of the block, with every run of whitespace
// collapsed to one space, occurs in a source file normalized the same way,
// starting and ending at a whitespace boundary.

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

#ifndef SETPOINT_DOC_ROOT
#error "SETPOINT_DOC_ROOT must name the source tree"
#endif

namespace setpoint {
namespace {

std::vector<std::string> ListOf(const char* spaced) {
  return absl::StrSplit(spaced, ' ', absl::SkipEmpty());
}

std::optional<std::string> ReadFile(const std::string& relative) {
  std::ifstream in(std::filesystem::path(SETPOINT_DOC_ROOT) / relative,
                   std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> Words(std::string_view text) {
  std::vector<std::string> words;
  std::string word;
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
    } else {
      word += c;
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

// `text` with every run of whitespace collapsed to one space, trimmed.
std::string Normalize(std::string_view text) {
  return absl::StrJoin(Words(text), " ");
}

struct Block {
  int line = 0;  // Of the opening fence, 1-based.
  std::vector<std::string> lines;
};

bool IsCppTag(std::string_view tag) {
  return tag == "cpp" || tag == "c++" || tag == "cc" || tag == "cxx" ||
         tag == "C++";
}

// The C++ blocks of a markdown text: fenced with ``` (indented or not) and
// tagged cpp. An unterminated fence is reported in `error`.
std::vector<Block> CppBlocks(const std::string& markdown, std::string* error) {
  std::vector<std::string> lines = absl::StrSplit(markdown, '\n');
  std::vector<Block> blocks;
  std::optional<Block> open;
  bool open_is_cpp = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string_view line = lines[i];
    size_t start = line.find_first_not_of(" \t");
    std::string_view trimmed =
        start == std::string_view::npos ? "" : line.substr(start);
    while (!trimmed.empty() &&
           (trimmed.back() == ' ' || trimmed.back() == '\t' ||
            trimmed.back() == '\r')) {
      trimmed.remove_suffix(1);
    }
    if (trimmed.substr(0, 3) != "```") {
      if (open) open->lines.emplace_back(line);
      continue;
    }
    if (open) {
      if (trimmed == "```") {
        if (open_is_cpp) blocks.push_back(std::move(*open));
        open.reset();
      } else if (open_is_cpp) {
        open->lines.emplace_back(line);  // A fence inside a block: text.
      }
      continue;
    }
    open = Block{.line = static_cast<int>(i) + 1, .lines = {}};
    open_is_cpp = IsCppTag(trimmed.substr(3));
  }
  if (open) {
    *error =
        absl::StrCat("the ``` fence of line ", open->line, " is never closed");
  }
  return blocks;
}

struct Source {
  std::string path;
  std::string normalized;
};

// True when `needle` occurs in `hay` starting and ending at a word boundary
// (both are normalized: words separated by single spaces).
bool ContainsWords(const std::string& hay, const std::string& needle) {
  for (size_t at = hay.find(needle); at != std::string::npos;
       at = hay.find(needle, at + 1)) {
    size_t end = at + needle.size();
    if ((at == 0 || hay[at - 1] == ' ') &&
        (end == hay.size() || hay[end] == ' ')) {
      return true;
    }
  }
  return false;
}

// Why `block` is found nowhere: the longest leading part of it that some
// source holds, and the first line after that part.
std::string Mismatch(const Block& block, const std::vector<Source>& sources) {
  std::vector<std::string> words;
  std::vector<size_t> line_of;  // Block line of each word.
  for (size_t l = 0; l < block.lines.size(); ++l) {
    for (std::string& w : Words(block.lines[l])) {
      words.push_back(std::move(w));
      line_of.push_back(l);
    }
  }
  auto prefix_in = [&](size_t n, const Source& s) {
    std::vector<std::string> head(words.begin(), words.begin() + n);
    return s.normalized.find(absl::StrJoin(head, " ")) != std::string::npos;
  };
  size_t best = 0;
  const Source* best_source = nullptr;
  for (const Source& s : sources) {
    // Whether a prefix is found only shrinks as it grows: bisect.
    size_t lo = 0, hi = words.size();
    while (lo < hi) {
      size_t mid = (lo + hi + 1) / 2;
      if (prefix_in(mid, s)) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    if (lo > best) {
      best = lo;
      best_source = &s;
    }
  }
  if (best_source == nullptr) {
    return "not even its first word is in a source file";
  }
  size_t line = best >= words.size() ? line_of.back() : line_of[best];
  return absl::StrCat("closest: ", best_source->path, ", which matches ", best,
                      " of its ", words.size(),
                      " words; the first that differs is on block line ",
                      line + 1, " (markdown line ", block.line + 1 + line,
                      "): `", Normalize(block.lines[line]), "`");
}

class DocSnippetsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const std::string& path : ListOf(SETPOINT_DOC_SOURCES)) {
      std::optional<std::string> text = ReadFile(path);
      ASSERT_TRUE(text.has_value()) << "cannot read source file " << path;
      sources_.push_back({path, Normalize(*text)});
    }
  }

  std::vector<Source> sources_;
};

TEST_F(DocSnippetsTest, EveryCppBlockIsInACompiledSource) {
  int checked = 0;
  std::vector<std::string> names;
  for (const Source& s : sources_) names.push_back(s.path);
  for (const std::string& md : ListOf(SETPOINT_DOC_MARKDOWN)) {
    std::optional<std::string> text = ReadFile(md);
    if (!text.has_value()) {
      ADD_FAILURE() << "cannot read markdown file " << md;
      continue;
    }
    std::string error;
    for (const Block& block : CppBlocks(*text, &error)) {
      ++checked;
      std::string want = Normalize(absl::StrJoin(block.lines, "\n"));
      bool found = std::any_of(
          sources_.begin(), sources_.end(),
          [&](const Source& s) { return ContainsWords(s.normalized, want); });
      if (!found) {
        ADD_FAILURE_AT(md.c_str(), block.line)
            << "the ```cpp block at " << md << ":" << block.line
            << " is not in any compiled source file (whitespace aside).\n"
            << "  " << Mismatch(block, sources_) << "\n"
            << "  Put the snippet, as the doc shows it, in a file under "
               "docs/snippets/ that compiles it, or make the doc quote the "
               "source it comes from exactly. Sources searched: "
            << absl::StrJoin(names, ", ");
      }
    }
    if (!error.empty()) ADD_FAILURE_AT(md.c_str(), 1) << md << ": " << error;
  }
  EXPECT_GT(checked, 0) << "no ```cpp block found at all";
}

// Every markdown file of docs/ (and README.md) is in the list, so a new
// guide cannot escape the check.
TEST(DocSnippets, EveryMarkdownFileIsChecked) {
  std::vector<std::string> listed = ListOf(SETPOINT_DOC_MARKDOWN);
  std::vector<std::string> on_disk = {"README.md"};
  const std::filesystem::path root(SETPOINT_DOC_ROOT);
  for (const auto& entry : std::filesystem::directory_iterator(root / "docs")) {
    if (entry.is_regular_file() && entry.path().extension() == ".md") {
      on_disk.push_back(
          std::filesystem::relative(entry.path(), root).generic_string());
    }
  }
  for (const std::string& path : on_disk) {
    EXPECT_NE(std::find(listed.begin(), listed.end(), path), listed.end())
        << path
        << " is not checked: add it to doc_snippet_markdown in "
           "tests/CMakeLists.txt";
  }
}

TEST(DocSnippets, FindsBlocksAsMarkdownDoes) {
  std::string error;
  std::vector<Block> blocks = CppBlocks(
      "text\n```cpp\nint a;\n```\n```sh\nls\n```\n- item\n\n  ```cpp\n"
      "  f();\n  ```\n```\nplain\n```\n",
      &error);
  EXPECT_EQ(error, "");
  ASSERT_EQ(blocks.size(), 2u);
  EXPECT_EQ(blocks[0].line, 2);
  EXPECT_EQ(blocks[0].lines, std::vector<std::string>{"int a;"});
  EXPECT_EQ(blocks[1].line, 10);
  EXPECT_EQ(blocks[1].lines, std::vector<std::string>{"  f();"});

  CppBlocks("```cpp\nint a;\n", &error);
  EXPECT_EQ(error, "the ``` fence of line 1 is never closed");
}

TEST(DocSnippets, MatchesWholeWordsWhitespaceAside) {
  std::string hay = Normalize("int main() {\n  return  f(x);\n}\n");
  EXPECT_TRUE(ContainsWords(hay, Normalize("return f(x);")));
  EXPECT_TRUE(ContainsWords(hay, Normalize("{ return\tf(x); }")));
  EXPECT_FALSE(ContainsWords(hay, Normalize("urn f(x);")));
  EXPECT_FALSE(ContainsWords(hay, Normalize("return f(x")));
  EXPECT_FALSE(ContainsWords(hay, Normalize("return g(x);")));
}

}  // namespace
}  // namespace setpoint
