// The script's C++ side (argv, replies, bounds) and what it leaves in Redis:
// expiry, deletion of fresh keys, size per key, NOSCRIPT.
#include "store/redis/script.h"

#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <type_traits>
#include <variant>
#include <vector>

#include "conformance/algorithms.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "store/redis/script_test_support.h"

namespace sluice::redis {
namespace {

using conformance::Algo;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

LimitConfig Limit(Algorithm algorithm, std::string_view rate, int64_t burst = 0) {
  LimitOptions options;
  options.algorithm = algorithm;
  options.rate = *ParseRate(rate);
  options.burst = burst;
  absl::StatusOr<LimitConfig> config = MakeLimit(options);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

LimitConfig ShapeLimit(std::string_view rate, Duration max_delay, int64_t queue) {
  LimitOptions options;
  options.algorithm = Algorithm::kLeakyBucket;
  options.rate = *ParseRate(rate);
  options.mode = LeakyMode::kShape;
  options.max_delay = max_delay;
  options.queue = queue;
  absl::StatusOr<LimitConfig> config = MakeLimit(options);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

std::vector<std::string> Args(ScriptCall& call) {
  std::vector<std::string> out;
  const char** argv = call.argv();
  for (int i = 0; i < call.argc(); ++i) out.emplace_back(argv[i], call.argvlen()[i]);
  return out;
}

// ---- argv ----

TEST(ScriptCallTest, LaysOutKeysThenFixedArgumentsThenEachLimitsParameters) {
  const std::vector<std::string> a = {"tb", "1", "10000", "20", "200000", "200001"};
  const std::vector<std::string> b = {"fw", "40", "60000000", "", "", ""};
  ScriptCall call;
  call.Start("0123abcd",
             {.op = ScriptOp::kDecide, .now = Time::FromUnixMicros(1704067200000001), .cost = 3},
             2);
  call.AddLimit("{u}:a", a);
  call.AddLimit("{u}:b", b);
  EXPECT_THAT(Args(call), ElementsAre("EVALSHA", "0123abcd", "2", "{u}:a", "{u}:b", "D",
                                      "1704067200000001", "3", "", "tb", "1", "10000", "20",
                                      "200000", "200001", "fw", "40", "60000000", "", "", ""));
}

TEST(ScriptCallTest, ReusedForARefundWithRedisClockAndAHugeCost) {
  const std::vector<std::string> a = {"gc", "3", "250000", "3", "750000", "250001"};
  ScriptCall call;
  call.Start("sha", {.op = ScriptOp::kDecide, .cost = 1}, 3);  // a larger call first
  call.Start("sha",
             {.op = ScriptOp::kRefund, .cost = INT64_MAX, .taken_at = Time::FromUnixMicros(-5)}, 1);
  call.AddLimit("k", a);
  // "" asks the script to read Redis' TIME; costs above 2^52 decide like 2^52.
  EXPECT_THAT(Args(call), ElementsAre("EVALSHA", "sha", "1", "k", "R", "", "4503599627370496", "-5",
                                      "gc", "3", "250000", "3", "750000", "250001"));
  ScriptCall copy = call;  // the copy points at its own numbers
  call.Start("sha", {.op = ScriptOp::kCheck, .cost = 7}, 1);
  call.AddLimit("k", a);
  EXPECT_EQ(Args(copy)[6], "4503599627370496");
  EXPECT_EQ(Args(call)[4], "C");
  EXPECT_EQ(Args(call)[6], "7");
}

TEST(LimitParamsTest, OneGroupOfFixedSizePerAlgorithm) {
  for (const LimitConfig& config :
       {Limit(Algorithm::kTokenBucket, "3/250ms"), Limit(Algorithm::kGcra, "100/s", 20),
        Limit(Algorithm::kLeakyBucket, "7/min"), ShapeLimit("2/s", Duration::Zero(), 3),
        Limit(Algorithm::kFixedWindow, "40/min"), Limit(Algorithm::kSlidingLog, "5/h"),
        Limit(Algorithm::kSlidingWindow, "1/day")}) {
    EXPECT_EQ(LimitParams(config).size(), kParamsPerLimit);
  }
  // 3/250ms is 3 ticks per microsecond, 250000 ticks per token.
  EXPECT_THAT(LimitParams(Limit(Algorithm::kGcra, "3/250ms")),
              ElementsAre("gc", "3", "250000", "3", "750000", "250001"));
  EXPECT_THAT(LimitParams(ShapeLimit("2/s", Duration::Zero(), 3)),
              ElementsAre("ls", "1", "500000", "4", "1500000", ""));
}

// ---- bounds ----

TEST(ValidateForRedisTest, RejectsABucketAboveTwoToThe51TicksAndNamesIt) {
  // 7/day: 86,400,000,000 ticks per token; 26062 of them fit in 2^51, 26063 do not.
  EXPECT_TRUE(ValidateForRedis(Limit(Algorithm::kGcra, "7/day", 26062)).ok());
  const absl::Status s = ValidateForRedis(Limit(Algorithm::kGcra, "7/day", 26063));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("gcra: burst 26063 at rate 7/day"));
  EXPECT_THAT(s.message(), HasSubstr("2^51 = 2251799813685248"));
  EXPECT_FALSE(ValidateForRedis(Limit(Algorithm::kTokenBucket, "2000/us", int64_t{1} << 52)).ok());
  EXPECT_FALSE(ValidateForRedis(Limit(Algorithm::kLeakyBucket, "1/day", 1'000'000)).ok());
}

TEST(ValidateForRedisTest, RejectsAShapeBoundAboveTwoToThe51Ticks) {
  // 2000 ticks per microsecond for a year.
  const absl::Status s = ValidateForRedis(ShapeLimit("2000/us", Duration::Days(365), 0));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("max_delay 365d"));
  EXPECT_THAT(s.message(), HasSubstr("2^51"));
  EXPECT_TRUE(ValidateForRedis(ShapeLimit("2000/us", Duration::Days(1), 0)).ok());
}

TEST(ValidateForRedisTest, AcceptsEveryWindowLimitAndSlidingLogsOfBoundedLength) {
  for (Algorithm a : {Algorithm::kFixedWindow, Algorithm::kSlidingWindow}) {
    EXPECT_TRUE(ValidateForRedis(Limit(a, "1099511627776/366d")).ok());
  }
  EXPECT_TRUE(ValidateForRedis(Limit(Algorithm::kSlidingLog, "10000/366d")).ok());
  EXPECT_THAT(ValidateForRedis(Limit(Algorithm::kSlidingLog, "10001/1s")).message(),
              HasSubstr("use sliding_window, or a local scope"));
}

// ---- replies ----

redisReply Integer(long long v) {
  redisReply r{};
  r.type = REDIS_REPLY_INTEGER;
  r.integer = v;
  return r;
}

TEST(ParseScriptReplyTest, DecodesEachLimitAndTheInfiniteRetry) {
  std::vector<redisReply> items = {Integer(1704067200000000),
                                   Integer(1),
                                   Integer(20),
                                   Integer(19),
                                   Integer(10000),
                                   Integer(0),
                                   Integer(0),
                                   Integer(0),
                                   Integer(4),
                                   Integer(0),
                                   Integer(7),
                                   Integer(-1),
                                   Integer(0)};
  std::vector<redisReply*> pointers;
  for (redisReply& r : items) pointers.push_back(&r);
  redisReply array{};
  array.type = REDIS_REPLY_ARRAY;
  array.elements = pointers.size();
  array.element = pointers.data();
  absl::StatusOr<ScriptResult> result = ParseScriptReply(array, 2);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->now, Time::FromUnixMicros(1704067200000000));
  ASSERT_EQ(result->decisions.size(), 2u);
  EXPECT_TRUE(result->decisions[0].allowed);
  EXPECT_EQ(result->decisions[0].remaining, 19);
  EXPECT_EQ(result->decisions[0].reset_after, Duration::Micros(10000));
  EXPECT_FALSE(result->decisions[1].allowed);
  EXPECT_TRUE(result->decisions[1].can_never_pass());
  // One element short, or a malformed field: Internal.
  array.elements -= 1;
  EXPECT_EQ(ParseScriptReply(array, 2).status().code(), absl::StatusCode::kInternal);
  array.elements += 1;
  items[1].integer = 2;
  EXPECT_EQ(ParseScriptReply(array, 2).status().code(), absl::StatusCode::kInternal);
  items[1].type = REDIS_REPLY_STRING;
  EXPECT_EQ(ParseScriptReply(array, 2).status().code(), absl::StatusCode::kInternal);
}

TEST(ParseScriptReplyTest, ErrorRepliesKeepRedisMessage) {
  auto error = [](std::string text) {
    redisReply r{};
    r.type = REDIS_REPLY_ERROR;
    static std::string keep;
    keep = std::move(text);
    r.str = keep.data();
    r.len = keep.size();
    return ParseScriptReply(r, 1).status();
  };
  const absl::Status noscript = error("NOSCRIPT No matching script. Please use EVAL.");
  EXPECT_TRUE(IsNoScript(noscript));
  EXPECT_THAT(noscript.message(), HasSubstr("No matching script"));
  EXPECT_EQ(error("BUSY Redis is busy running a script").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(error("LOADING Redis is loading").code(), absl::StatusCode::kUnavailable);
  const absl::Status script = error("ERR user_script:1: sluice: cost must not be negative");
  EXPECT_EQ(script.code(), absl::StatusCode::kInternal);
  EXPECT_FALSE(IsNoScript(script));
  redisReply status{};
  status.type = REDIS_REPLY_STATUS;
  EXPECT_EQ(ParseScriptReply(status, 1).status().code(), absl::StatusCode::kInternal);
}

// ---- against Redis ----

TEST_F(RedisTest, TheEmbeddedShaIsTheOneRedisComputes) {
  Reply sha = Command({"SCRIPT", "LOAD", DecideScript()});
  EXPECT_EQ(Text(*sha), DecideScriptSha());
  EXPECT_EQ(DecideScriptSha().size(), 40u);
}

TEST_F(RedisTest, NoScriptAfterAFlushIsRecognizable) {
  const std::vector<std::string> params[] = {LimitParams(Limit(Algorithm::kGcra, "10/s"))};
  const std::string_view keys[] = {"{n}:k"};
  ASSERT_TRUE(Run({.op = ScriptOp::kDecide}, keys, params).ok());
  Command({"SCRIPT", "FLUSH"});
  const absl::StatusOr<ScriptResult> r = Run({.op = ScriptOp::kDecide}, keys, params);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(IsNoScript(r.status())) << r.status();
  // What the client does next: load, retry.
  EXPECT_EQ(Text(*Command({"SCRIPT", "LOAD", DecideScript()})), DecideScriptSha());
  EXPECT_TRUE(Run({.op = ScriptOp::kDecide}, keys, params).ok());
}

TEST_F(RedisTest, ScriptErrorsAndWrongTypesSurfaceAsInternal) {
  const std::vector<std::string> params[] = {LimitParams(Limit(Algorithm::kGcra, "10/s"))};
  const std::string_view keys[] = {"{e}:k"};
  Command({"RPUSH", "{e}:k", "not a gcra state"});
  absl::StatusOr<ScriptResult> r = Run({.op = ScriptOp::kDecide}, keys, params);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(r.status().message(), HasSubstr("WRONGTYPE"));
  // Too few parameters: the script names what it expected.
  const std::vector<std::string> short_params[] = {{"gc", "1", "1", "1", "1", "2"}};
  ScriptCall call;
  call.Start(DecideScriptSha(), {.op = ScriptOp::kDecide}, 2);
  const std::string_view two[] = {"{e}:a", "{e}:b"};
  call.AddLimit(two[0], short_params[0]);  // the second limit never added
  Reply reply(static_cast<redisReply*>(
      redisCommandArgv(context_, call.argc(), call.argv(), call.argvlen())));
  const absl::Status s = ParseScriptReply(*reply, 2).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("sluice: unknown algorithm code"));
}

// ---- expiry: Redis' clock (now "") as in production ----

// When a fresh key's state is fresh again after one decide of `cost` at `now`.
Time FreshAfterDecide(const LimitConfig& config, Time now, int64_t cost) {
  return std::visit(
      [&](const auto& c) {
        using A = Algo<std::decay_t<decltype(c)>>;
        typename A::State state{};
        A::Step(c, state, now, cost);
        return A::FreshTime(c, state);
      },
      config);
}

std::string KeyFor(const LimitConfig& config) {
  return "{x}:" + std::string(AlgorithmName(AlgorithmOf(config))) +
         (IsShape(config) ? "_shape" : "");
}

TEST_F(RedisTest, EveryWriteExpiresWhenTheStateIsFreshAgain) {
  for (const LimitConfig& config :
       {Limit(Algorithm::kTokenBucket, "1/h", 5), Limit(Algorithm::kGcra, "3/250ms"),
        Limit(Algorithm::kLeakyBucket, "7/min"), ShapeLimit("2/s", Duration::Zero(), 3),
        Limit(Algorithm::kFixedWindow, "40/min"), Limit(Algorithm::kSlidingLog, "5/h"),
        Limit(Algorithm::kSlidingWindow, "100/day")}) {
    const std::string key = KeyFor(config);
    SCOPED_TRACE(key);
    const std::vector<std::string> params[] = {LimitParams(config)};
    const std::string_view keys[] = {key};
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<ScriptResult> r = Run({.op = ScriptOp::kDecide, .cost = 2}, keys, params);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->decisions[0].allowed);
    const long long pttl = Command({"PTTL", key})->integer;
    const auto elapsed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::steady_clock::now() - start)
                                .count();
    const int64_t want_ms = (FreshAfterDecide(config, r->now, 2) - r->now).CeilMillis();
    EXPECT_LE(pttl, want_ms);
    EXPECT_GE(pttl, want_ms - elapsed_ms - 1);
  }
}

TEST_F(RedisTest, AKeyWhoseStateIsFreshIsDeleted) {
  // A refund that fills the bucket again leaves nothing to keep.
  for (const LimitConfig& config :
       {Limit(Algorithm::kTokenBucket, "1/h"), Limit(Algorithm::kGcra, "1/h"),
        Limit(Algorithm::kLeakyBucket, "1/h"), Limit(Algorithm::kFixedWindow, "1/h"),
        Limit(Algorithm::kSlidingLog, "1/h"), Limit(Algorithm::kSlidingWindow, "1/h")}) {
    const std::string key = KeyFor(config);
    SCOPED_TRACE(key);
    const std::vector<std::string> params[] = {LimitParams(config)};
    const std::string_view keys[] = {key};
    absl::StatusOr<ScriptResult> r = Run({.op = ScriptOp::kDecide}, keys, params);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(Command({"EXISTS", key})->integer, 1);
    ASSERT_TRUE(Run({.op = ScriptOp::kRefund, .taken_at = r->now}, keys, params).ok());
    EXPECT_EQ(Command({"EXISTS", key})->integer, 0);
    // A peek and a denial create nothing either.
    ASSERT_TRUE(Run({.op = ScriptOp::kDecide, .cost = 0}, keys, params).ok());
    ASSERT_TRUE(Run({.op = ScriptOp::kDecide, .cost = 2}, keys, params).ok());
    EXPECT_EQ(Command({"EXISTS", key})->integer, 0);
  }
}

TEST_F(RedisTest, NoKeySurvivesItsFreshAt) {
  std::vector<std::string> names;
  for (const LimitConfig& config :
       {Limit(Algorithm::kTokenBucket, "10/100ms"), Limit(Algorithm::kGcra, "10/100ms"),
        Limit(Algorithm::kLeakyBucket, "10/100ms"), ShapeLimit("10/100ms", Duration::Zero(), 3),
        Limit(Algorithm::kFixedWindow, "10/100ms"), Limit(Algorithm::kSlidingLog, "10/100ms"),
        Limit(Algorithm::kSlidingWindow, "10/100ms")}) {
    names.push_back(KeyFor(config));
    const std::vector<std::string> params[] = {LimitParams(config)};
    const std::string_view keys[] = {names.back()};
    ASSERT_TRUE(Run({.op = ScriptOp::kDecide, .cost = 3}, keys, params).ok());
    EXPECT_EQ(Command({"EXISTS", names.back()})->integer, 1);
    EXPECT_LE(Command({"PTTL", names.back()})->integer, 200);  // at most two windows
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  for (const std::string& key : names) EXPECT_EQ(Command({"EXISTS", key})->integer, 0) << key;
}

TEST_F(RedisTest, SlidingLogHoldsOneEntryPerInstantAndAtMostTheLimit) {
  const LimitConfig config = Limit(Algorithm::kSlidingLog, "50/min");
  const std::vector<std::string> params[] = {LimitParams(config)};
  const std::string_view keys[] = {"{l}:k"};
  Time t = conformance::kTraceOrigin;
  for (int i = 0; i < 500; ++i) {
    const int64_t cost = i % 3;
    ASSERT_TRUE(Run({.op = ScriptOp::kDecide, .now = t, .cost = cost}, keys, params).ok());
    if (i % 4 != 0) t += Duration::Millis(700);          // every fourth request shares an instant
    ASSERT_LE(Command({"LLEN", "{l}:k"})->integer, 51);  // header + at most 50 entries
  }
}

// The size of one key per algorithm, as Redis counts it (MEMORY USAGE: the
// key, the value and their overhead), in a typical state, with the bound
// the docs quote.
TEST_F(RedisTest, BytesPerKey) {
  struct Case {
    LimitConfig config;
    int64_t cost;
    int requests;
    long long most_bytes;
  };
  const Case cases[] = {
      {Limit(Algorithm::kTokenBucket, "100/s", 20), 1, 1, 90},
      {Limit(Algorithm::kGcra, "100/s", 20), 1, 1, 90},
      {Limit(Algorithm::kGcra, "3/250ms"), 1, 1, 90},  // a sub-tick remainder: "us rem"
      {Limit(Algorithm::kLeakyBucket, "100/s", 20), 1, 1, 90},
      {ShapeLimit("100/s", Duration::Zero(), 20), 1, 1, 90},
      {Limit(Algorithm::kFixedWindow, "100/min"), 1, 1, 90},
      {Limit(Algorithm::kSlidingWindow, "100/min"), 1, 1, 90},
      {Limit(Algorithm::kSlidingLog, "100/min"), 1, 1, 200},
      {Limit(Algorithm::kSlidingLog, "100/min"), 1, 100, 1500},
  };
  for (const Case& c : cases) {
    const std::string key = "{m}:" + std::to_string(&c - cases);
    const std::vector<std::string> params[] = {LimitParams(c.config)};
    const std::string_view keys[] = {key};
    Time t = conformance::kTraceOrigin + Duration::Micros(1);
    for (int i = 0; i < c.requests; ++i, t += Duration::Millis(100)) {
      ASSERT_TRUE(Run({.op = ScriptOp::kDecide, .now = t, .cost = c.cost}, keys, params).ok());
    }
    const long long bytes = Command({"MEMORY", "USAGE", key, "SAMPLES", "0"})->integer;
    std::cout << KeyFor(c.config) << " " << FormatRate(RateOf(c.config)) << " after " << c.requests
              << " request(s): " << bytes << " bytes\n";
    EXPECT_GT(bytes, 0) << key;
    EXPECT_LE(bytes, c.most_bytes) << key;
  }
}

}  // namespace
}  // namespace sluice::redis
