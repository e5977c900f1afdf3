#include "config/yaml_text.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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
      return absl::InvalidArgumentError(Cat(path, ": cannot read: larger than ",
                                            max_bytes >> 20, " MiB, the most a file may be"));
    }
  }
  close(fd);
  return text;
}

namespace {

// Where each document starts; every other event is ignored.
class DocumentStarts final : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> starts;

  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

}  // namespace

std::vector<YAML::Node> LoadAllDocuments(std::string_view yaml) {
  std::istringstream stream{std::string(yaml)};
  YAML::Parser parser(stream);
  DocumentStarts documents;
  // Every document but a stuck one consumes at least one token, so this
  // loop ends; two documents starting at the same place are a stuck one.
  while (parser.HandleNextDocument(documents)) {
    const std::vector<YAML::Mark>& s = documents.starts;
    if (s.size() >= 2 && s.back().pos == s[s.size() - 2].pos) {
      const size_t pos = static_cast<size_t>(s.back().pos);
      throw YAML::ParserException(
          s.back(), pos < yaml.size() ? Cat("unexpected '", yaml.substr(pos, 1), "'") : "unexpected end");
    }
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
