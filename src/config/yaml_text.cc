#include "config/yaml_text.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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
