// LineReader: the lines of a file, plain or gzip-compressed, in constant
// memory. Internal to `sluice replay`.
//
// zlib's gz* functions read both: a file that is not gzip passes through
// unchanged, so the caller never says which it is. Lines end at '\n' (a
// '\r' before it is the parser's business); a line longer than
// kMaxLineBytes is skipped, returned as an empty view with too_long() set,
// so one runaway line costs no memory.
//
// Thread-safety: one reader per thread.
//
//   absl::StatusOr<std::unique_ptr<LineReader>> in = LineReader::Open("access.log.gz");
//   std::string_view line;
//   while ((*in)->Next(line)) ...;
//   if (!(*in)->status().ok()) ...;  // a read error or a damaged gzip stream
#ifndef SLUICE_REPLAY_LOG_READER_H_
#define SLUICE_REPLAY_LOG_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace sluice::replay {

inline constexpr size_t kMaxLineBytes = 64 * 1024;

class LineReader {
 public:
  // `path` "-" reads standard input. Errors: NotFound / PermissionDenied.
  static absl::StatusOr<std::unique_ptr<LineReader>> Open(const std::string& path);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line, valid until the next call; false at the end of the
  // input or after an error (see status()).
  bool Next(std::string_view& line);
  bool too_long() const { return too_long_; }
  int64_t line_number() const { return line_number_; }

  // Bytes of the file read so far (compressed bytes for gzip) and the
  // file's size (0 when unknown, e.g. a pipe): what a progress bar shows.
  int64_t position() const;
  int64_t size() const { return size_; }

  absl::Status status() const { return status_; }

 private:
  LineReader() = default;
  bool Fill();  // reads more into buffer_; false at the end or on error

  void* file_ = nullptr;  // gzFile
  std::string path_;
  std::vector<char> buffer_;
  size_t begin_ = 0;  // unread data is buffer_[begin_, end_)
  size_t end_ = 0;
  bool eof_ = false;
  bool too_long_ = false;
  int64_t line_number_ = 0;
  int64_t size_ = 0;
  absl::Status status_;
};

}  // namespace sluice::replay

#endif  // SLUICE_REPLAY_LOG_READER_H_
