#include "replay/log_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice::replay {
namespace {

TEST(ReplayTimes, CombinedIsoAndEpochAgree) {
  // 2000-10-10T20:55:36Z, three ways.
  const Time t = Time::FromUnixMicros(971211336LL * 1'000'000);
  EXPECT_EQ(ParseCombinedTime("10/Oct/2000:13:55:36 -0700"), t);
  EXPECT_EQ(ParseIsoTime("2000-10-10T20:55:36Z"), t);
  EXPECT_EQ(ParseIsoTime("2000-10-10T22:55:36+02:00"), t);
  EXPECT_EQ(ParseIsoTime("2000-10-10 22:55:36+0200"), t);
  EXPECT_EQ(ParseIsoTime("2000-10-10T20:55:36"), t);  // no zone: UTC
  EXPECT_EQ(ParseEpochSeconds("971211336"), t);
  EXPECT_EQ(ParseIsoTime("2000-10-10T20:55:36.250Z"), t + Duration::Millis(250));
  EXPECT_EQ(ParseEpochSeconds("971211336.123456789"), t + Duration::Micros(123456));
  EXPECT_EQ(ParseAnyTime("10/Oct/2000:13:55:36 -0700"), t);
  EXPECT_EQ(ParseAnyTime("2000-10-10T20:55:36Z"), t);
  EXPECT_EQ(ParseAnyTime("971211336.5"), t + Duration::Millis(500));
  EXPECT_EQ(FormatUtc(t), "2000-10-10T20:55:36Z");
  EXPECT_EQ(FormatUtc(t + Duration::Millis(250)), "2000-10-10T20:55:36.250Z");
}

TEST(ReplayTimes, GarbageIsRejected) {
  EXPECT_FALSE(ParseCombinedTime("10/Foo/2000:13:55:36 -0700"));
  EXPECT_FALSE(ParseCombinedTime("31/Feb/2000:13:55:36 -0700"));
  EXPECT_FALSE(ParseCombinedTime("10/Oct/2000:25:55:36 -0700"));
  EXPECT_FALSE(ParseIsoTime("2000-10-10T20:55:36+2"));
  EXPECT_FALSE(ParseIsoTime("yesterday"));
  EXPECT_FALSE(ParseEpochSeconds("12abc"));
  EXPECT_FALSE(ParseEpochSeconds("-5"));
  EXPECT_FALSE(ParseAnyTime(""));
}

TEST(ReplayCombined, ReadsTheNginxMainFormat) {
  LogParser parser(LogFormat::kAuto, {});
  LogRecord r;
  ASSERT_EQ(
      parser.Parse(
          "203.0.113.7 - alice [10/Oct/2000:13:55:36 -0700] \"POST /login?next=%2F HTTP/1.1\" "
          "401 512 \"https://example.com/\" \"curl/8.0\" \"198.51.100.1, 10.0.0.2\"",
          r),
      LineError::kNone);
  EXPECT_EQ(parser.format(), LogFormat::kCombined);
  EXPECT_EQ(r.ip, "203.0.113.7");
  EXPECT_EQ(r.time, Time::FromUnixMicros(971211336LL * 1'000'000));
  EXPECT_EQ(r.method, "POST");
  EXPECT_EQ(r.target, "/login?next=%2F");
  EXPECT_EQ(r.Header("referer"), "https://example.com/");
  EXPECT_EQ(r.Header("user-agent"), "curl/8.0");
  EXPECT_EQ(r.Header("x-forwarded-for"), "198.51.100.1, 10.0.0.2");
}

TEST(ReplayCombined, ReadsTheCommonFormatAndEscapedQuotes) {
  LogParser parser(LogFormat::kCombined, {});
  LogRecord r;
  ASSERT_EQ(parser.Parse("::1 - - [01/Jan/2024:00:00:00 +0000] \"GET / HTTP/1.0\" 200 -\r", r),
            LineError::kNone);
  EXPECT_EQ(r.ip, "::1");
  EXPECT_EQ(r.target, "/");
  EXPECT_TRUE(r.headers.empty());
  ASSERT_EQ(parser.Parse("1.2.3.4 - - [01/Jan/2024:00:00:00 +0000] \"GET /a HTTP/1.1\" 200 1 \"-\" "
                         "\"say \\\"hi\\\"\"",
                         r),
            LineError::kNone);
  EXPECT_EQ(r.Header("user-agent"), "say \\\"hi\\\"");
  EXPECT_FALSE(r.Header("referer"));  // "-" is no header
}

TEST(ReplayCombined, BrokenLinesSayWhy) {
  LogParser parser(LogFormat::kCombined, {});
  LogRecord r;
  EXPECT_EQ(parser.Parse("", r), LineError::kEmpty);
  EXPECT_EQ(parser.Parse("garbage", r), LineError::kSyntax);
  EXPECT_EQ(parser.Parse("1.2.3.4 - - [yesterday] \"GET / HTTP/1.1\" 200 1", r), LineError::kTime);
  EXPECT_EQ(parser.Parse("1.2.3.4 - - [01/Jan/2024:00:00:00 +0000] \"-\" 400 0", r),
            LineError::kRequest);
  EXPECT_EQ(parser.Parse("1.2.3.4 - - [01/Jan/2024:00:00:00 +0000] \"\\x16\\x03\\x01\" 400 0", r),
            LineError::kRequest);
  EXPECT_EQ(parser.Parse("1.2.3.4 - - [01/Jan/2024:00:00:00 +0000] \"GET / HTTP/1.1", r),
            LineError::kSyntax);
}

TEST(ReplayJson, ReadsTheUsualFieldNamesAndHttpHeaders) {
  LogParser parser(LogFormat::kAuto, {});
  LogRecord r;
  ASSERT_EQ(parser.Parse(
                R"({"time_iso8601": "2024-01-01T00:00:01+00:00", "remote_addr": "10.0.0.1",)"
                R"( "request_method": "GET", "request_uri": "/api/x?y=1", "host": "Example.com",)"
                R"( "status": 200, "http_x_api_key": "k-1", "nested": {"remote_addr": "no"}})",
                r),
            LineError::kNone);
  EXPECT_EQ(parser.format(), LogFormat::kJson);
  EXPECT_EQ(r.time, Time::FromUnixMicros(1704067201LL * 1'000'000));
  EXPECT_EQ(r.ip, "10.0.0.1");
  EXPECT_EQ(r.method, "GET");
  EXPECT_EQ(r.target, "/api/x?y=1");
  EXPECT_EQ(r.host, "Example.com");
  EXPECT_EQ(r.Header("x-api-key"), "k-1");
}

TEST(ReplayJson, FieldMappingAndNumbers) {
  FieldMap fields;
  ASSERT_TRUE(ApplyFieldMapping("time=ts", fields).ok());
  ASSERT_TRUE(ApplyFieldMapping("ip=client", fields).ok());
  ASSERT_TRUE(ApplyFieldMapping("header:X-Tenant=tenant", fields).ok());
  EXPECT_FALSE(ApplyFieldMapping("color=red", fields).ok());
  EXPECT_FALSE(ApplyFieldMapping("time", fields).ok());
  LogParser parser(LogFormat::kJson, fields);
  LogRecord r;
  ASSERT_EQ(
      parser.Parse(
          R"({"ts": 1704067201.5, "client": "10.0.0.9", "request": "PUT /v1/items HTTP/2.0", "tenant": 7})",
          r),
      LineError::kNone);
  EXPECT_EQ(r.time, Time::FromUnixMicros(1704067201LL * 1'000'000 + 500'000));
  EXPECT_EQ(r.ip, "10.0.0.9");
  EXPECT_EQ(r.method, "PUT");
  EXPECT_EQ(r.target, "/v1/items");
  EXPECT_EQ(r.Header("x-tenant"), "7");
  ASSERT_EQ(parser.Parse(R"({"ts": 1704067202, "client": "10.0.0.9", "path": "/p"})", r),
            LineError::kNone);
  EXPECT_EQ(r.method, "GET");          // a path without a method
  EXPECT_FALSE(r.Header("x-tenant"));  // nothing left over from the previous line
}

TEST(ReplayJson, FlatLinesAndLinesNeedingTheFullParserReadAlike) {
  // The first line takes the flat scanner; the escape and the nesting send
  // the others through nlohmann::json, with the same result.
  LogParser parser(LogFormat::kJson, {});
  LogRecord r;
  for (
      std::string_view line :
      {R"({"time": 1704067201, "remote_addr": "10.0.0.1", "path": "/a", "http_x_k": "v"})",
       R"({"time": 1704067201, "remote_addr": "10.0.0.1", "path": "/a", "http_x_k": "v", "note": "say \"hi\""})",
       R"({"time": 1704067201, "remote_addr": "10.0.0.1", "path": "/a", "http_x_k": "v", "tags": [1, {"a": 2}]})",
       R"(  { "time" : 1704067201 , "remote_addr":"10.0.0.1","path":"/a","http_x_k":"v", "ok": true, "z": null }  )"}) {
    ASSERT_EQ(parser.Parse(line, r), LineError::kNone) << line;
    EXPECT_EQ(r.time, Time::FromUnixMicros(1704067201LL * 1'000'000)) << line;
    EXPECT_EQ(r.ip, "10.0.0.1") << line;
    EXPECT_EQ(r.target, "/a") << line;
    EXPECT_EQ(r.Header("x-k"), "v") << line;
  }
  ASSERT_EQ(parser.Parse(R"({"time": 1, "remote_addr": "10.0.0.1", "path": "/\u0061"})", r),
            LineError::kNone);
  EXPECT_EQ(r.target, "/a");  // decoded by the full parser
  EXPECT_EQ(parser.Parse(R"({"time": 1, "remote_addr": "10.0.0.1", "path": "/a"} trailing)", r),
            LineError::kSyntax);
  EXPECT_EQ(parser.Parse(R"({"time": 1, "remote_addr": "10.0.0.1", "path": "/a", "x": nope})", r),
            LineError::kSyntax);
}

TEST(ReplayJson, BrokenLinesSayWhy) {
  LogParser parser(LogFormat::kJson, {});
  LogRecord r;
  EXPECT_EQ(parser.Parse(R"({"time": 1, "remote_addr": "1.2.3.4", "path": "/")", r),
            LineError::kSyntax);
  EXPECT_EQ(parser.Parse(R"([1, 2])", r), LineError::kSyntax);
  EXPECT_EQ(parser.Parse(R"({"remote_addr": "1.2.3.4", "path": "/"})", r), LineError::kTime);
  EXPECT_EQ(parser.Parse(R"({"time": "soon", "remote_addr": "1.2.3.4", "path": "/"})", r),
            LineError::kTime);
  EXPECT_EQ(parser.Parse(R"({"time": 1, "path": "/"})", r), LineError::kAddress);
  EXPECT_EQ(parser.Parse(R"({"time": 1, "remote_addr": "1.2.3.4"})", r), LineError::kRequest);
}

}  // namespace
}  // namespace sluice::replay
