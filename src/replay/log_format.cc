// Both formats are read without copying the line: the combined format by a
// hand-written scanner (it is a fixed layout, and a general parser would
// cost more than the rest of a replay). JSON lines are what log shippers
// write: flat objects of strings and numbers, mostly without escapes. Those
// are read by a small scanner (FlatJson below); any other line (an escape,
// a nested value, anything malformed) goes through nlohmann::json's SAX
// interface, which tokenizes without building a tree and words the errors.
// The flat path is what keeps JSON replay above a million lines a second
// (bench/README.md); it is the same split as the decision API's
// ParseFlatCheck. Only the fields a replay reads are copied, into buffers
// reused from line to line.
#include "replay/log_format.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "base/cat.h"

namespace sluice::replay {
namespace {

using internal::Cat;

bool Digits(std::string_view s, size_t pos, size_t n, int& out) {
  if (pos + n > s.size()) return false;
  int v = 0;
  for (size_t i = pos; i < pos + n; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  out = v;
  return true;
}

std::optional<int64_t> EpochSeconds(int y, int mo, int d, int h, int mi, int s) {
  using namespace std::chrono;
  const year_month_day ymd{year{y}, month{static_cast<unsigned>(mo)},
                           day{static_cast<unsigned>(d)}};
  if (!ymd.ok() || h > 23 || mi > 59 || s > 60) return std::nullopt;
  const int64_t days = sys_days(ymd).time_since_epoch().count();
  return days * 86400 + h * 3600 + mi * 60 + s;
}

// ".123456" -> microseconds; digits beyond the sixth are dropped.
size_t Fraction(std::string_view s, size_t pos, int64_t& us) {
  us = 0;
  if (pos >= s.size() || s[pos] != '.') return pos;
  ++pos;
  int64_t scale = 100'000;
  const size_t start = pos;
  while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') {
    us += (s[pos] - '0') * scale;
    scale /= 10;
    ++pos;
  }
  return pos == start ? std::string::npos : pos;
}

bool IsMethod(std::string_view m) {
  return !m.empty() && m.size() <= 32 && std::all_of(m.begin(), m.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || c == '-' || c == '_';
  });
}

// "GET /path HTTP/1.1" -> method and target.
bool SplitRequestLine(std::string_view line, std::string_view& method, std::string_view& target) {
  const size_t sp = line.find(' ');
  if (sp == std::string_view::npos) return false;
  method = line.substr(0, sp);
  std::string_view rest = line.substr(sp + 1);
  const size_t sp2 = rest.find(' ');
  target = sp2 == std::string_view::npos ? rest : rest.substr(0, sp2);
  return IsMethod(method) && !target.empty() &&
         (target.front() == '/' || target.front() == '*' ||
          target.find("://") != std::string_view::npos);
}

// The quoted field starting at line[pos] == '"'; `pos` moves past it.
// Backslash escapes (Apache's \", NGINX's \x22) are skipped, not decoded.
std::optional<std::string_view> Quoted(std::string_view line, size_t& pos) {
  if (pos >= line.size() || line[pos] != '"') return std::nullopt;
  const size_t start = pos + 1;
  for (size_t i = start; i < line.size(); ++i) {
    if (line[i] == '\\') {
      ++i;
    } else if (line[i] == '"') {
      pos = i + 1;
      return line.substr(start, i - start);
    }
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<LogFormat> ParseLogFormat(std::string_view text) {
  if (text == "auto") return LogFormat::kAuto;
  if (text == "combined" || text == "common") return LogFormat::kCombined;
  if (text == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(
      Cat("unknown log format \"", text, "\" (auto, combined, json)"));
}

absl::Status ApplyFieldMapping(std::string_view spec, FieldMap& map) {
  const size_t eq = spec.find('=');
  if (eq == std::string_view::npos || eq == 0 || eq + 1 == spec.size()) {
    return absl::InvalidArgumentError(Cat("field mapping \"", spec, "\": expected NAME=FIELD"));
  }
  const std::string_view name = spec.substr(0, eq);
  const std::string field(spec.substr(eq + 1));
  if (name.substr(0, 7) == "header:" && name.size() > 7) {
    std::string header(name.substr(7));
    for (char& c : header) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    map.headers.emplace_back(std::move(header), field);
    return absl::OkStatus();
  }
  std::vector<std::string>* slot = name == "time"      ? &map.time
                                   : name == "ip"      ? &map.ip
                                   : name == "method"  ? &map.method
                                   : name == "path"    ? &map.path
                                   : name == "request" ? &map.request
                                   : name == "host"    ? &map.host
                                                       : nullptr;
  if (slot == nullptr) {
    return absl::InvalidArgumentError(
        Cat("field mapping \"", spec,
            "\": NAME is one of time, ip, method, path, request, host, "
            "header:HEADER-NAME"));
  }
  *slot = {field};
  return absl::OkStatus();
}

std::string_view LineErrorName(LineError error) {
  switch (error) {
    case LineError::kNone:
      return "ok";
    case LineError::kEmpty:
      return "empty";
    case LineError::kTooLong:
      return "too long";
    case LineError::kSyntax:
      return "not the log format";
    case LineError::kTime:
      return "bad time";
    case LineError::kRequest:
      return "bad request line";
    case LineError::kAddress:
      return "no client address";
    case LineError::kCount:
      break;
  }
  return "?";
}

std::optional<Time> ParseCombinedTime(std::string_view s) {
  // 10/Oct/2000:13:55:36 -0700
  static constexpr std::string_view kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                 "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  int d, y, h, mi, sec, oh, om;
  if (s.size() < 26 || s[2] != '/' || s[6] != '/' || s[11] != ':' || s[14] != ':' || s[17] != ':' ||
      s[20] != ' ' || !Digits(s, 0, 2, d) || !Digits(s, 7, 4, y) || !Digits(s, 12, 2, h) ||
      !Digits(s, 15, 2, mi) || !Digits(s, 18, 2, sec) || !Digits(s, 22, 2, oh) ||
      !Digits(s, 24, 2, om) || (s[21] != '+' && s[21] != '-')) {
    return std::nullopt;
  }
  const auto month = std::find(std::begin(kMonths), std::end(kMonths), s.substr(3, 3));
  if (month == std::end(kMonths)) return std::nullopt;
  const std::optional<int64_t> local =
      EpochSeconds(y, static_cast<int>(month - std::begin(kMonths)) + 1, d, h, mi, sec);
  if (!local) return std::nullopt;
  const int64_t offset = (oh * 3600 + om * 60) * (s[21] == '-' ? -1 : 1);
  return Time::FromUnixMicros((*local - offset) * 1'000'000);
}

std::optional<Time> ParseIsoTime(std::string_view s) {
  // 2000-10-10T13:55:36[.123][Z|+02:00|+0200]
  int y, mo, d, h, mi, sec;
  if (s.size() < 19 || s[4] != '-' || s[7] != '-' ||
      (s[10] != 'T' && s[10] != ' ' && s[10] != 't') || s[13] != ':' || s[16] != ':' ||
      !Digits(s, 0, 4, y) || !Digits(s, 5, 2, mo) || !Digits(s, 8, 2, d) || !Digits(s, 11, 2, h) ||
      !Digits(s, 14, 2, mi) || !Digits(s, 17, 2, sec)) {
    return std::nullopt;
  }
  int64_t frac_us = 0;
  size_t pos = Fraction(s, 19, frac_us);
  if (pos == std::string::npos) return std::nullopt;
  int64_t offset = 0;
  if (pos < s.size()) {
    const std::string_view zone = s.substr(pos);
    int oh, om;
    if (zone == "Z" || zone == "z") {
      offset = 0;
    } else if ((zone[0] == '+' || zone[0] == '-') && zone.size() == 6 && zone[3] == ':' &&
               Digits(zone, 1, 2, oh) && Digits(zone, 4, 2, om)) {
      offset = (oh * 3600 + om * 60) * (zone[0] == '-' ? -1 : 1);
    } else if ((zone[0] == '+' || zone[0] == '-') && zone.size() == 5 && Digits(zone, 1, 2, oh) &&
               Digits(zone, 3, 2, om)) {
      offset = (oh * 3600 + om * 60) * (zone[0] == '-' ? -1 : 1);
    } else {
      return std::nullopt;
    }
  }
  const std::optional<int64_t> local = EpochSeconds(y, mo, d, h, mi, sec);
  if (!local) return std::nullopt;
  return Time::FromUnixMicros((*local - offset) * 1'000'000 + frac_us);
}

std::optional<Time> ParseEpochSeconds(std::string_view s) {
  int64_t seconds = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), seconds);
  if (ec != std::errc() || end == s.data() || seconds < 0 || seconds > 100'000'000'000)
    return std::nullopt;
  int64_t frac_us = 0;
  const size_t pos = Fraction(s, static_cast<size_t>(end - s.data()), frac_us);
  if (pos != s.size()) return std::nullopt;
  return Time::FromUnixMicros(seconds * 1'000'000 + frac_us);
}

std::optional<Time> ParseAnyTime(std::string_view s) {
  if (s.size() >= 26 && s[2] == '/') return ParseCombinedTime(s);
  if (s.size() >= 19 && s[4] == '-') return ParseIsoTime(s);
  return ParseEpochSeconds(s);
}

std::string FormatUtc(Time t) {
  using namespace std::chrono;
  const int64_t us = t.unix_micros();
  int64_t seconds = us >= 0 ? us / 1'000'000 : -((-us + 999'999) / 1'000'000);
  const int64_t frac = us - seconds * 1'000'000;
  const int64_t day_count = seconds >= 0 ? seconds / 86400 : -((-seconds + 86399) / 86400);
  const int64_t in_day = seconds - day_count * 86400;
  const year_month_day ymd{sys_days{days{day_count}}};
  char buf[48];
  std::snprintf(buf, sizeof buf, "%04d-%02u-%02uT%02d:%02d:%02d", static_cast<int>(ymd.year()),
                static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()),
                static_cast<int>(in_day / 3600), static_cast<int>(in_day / 60 % 60),
                static_cast<int>(in_day % 60));
  std::string out = buf;
  if (frac != 0) {
    std::snprintf(buf, sizeof buf, ".%03d", static_cast<int>(frac / 1000));
    out += buf;
  }
  return out + "Z";
}

// ---- JSON ----

// The SAX handler: remembers the top-level fields a replay reads.
struct LogParser::JsonState : nlohmann::json_sax<nlohmann::json> {
  enum Part { kTime, kIp, kMethod, kPath, kRequest, kHost, kParts };
  struct Slot {
    std::string value;
    size_t rank = SIZE_MAX;  // position of the field in its candidate list; lower wins
  };

  explicit JsonState(const FieldMap& f) : fields(f), mapped(f.headers.size()) {}

  void Reset() {
    depth = 0;
    for (Slot& s : parts) s.rank = SIZE_MAX;
    for (Slot& s : mapped) s.rank = SIZE_MAX;
    http_count = 0;
  }

  // Which slots the current key feeds.
  bool key(string_t& k) override {
    if (depth != 1) return true;
    target_part = kParts;
    target_rank = SIZE_MAX;
    const std::vector<std::string>* lists[kParts] = {&fields.time, &fields.ip,      &fields.method,
                                                     &fields.path, &fields.request, &fields.host};
    for (int p = 0; p < kParts && target_part == kParts; ++p) {
      const std::vector<std::string>& list = *lists[p];
      for (size_t i = 0; i < list.size(); ++i) {
        if (list[i] == k) {
          target_part = p;
          target_rank = i;
          break;
        }
      }
    }
    target_mapped = SIZE_MAX;
    for (size_t i = 0; i < fields.headers.size(); ++i) {
      if (fields.headers[i].second == k) target_mapped = i;
    }
    http_header = k.size() > 5 && k.compare(0, 5, "http_") == 0;
    if (http_header) {
      current_header.assign(k, 5);
      for (char& c : current_header) {
        c = c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      }
    }
    return true;
  }

  void Offer(std::string_view v) {
    if (depth != 1) return;
    if (target_part != kParts && target_rank < parts[target_part].rank) {
      parts[target_part].value.assign(v);
      parts[target_part].rank = target_rank;
    }
    if (target_mapped != SIZE_MAX) {
      mapped[target_mapped].value.assign(v);
      mapped[target_mapped].rank = 0;
    }
    if (http_header) {
      if (http_count == http.size()) http.emplace_back();
      http[http_count].first.assign(current_header);
      http[http_count].second.assign(v);
      ++http_count;
    }
  }

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t v) override { return Number(v); }
  bool number_unsigned(number_unsigned_t v) override { return Number(v); }
  bool number_float(number_float_t, const string_t& s) override {
    Offer(s);
    return true;
  }
  bool string(string_t& v) override {
    Offer(v);
    return true;
  }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    ++depth;
    return depth < 64;
  }
  bool end_object() override {
    --depth;
    return true;
  }
  bool start_array(std::size_t) override {
    ++depth;
    return depth < 64;
  }
  bool end_array() override {
    --depth;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

  template <typename T>
  bool Number(T v) {
    char buf[32];
    const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
    Offer(std::string_view(buf, static_cast<size_t>(end - buf)));
    return true;
  }

  const FieldMap& fields;
  int depth = 0;
  Slot parts[kParts];
  std::vector<Slot> mapped;
  std::vector<std::pair<std::string, std::string>> http;
  size_t http_count = 0;
  int target_part = kParts;
  size_t target_rank = SIZE_MAX;
  size_t target_mapped = SIZE_MAX;
  bool http_header = false;
  std::string current_header;
};

namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t'; }

// A flat object of strings without escapes, numbers, booleans and nulls,
// fed to `sax` as the SAX parser would feed it. false: not that shape (the
// caller then runs the SAX parser, which also decides whether it is JSON).
bool FlatJson(std::string_view s, LogParser::JsonSax& sax, std::string& key_buffer) {
  size_t pos = 0;
  auto skip = [&] {
    while (pos < s.size() && IsSpace(s[pos])) ++pos;
  };
  // The string starting at s[pos] == '"'; false if it holds an escape or a
  // control character.
  auto string = [&](std::string_view& out) {
    const size_t start = ++pos;
    while (pos < s.size()) {
      const char c = s[pos];
      if (c == '"') {
        out = s.substr(start, pos - start);
        ++pos;
        return true;
      }
      if (c == '\\' || static_cast<unsigned char>(c) < 0x20) return false;
      ++pos;
    }
    return false;
  };
  skip();
  if (pos >= s.size() || s[pos] != '{') return false;
  ++pos;
  sax.start_object(0);
  skip();
  if (pos < s.size() && s[pos] == '}') {
    ++pos;
  } else {
    while (true) {
      skip();
      std::string_view key;
      if (pos >= s.size() || s[pos] != '"' || !string(key)) return false;
      key_buffer.assign(key);
      sax.key(key_buffer);
      skip();
      if (pos >= s.size() || s[pos] != ':') return false;
      ++pos;
      skip();
      if (pos >= s.size()) return false;
      if (s[pos] == '"') {
        std::string_view value;
        if (!string(value)) return false;
        sax.Offer(value);
      } else {
        const size_t start = pos;
        while (pos < s.size() && s[pos] != ',' && s[pos] != '}' && !IsSpace(s[pos])) ++pos;
        const std::string_view token = s.substr(start, pos - start);
        if (token == "true" || token == "false" || token == "null") {
          // not a field a replay reads
        } else if (!token.empty() && (token[0] == '-' || (token[0] >= '0' && token[0] <= '9')) &&
                   std::all_of(token.begin(), token.end(), [](char c) {
                     return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' ||
                            c == 'e' || c == 'E';
                   })) {
          sax.Offer(token);
        } else {
          return false;  // a nested value, or not JSON
        }
      }
      skip();
      if (pos < s.size() && s[pos] == ',') {
        ++pos;
        continue;
      }
      if (pos < s.size() && s[pos] == '}') {
        ++pos;
        break;
      }
      return false;
    }
  }
  skip();
  return pos == s.size();
}

}  // namespace

LogParser::LogParser(LogFormat format, FieldMap fields)
    : format_(format), fields_(std::move(fields)), json_(std::make_unique<JsonState>(fields_)) {}

LogParser::~LogParser() = default;

LineError LogParser::Parse(std::string_view line, LogRecord& record) {
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) {
    line.remove_suffix(1);
  }
  size_t first = 0;
  while (first < line.size() && (line[first] == ' ' || line[first] == '\t')) ++first;
  line.remove_prefix(first);
  if (line.empty()) return LineError::kEmpty;
  if (format_ == LogFormat::kAuto)
    format_ = line.front() == '{' ? LogFormat::kJson : LogFormat::kCombined;
  record.headers.clear();
  record.host = {};
  return format_ == LogFormat::kJson ? ParseJson(line, record) : ParseCombined(line, record);
}

LineError LogParser::ParseCombined(std::string_view line, LogRecord& record) {
  // $remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent ...
  const size_t sp = line.find(' ');
  if (sp == std::string_view::npos || sp == 0) return LineError::kSyntax;
  record.ip = line.substr(0, sp);
  const size_t open = line.find(" [", sp);
  if (open == std::string_view::npos) return LineError::kSyntax;
  const size_t close = line.find(']', open + 2);
  if (close == std::string_view::npos) return LineError::kSyntax;
  const std::optional<Time> t = ParseCombinedTime(line.substr(open + 2, close - open - 2));
  if (!t) return LineError::kTime;
  record.time = *t;
  size_t pos = close + 1;
  if (pos + 1 >= line.size() || line[pos] != ' ') return LineError::kSyntax;
  ++pos;
  const std::optional<std::string_view> request = Quoted(line, pos);
  if (!request) return LineError::kSyntax;
  if (!SplitRequestLine(*request, record.method, record.target)) return LineError::kRequest;
  // Status and size, then the optional quoted referer, user agent, X-Forwarded-For.
  static constexpr std::string_view kHeaders[] = {"referer", "user-agent", "x-forwarded-for"};
  size_t header = 0;
  while (pos < line.size() && header < std::size(kHeaders)) {
    while (pos < line.size() && line[pos] == ' ') ++pos;
    if (pos >= line.size()) break;
    if (line[pos] != '"') {
      if (header > 0) break;  // something after the quoted fields: stop reading
      const size_t next = line.find(' ', pos);
      pos = next == std::string_view::npos ? line.size() : next;
      continue;
    }
    const std::optional<std::string_view> value = Quoted(line, pos);
    if (!value) return LineError::kSyntax;
    if (*value != "-" && !value->empty()) record.headers.emplace_back(kHeaders[header], *value);
    ++header;
  }
  return LineError::kNone;
}

LineError LogParser::ParseJson(std::string_view line, LogRecord& record) {
  JsonState& j = *json_;
  j.Reset();
  if (line.front() != '{') return LineError::kSyntax;
  if (!FlatJson(line, j, json_key_)) {
    j.Reset();
    if (!nlohmann::json::sax_parse(line.data(), line.data() + line.size(), &j))
      return LineError::kSyntax;
  }
  using P = JsonState;
  if (j.parts[P::kTime].rank == SIZE_MAX) return LineError::kTime;
  const std::optional<Time> t = ParseAnyTime(j.parts[P::kTime].value);
  if (!t) return LineError::kTime;
  record.time = *t;
  if (j.parts[P::kIp].rank == SIZE_MAX || j.parts[P::kIp].value.empty()) return LineError::kAddress;
  record.ip = j.parts[P::kIp].value;
  if (j.parts[P::kMethod].rank != SIZE_MAX) record.method = j.parts[P::kMethod].value;
  if (j.parts[P::kPath].rank != SIZE_MAX) {
    record.target = j.parts[P::kPath].value;
    if (j.parts[P::kMethod].rank == SIZE_MAX) record.method = "GET";
  } else if (j.parts[P::kRequest].rank != SIZE_MAX) {
    std::string_view method;
    if (!SplitRequestLine(j.parts[P::kRequest].value, method, record.target))
      return LineError::kRequest;
    if (j.parts[P::kMethod].rank == SIZE_MAX) record.method = method;
  } else {
    return LineError::kRequest;
  }
  if (record.target.empty() || !IsMethod(record.method)) return LineError::kRequest;
  if (j.parts[P::kHost].rank != SIZE_MAX) record.host = j.parts[P::kHost].value;
  for (size_t i = 0; i < j.mapped.size(); ++i) {
    if (j.mapped[i].rank != SIZE_MAX)
      record.headers.emplace_back(fields_.headers[i].first, j.mapped[i].value);
  }
  for (size_t i = 0; i < j.http_count; ++i)
    record.headers.emplace_back(j.http[i].first, j.http[i].second);
  return LineError::kNone;
}

}  // namespace sluice::replay
