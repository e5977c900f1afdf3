#include "config/yaml_text.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <sstream>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>

#include "absl/status/status.h"
#include "base/cat.h"

namespace sluice::internal {

absl::StatusOr<std::string> ReadTextFile(const std::string& path, size_t max_bytes) {
  auto fail = [&path](int error) {
    char buf[256];
    const char* message = strerror_r(error, buf, sizeof buf);  // GNU: returns the text
    return absl::Status(absl::ErrnoToStatusCode(error), Cat(path, ": cannot read: ", message));
  };
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(errno);
  std::string text;
  char buf[64 * 1024];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return fail(error);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (text.size() > max_bytes) {
      close(fd);
      return absl::InvalidArgumentError(Cat(path, ": cannot read: larger than ", max_bytes >> 20,
                                            " MiB, the most a file may be"));
    }
  }
  close(fd);
  return text;
}

std::string PathBeside(std::string_view source, const std::string& given) {
  if (!given.empty() && given.front() == '/') return given;
  const size_t slash = source.rfind('/');
  return slash == std::string_view::npos ? given : Cat(source.substr(0, slash + 1), given);
}

namespace {

// Where a quoted scalar starting at text[pos] ends: the byte after its
// closing quote, or npos when the text ends first. yaml-cpp takes a quote
// that is never closed for a scalar running to the end of the text (`value:
// 'v1` then `rate_limit: ...` loads, as one long string), so this is checked
// here. Single quotes escape a quote by doubling it; double quotes by '\'.
size_t QuotedScalarEnd(std::string_view text, size_t pos) {
  const char quote = text[pos];
  for (size_t i = pos + 1; i < text.size(); ++i) {
    if (quote == '"' && text[i] == '\\') {
      ++i;
    } else if (text[i] == quote) {
      if (quote == '\'' && i + 1 < text.size() && text[i + 1] == '\'') {
        ++i;
      } else {
        return i + 1;
      }
    }
  }
  return std::string_view::npos;
}

// Where each document starts, and the first quoted scalar left open; every
// other event is ignored.
class DocumentStarts final : public YAML::EventHandler {
 public:
  explicit DocumentStarts(std::string_view text) : text_(text) {}
  std::vector<YAML::Mark> starts;
  std::optional<YAML::Mark> unclosed;

  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    const auto pos = static_cast<size_t>(mark.pos);
    if (unclosed || pos >= text_.size() || (text_[pos] != '\'' && text_[pos] != '"')) return;
    if (QuotedScalarEnd(text_, pos) == std::string_view::npos) unclosed = mark;
  }
  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

 private:
  std::string_view text_;
};

}  // namespace

std::vector<YAML::Node> LoadAllDocuments(std::string_view yaml) {
  std::istringstream stream{std::string(yaml)};
  YAML::Parser parser(stream);
  DocumentStarts documents(yaml);
  // Every document but a stuck one consumes at least one token, so this
  // loop ends; two documents starting at the same place are a stuck one.
  while (parser.HandleNextDocument(documents)) {
    const std::vector<YAML::Mark>& s = documents.starts;
    if (s.size() >= 2 && s.back().pos == s[s.size() - 2].pos) {
      const size_t pos = static_cast<size_t>(s.back().pos);
      throw YAML::ParserException(s.back(), pos < yaml.size()
                                                ? Cat("unexpected '", yaml.substr(pos, 1), "'")
                                                : "unexpected end");
    }
  }
  if (documents.unclosed) {
    throw YAML::ParserException(
        *documents.unclosed,
        Cat("a quoted value starts here and its ",
            yaml[documents.unclosed->pos] == '"' ? "\"" : "'", " is never closed"));
  }
  return YAML::LoadAll(std::string(yaml));
}

int LineOf(const YAML::Node& node, int fallback) {
  const YAML::Mark mark = node.Mark();
  return mark.is_null() ? fallback : mark.line + 1;
}

std::string JoinPath(std::string_view path, std::string_view key) {
  return path.empty() ? std::string(key) : Cat(path, ".", key);
}

std::string DescribeNode(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Scalar:
      return Cat("\"", node.Scalar(), "\"");
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    default:
      return "nothing";
  }
}

}  // namespace sluice::internal
