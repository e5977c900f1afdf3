// Access-log lines as requests: the NGINX/Apache combined format and JSON
// lines. Internal to `sluice replay`.
//
// combined: `$remote_addr - $remote_user [$time_local] "$request" $status
//   $body_bytes_sent "$http_referer" "$http_user_agent"`, optionally followed
//   by `"$http_x_forwarded_for"` (NGINX's documented `main` format); the
//   common format (without the last two) is accepted too.
// json: one object per line. Which field holds what is a FieldMap; by
//   default the usual names are tried in order (see FieldMap), and any
//   top-level string field named `http_<name>` is the request header <name>
//   (`http_x_api_key` -> X-Api-Key), as NGINX names its variables.
//
// Times: `10/Oct/2000:13:55:36 -0700`, ISO 8601 / RFC 3339
// (`2000-10-10T13:55:36.123+02:00`, `Z`, or no zone for UTC), or epoch
// seconds with an optional fraction (NGINX's $msec, a JSON number).
//
// Thread-safety: a LogParser is used by one thread; the free functions are pure.
//
//   sluice::replay::LogParser parser(sluice::replay::LogFormat::kAuto, {});
//   sluice::replay::LogRecord record;
//   if (parser.Parse(line, record) == sluice::replay::LineError::kNone) use(record);
#ifndef SLUICE_REPLAY_LOG_FORMAT_H_
#define SLUICE_REPLAY_LOG_FORMAT_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/time.h"

namespace sluice::replay {

enum class LogFormat { kAuto, kCombined, kJson };

// "auto", "combined", "json".
absl::StatusOr<LogFormat> ParseLogFormat(std::string_view text);

// Which JSON fields hold a request's parts: the first name present wins.
struct FieldMap {
  std::vector<std::string> time = {"time",       "timestamp", "@timestamp", "time_iso8601",
                                   "time_local", "ts",        "msec"};
  std::vector<std::string> ip = {"remote_addr", "client_ip", "ip", "remote_ip"};
  std::vector<std::string> method = {"method", "request_method"};
  std::vector<std::string> path = {"path", "uri", "request_uri", "url"};
  // "GET /path HTTP/1.1", read when no path field is present.
  std::vector<std::string> request = {"request"};
  std::vector<std::string> host = {"host", "http_host", "server_name"};
  // Extra headers: {lower-case header name, field name}.
  std::vector<std::pair<std::string, std::string>> headers;
};

// One mapping, NAME=FIELD: NAME is time, ip, method, path, request, host or
// header:HEADER-NAME. Replaces the defaults for that part.
absl::Status ApplyFieldMapping(std::string_view spec, FieldMap& map);

// A request as the log tells it. The views point into the line or into the
// parser's buffers and stay valid until the next Parse.
struct LogRecord {
  Time time;
  std::string_view ip;
  std::string_view method;
  std::string_view target;  // as logged, query included
  std::string_view host;
  std::vector<std::pair<std::string_view, std::string_view>> headers;  // lower-case names

  std::optional<std::string_view> Header(std::string_view lower_name) const {
    for (const auto& [name, value] : headers) {
      if (name == lower_name) return value;
    }
    return std::nullopt;
  }
};

// Why a line was skipped.
enum class LineError {
  kNone,
  kEmpty,    // a blank line: not counted as broken
  kTooLong,  // longer than the reader's line limit
  kSyntax,   // not the expected format (or invalid JSON)
  kTime,     // no time, or one that does not parse
  kRequest,  // no method and target (e.g. "-" or a TLS handshake sent to port 80)
  kAddress,  // no client address
  kCount,
};
std::string_view LineErrorName(LineError error);

class LogParser {
 public:
  LogParser(LogFormat format, FieldMap fields);
  ~LogParser();
  LogParser(const LogParser&) = delete;
  LogParser& operator=(const LogParser&) = delete;

  LineError Parse(std::string_view line, LogRecord& record);
  // kAuto until the first non-empty line decides ('{': json, else combined).
  LogFormat format() const { return format_; }

 private:
  LineError ParseCombined(std::string_view line, LogRecord& record);
  LineError ParseJson(std::string_view line, LogRecord& record);

  LogFormat format_;
  FieldMap fields_;
  struct JsonState;
  std::unique_ptr<JsonState> json_;
  std::string json_key_;  // the flat scanner's key, reused

 public:
  using JsonSax = JsonState;  // for the flat scanner in log_format.cc
};

std::optional<Time> ParseCombinedTime(std::string_view text);  // 10/Oct/2000:13:55:36 -0700
std::optional<Time> ParseIsoTime(std::string_view text);       // 2000-10-10T20:55:36Z
std::optional<Time> ParseEpochSeconds(std::string_view text);  // 971211336.123
// Any of the three.
std::optional<Time> ParseAnyTime(std::string_view text);

// "2000-10-10T20:55:36Z" (UTC, whole seconds; ".123" added when not whole).
std::string FormatUtc(Time t);

}  // namespace sluice::replay

#endif  // SLUICE_REPLAY_LOG_FORMAT_H_
