#include "replay/log_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "base/cat.h"

namespace sluice::replay {
namespace {

using internal::Cat;

constexpr size_t kBufferBytes = 1 << 20;  // a line may be up to kMaxLineBytes of it

gzFile File(void* f) { return static_cast<gzFile>(f); }

}  // namespace

absl::StatusOr<std::unique_ptr<LineReader>> LineReader::Open(const std::string& path) {
  const int fd = path == "-" ? dup(STDIN_FILENO) : open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    const std::string message = Cat(path, ": ", std::strerror(e));
    if (e == ENOENT) return absl::NotFoundError(message);
    if (e == EACCES) return absl::PermissionDeniedError(message);
    return absl::UnavailableError(message);
  }
  auto reader = std::unique_ptr<LineReader>(new LineReader());
  reader->path_ = path;
  struct stat st {};
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) reader->size_ = st.st_size;
  if (S_ISDIR(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(Cat(path, ": is a directory"));
  }
  gzFile file = gzdopen(fd, "rb");
  if (file == nullptr) {
    close(fd);
    return absl::ResourceExhaustedError(Cat(path, ": cannot allocate a zlib stream"));
  }
  gzbuffer(file, 256 * 1024);
  reader->file_ = file;
  reader->buffer_.resize(kBufferBytes);
  return reader;
}

LineReader::~LineReader() {
  if (file_ != nullptr) gzclose(File(file_));
}

int64_t LineReader::position() const {
  if (file_ == nullptr) return 0;
  const z_off_t offset = gzoffset(File(file_));
  return offset < 0 ? 0 : static_cast<int64_t>(offset);
}

bool LineReader::Fill() {
  if (eof_ || !status_.ok()) return false;
  // Keep the unread part, at the front.
  if (begin_ > 0) {
    std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  const size_t room = buffer_.size() - end_;
  const int n = gzread(File(file_), buffer_.data() + end_, static_cast<unsigned>(room));
  if (n < 0) {
    int code = 0;
    const char* message = gzerror(File(file_), &code);
    status_ = absl::DataLossError(Cat(path_, ": after line ", line_number_, ": ",
                                      code == Z_ERRNO ? std::strerror(errno) : message));
    return false;
  }
  if (n == 0) {
    // End of input; a truncated gzip stream reports itself here.
    int code = 0;
    const char* message = gzerror(File(file_), &code);
    if (code != Z_OK && code != Z_STREAM_END) {
      status_ = absl::DataLossError(Cat(path_, ": after line ", line_number_, ": ", message));
    }
    eof_ = true;
    return false;
  }
  end_ += static_cast<size_t>(n);
  return true;
}

bool LineReader::Next(std::string_view& line) {
  too_long_ = false;
  size_t scanned = begin_;
  while (true) {
    const void* nl = std::memchr(buffer_.data() + scanned, '\n', end_ - scanned);
    if (nl != nullptr) {
      const size_t at = static_cast<size_t>(static_cast<const char*>(nl) - buffer_.data());
      const size_t length = at - begin_;
      too_long_ = length > kMaxLineBytes;
      line = too_long_ ? std::string_view() : std::string_view(buffer_.data() + begin_, length);
      begin_ = at + 1;
      ++line_number_;
      return true;
    }
    if (end_ - begin_ > kMaxLineBytes) {
      // A runaway line: drop input up to its end, refilling as needed.
      too_long_ = true;
      ++line_number_;
      while (true) {
        const void* end_nl = std::memchr(buffer_.data() + begin_, '\n', end_ - begin_);
        if (end_nl != nullptr) {
          begin_ = static_cast<size_t>(static_cast<const char*>(end_nl) - buffer_.data()) + 1;
          break;
        }
        begin_ = end_;
        if (!Fill()) break;
      }
      line = std::string_view();
      return true;
    }
    scanned = end_;
    const size_t before = end_ - begin_;
    if (!Fill()) {
      if (end_ > begin_) {  // the last line, without a final newline
        line = std::string_view(buffer_.data() + begin_, end_ - begin_);
        begin_ = end_;
        ++line_number_;
        return true;
      }
      return false;
    }
    scanned = begin_ + before;  // Fill moved the unread part to the front
  }
}

}  // namespace sluice::replay
