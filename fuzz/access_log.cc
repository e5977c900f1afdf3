// Fuzz target: access-log lines as `sluice replay` reads them (replay::
// LogParser): the input split into lines, each line through the combined
// format, JSON lines (with a header mapping) and the auto-detecting parser;
// the time of every line read is formatted back (FormatUtc).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "replay/log_format.h"

namespace {

using sluice::replay::FieldMap;
using sluice::replay::LineError;
using sluice::replay::LogFormat;
using sluice::replay::LogParser;
using sluice::replay::LogRecord;

FieldMap JsonFields() {
  FieldMap fields;
  (void)sluice::replay::ApplyFieldMapping("header:X-Api-Key=api_key", fields);
  return fields;
}

void Read(LogParser& parser, std::string_view line, LogRecord& record) {
  if (parser.Parse(line, record) != LineError::kNone) return;
  (void)sluice::replay::FormatUtc(record.time);
  (void)record.Header("x-api-key");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  LogParser combined(LogFormat::kCombined, {});
  LogParser json(LogFormat::kJson, JsonFields());
  LogParser any(LogFormat::kAuto, {});
  LogRecord record;
  while (!rest.empty()) {
    const size_t newline = rest.find('\n');
    const std::string_view line = rest.substr(0, newline);
    rest = newline == std::string_view::npos ? std::string_view() : rest.substr(newline + 1);
    Read(combined, line, record);
    Read(json, line, record);
    Read(any, line, record);
  }
  return 0;
}
