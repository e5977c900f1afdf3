// The function's C++ side (calls, replies, bounds) and what it leaves in
// Redis: expiry, deletion of fresh keys, size per key, a flushed library,
// several parts in one call.
#include "store/redis/script.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <span>
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

// The arguments of a RESP command (an array of bulk strings).
std::vector<std::string> Args(std::string_view command) {
  std::vector<std::string> out;
  auto number = [&](char mark) {
    EXPECT_EQ(command.front(), mark);
    const size_t end = command.find("\r\n");
    const int64_t n = std::stoll(std::string(command.substr(1, end - 1)));
    command.remove_prefix(end + 2);
    return static_cast<size_t>(n);
  };
  const size_t count = number('*');
  for (size_t i = 0; i < count; ++i) {
    const size_t size = number('$');
    out.emplace_back(command.substr(0, size));
    command.remove_prefix(size + 2);
  }
  EXPECT_TRUE(command.empty());
  return out;
}

// ---- calls ----

TEST(CallTest, LaysOutEveryKeyThenEachPartsArgumentsAndLimits) {
  const std::string_view keys1[] = {"{u}:a", "{u}:b"};
  const std::string_view limits1[] = {"tb 1 10000 20 200000 200001", "fw 40 60000000"};
  const CallPart one = EncodePart(
      {.op = ScriptOp::kDecide, .now = Time::FromUnixMicros(1704067200000001), .cost = 3}, keys1,
      limits1);
  EXPECT_EQ(one.key_count, 2u);
  EXPECT_EQ(one.arg_count, 7u);
  EXPECT_EQ(one.decisions, 2u);
  const std::string_view keys2[] = {"{v}:a"};
  const std::string_view limits2[] = {"gc 3 250000 3 750000 250001"};
  // "" asks the function to read Redis' TIME; costs above 2^52 decide like 2^52.
  const CallPart two =
      EncodePart({.op = ScriptOp::kRefund, .cost = INT64_MAX, .taken_at = Time::FromUnixMicros(-5)},
                 keys2, limits2);
  EXPECT_EQ(two.decisions, 0u);
  const CallPart* parts[] = {&one, &two};
  EXPECT_THAT(
      Args(JoinParts(parts)),
      ElementsAre("FCALL", std::string(FunctionName()), "3", "{u}:a", "{u}:b", "{v}:a", "D",
                  "1704067200000001", "3", "", "2", "tb 1 10000 20 200000 200001", "fw 40 60000000",
                  "R", "", "4503599627370496", "-5", "1", "gc 3 250000 3 750000 250001"));
  EXPECT_THAT(Args(JoinParts({&two, 1}))[3], "{v}:a");
  // One limit at Redis' time: the short form.
  const CallPart three = EncodePart({.op = ScriptOp::kCheck, .cost = 2}, keys2, limits2);
  EXPECT_EQ(three.arg_count, 3u);
  EXPECT_EQ(three.decisions, 1u);
  EXPECT_THAT(Args(JoinParts({&three, 1})),
              ElementsAre("FCALL", std::string(FunctionName()), "1", "{v}:a", "c", "2",
                          "gc 3 250000 3 750000 250001"));
}

TEST(CallTest, ShortPartsAlikeGoAsOneRun) {
  const std::string_view a[] = {"{u}:a"};
  const std::string_view b[] = {"{u}:b"};
  const std::string_view fw[] = {"fw 40 60000000"};
  const std::string_view gc[] = {"gc 3 250000 3 750000 250001"};
  const CallPart p1 = EncodePart({.op = ScriptOp::kDecide, .cost = 1}, a, fw);
  const CallPart p2 = EncodePart({.op = ScriptOp::kDecide, .cost = 1}, b, fw);
  const CallPart p3 = EncodePart({.op = ScriptOp::kDecide, .cost = 1}, a, fw);
  const CallPart other_cost = EncodePart({.op = ScriptOp::kDecide, .cost = 2}, b, fw);
  const CallPart check = EncodePart({.op = ScriptOp::kCheck, .cost = 2}, a, fw);
  const CallPart other_limit = EncodePart({.op = ScriptOp::kDecide, .cost = 1}, b, gc);
  EXPECT_TRUE(p1.short_form);
  const CallPart* parts[] = {&p1, &p2, &p3, &other_cost, &check, &other_limit, &p1};
  EXPECT_THAT(Args(JoinParts(parts)),
              ElementsAre("FCALL", std::string(FunctionName()), "7", "{u}:a", "{u}:b", "{u}:a",
                          "{u}:b", "{u}:a", "{u}:b", "{u}:a",       //
                          "*", "3", "d", "1", "fw 40 60000000",     // a run of 3
                          "d", "2", "fw 40 60000000",               // another cost
                          "c", "2", "fw 40 60000000",               // another op
                          "d", "1", "gc 3 250000 3 750000 250001",  // another limit
                          "d", "1", "fw 40 60000000"));             // not next to p3
  // A long-form part is never in a run.
  const std::string_view two_keys[] = {"{u}:a", "{u}:b"};
  const std::string_view two_limits[] = {"fw 40 60000000", "fw 40 60000000"};
  const CallPart long_form = EncodePart({.op = ScriptOp::kDecide}, two_keys, two_limits);
  EXPECT_FALSE(long_form.short_form);
  const CallPart* longs[] = {&long_form, &long_form};
  EXPECT_EQ(Args(JoinParts(longs)).size(), 3u + 4u + 2u * 7u);
}

TEST(LimitParamsTest, OneStringPerLimit) {
  // 3/250ms is 3 ticks per microsecond, 250000 ticks per token.
  EXPECT_EQ(LimitParams(Limit(Algorithm::kGcra, "3/250ms")), "gc 3 250000 3 750000 250001");
  EXPECT_EQ(LimitParams(ShapeLimit("2/s", Duration::Zero(), 3)), "ls 1 500000 4 1500000");
  EXPECT_EQ(LimitParams(Limit(Algorithm::kFixedWindow, "40/min")), "fw 40 60000000");
  EXPECT_EQ(LimitParams(Limit(Algorithm::kSlidingLog, "5/h")), "sl 5 3600000000");
  EXPECT_EQ(LimitParams(Limit(Algorithm::kSlidingWindow, "1/day")), "sw 1 86400000000");
  // A window in the integer form says so; the others have no such form.
  EXPECT_EQ(LimitParams(Limit(Algorithm::kFixedWindow, "40/min"), true), "fw 40 60000000 i");
  EXPECT_EQ(LimitParams(Limit(Algorithm::kSlidingWindow, "1/day"), true), "sw 1 86400000000 i");
  EXPECT_EQ(LimitParams(Limit(Algorithm::kSlidingLog, "5/h"), true), "sl 5 3600000000");
  EXPECT_EQ(LimitParams(Limit(Algorithm::kGcra, "3/250ms"), true), "gc 3 250000 3 750000 250001");
}

// A short part's answer leaves out the limit: the caller takes it from the
// parameters, the limit every decision of the algorithm's answers.
TEST(ParamsLimitTest, IsTheLimitTheAlgorithmAnswers) {
  const LimitConfig configs[] = {
      Limit(Algorithm::kTokenBucket, "3/250ms", 7), Limit(Algorithm::kGcra, "3/250ms"),
      Limit(Algorithm::kLeakyBucket, "2/s", 5),     ShapeLimit("2/s", Duration::Zero(), 3),
      Limit(Algorithm::kFixedWindow, "40/min"),     Limit(Algorithm::kSlidingLog, "5/h"),
      Limit(Algorithm::kSlidingWindow, "1/day"),
  };
  for (const LimitConfig& config : configs) {
    const int64_t limit = std::visit(
        [](const auto& c) {
          StateOf_t<std::decay_t<decltype(c)>> state{};
          return CheckInPlace(c, state, Time::FromUnixMicros(1704067200000000), 1).limit;
        },
        config);
    for (const bool integer : {false, true}) {
      const std::string params = LimitParams(config, integer);
      SCOPED_TRACE(params);
      EXPECT_GT(limit, 0);
      EXPECT_EQ(ParamsLimit(params), limit);
    }
  }
  EXPECT_EQ(ParamsLimit("gc 3 250000"), 0);
  EXPECT_EQ(ParamsLimit("fw x 1"), 0);
  EXPECT_EQ(ParamsLimit(""), 0);
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

redisReply String(std::string_view text) {
  redisReply r{};
  r.type = REDIS_REPLY_STRING;
  r.str = const_cast<char*>(text.data());
  r.len = text.size();
  return r;
}

// An array reply of `items`, through `pointers` (which it fills).
redisReply ArrayOf(std::vector<redisReply>& items, std::vector<redisReply*>& pointers) {
  pointers.clear();
  for (redisReply& r : items) pointers.push_back(&r);
  redisReply array{};
  array.type = REDIS_REPLY_ARRAY;
  array.elements = pointers.size();
  array.element = pointers.data();
  return array;
}

// The answer to `parts` read from an array reply of `items`.
absl::StatusOr<std::vector<absl::StatusOr<ScriptResult>>> ParseItems(
    std::vector<redisReply> items, std::span<const CallPart> parts) {
  std::vector<redisReply*> pointers;
  return ParseCallReply(ArrayOf(items, pointers), parts);
}

CallPart PartOf(ScriptOp op, size_t limits) {
  const std::string_view keys[] = {"{p}:a", "{p}:b", "{p}:c"};
  const std::string_view params[] = {"fw 5 1", "fw 5 1", "fw 5 1"};
  return EncodePart({.op = op}, std::span(keys, limits), std::span(params, limits));
}

TEST(ParseCallReplyTest, DecodesEachPartEachLimitAndTheInfiniteRetry) {
  // A part of two limits, a refund, a failed part, a short part of one
  // limit (code, remaining, reset; code -2 - retry: a denial; the limit its
  // parameters'), then the call's time, which the short part takes.
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
                                   Integer(0),
                                   Integer(1704067200000000),
                                   String("WRONGTYPE Operation against a key"),
                                   Integer(-32),
                                   Integer(0),
                                   Integer(30),
                                   Integer(1704067200000123)};
  std::vector<redisReply*> pointers;
  redisReply array = ArrayOf(items, pointers);
  const CallPart parts[] = {PartOf(ScriptOp::kDecide, 2), PartOf(ScriptOp::kRefund, 1),
                            PartOf(ScriptOp::kDecide, 3), PartOf(ScriptOp::kCheck, 1)};
  auto results = ParseCallReply(array, parts);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 4u);
  const absl::StatusOr<ScriptResult>& first = (*results)[0];
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->now, Time::FromUnixMicros(1704067200000000));
  ASSERT_EQ(first->decisions.size(), 2u);
  EXPECT_TRUE(first->decisions[0].allowed);
  EXPECT_EQ(first->decisions[0].remaining, 19);
  EXPECT_EQ(first->decisions[0].reset_after, Duration::Micros(10000));
  EXPECT_FALSE(first->decisions[1].allowed);
  EXPECT_TRUE(first->decisions[1].can_never_pass());
  ASSERT_TRUE((*results)[1].ok());
  EXPECT_TRUE((*results)[1]->decisions.empty());
  EXPECT_EQ((*results)[2].status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT((*results)[2].status().message(), HasSubstr("WRONGTYPE"));
  const absl::StatusOr<ScriptResult>& short_part = (*results)[3];
  ASSERT_TRUE(short_part.ok()) << short_part.status();
  EXPECT_EQ(short_part->now, Time::FromUnixMicros(1704067200000123));
  ASSERT_EQ(short_part->decisions.size(), 1u);
  EXPECT_FALSE(short_part->decisions[0].allowed);
  EXPECT_EQ(short_part->decisions[0].limit, 5);
  EXPECT_EQ(short_part->decisions[0].reset_after, Duration::Micros(30));
  EXPECT_EQ(short_part->decisions[0].retry_after, Duration::Micros(30));
  EXPECT_EQ(short_part->decisions[0].delay, Duration::Zero());
  // The short code's other cases: never, and allowed with a delay (twice
  // the delay: an even code).
  items[items.size() - 4].integer = -1;
  EXPECT_TRUE((*ParseCallReply(array, parts))[3]->decisions[0].can_never_pass());
  items[items.size() - 4].integer = 14;
  {
    const Decision d = (*ParseCallReply(array, parts))[3]->decisions[0];
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.delay, Duration::Micros(7));
    EXPECT_EQ(d.retry_after, Duration::Zero());
  }
  // Without the call's time at the end: Internal.
  items.back().type = REDIS_REPLY_NIL;
  EXPECT_EQ(ParseCallReply(array, parts).status().code(), absl::StatusCode::kInternal);
  items.back().type = REDIS_REPLY_INTEGER;
  // One element short or too many, or a malformed field: Internal.
  array.elements -= 1;
  EXPECT_EQ(ParseCallReply(array, parts).status().code(), absl::StatusCode::kInternal);
  array.elements += 1;
  EXPECT_EQ(ParseCallReply(array, std::span(parts, 3)).status().code(),
            absl::StatusCode::kInternal);
  items[1].integer = 2;
  EXPECT_EQ(ParseCallReply(array, parts).status().code(), absl::StatusCode::kInternal);
  items[1].type = REDIS_REPLY_NIL;
  EXPECT_EQ(ParseCallReply(array, parts).status().code(), absl::StatusCode::kInternal);
}

// A short part answered as the short part before it (keys of one run found
// empty) is one nil element; anywhere else a nil is a malformed reply.
TEST(ParseCallReplyTest, ANilRepeatsTheShortAnswerBeforeIt) {
  redisReply nil{};
  nil.type = REDIS_REPLY_NIL;
  const CallPart short_part = PartOf(ScriptOp::kDecide, 1);
  const CallPart three_short[] = {short_part, short_part, short_part};
  auto results = ParseItems(
      {Integer(0), Integer(4), Integer(1000), nil, nil, Integer(1704067200000123)}, three_short);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 3u);
  for (const auto& r : *results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->now, Time::FromUnixMicros(1704067200000123));
    ASSERT_EQ(r->decisions.size(), 1u);
    EXPECT_TRUE(r->decisions[0].allowed);
    EXPECT_EQ(r->decisions[0].limit, 5);
    EXPECT_EQ(r->decisions[0].remaining, 4);
    EXPECT_EQ(r->decisions[0].reset_after, Duration::Micros(1000));
  }
  // First, after a failed part, or for a part of the long form: Internal.
  const CallPart two_short[] = {short_part, short_part};
  EXPECT_EQ(ParseItems({nil, Integer(0), Integer(4), Integer(1000), Integer(1)}, two_short)
                .status()
                .code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(ParseItems({String("WRONGTYPE Operation against a key"), nil, Integer(1)}, two_short)
                .status()
                .code(),
            absl::StatusCode::kInternal);
  const CallPart short_then_long[] = {short_part, PartOf(ScriptOp::kDecide, 2)};
  EXPECT_EQ(ParseItems({Integer(0), Integer(4), Integer(1000), nil, Integer(1)}, short_then_long)
                .status()
                .code(),
            absl::StatusCode::kInternal);
}

// A short part answered by one odd integer, 2 x remaining + 1, is allowed
// with no delay and the reset_after of the short answer before it (a
// window's run); first, after a failed part, or for a part of the long
// form, the reply is malformed.
TEST(ParseCallReplyTest, AnOddCodeIsAllowedWithTheResetBeforeIt) {
  redisReply nil{};
  nil.type = REDIS_REPLY_NIL;
  const CallPart short_part = PartOf(ScriptOp::kDecide, 1);
  const CallPart four_short[] = {short_part, short_part, short_part, short_part};
  // Denied (reset 900), then 2 x 3 + 1, 2 x 0 + 1, and a nil repeating the last.
  auto results = ParseItems({Integer(-2 - 400), Integer(0), Integer(900), Integer(7), Integer(1),
                             nil, Integer(1704067200000123)},
                            four_short);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_EQ(results->size(), 4u);
  const int64_t remaining[] = {0, 3, 0, 0};
  for (size_t n = 0; n < 4; ++n) {
    const absl::StatusOr<ScriptResult>& r = (*results)[n];
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->now, Time::FromUnixMicros(1704067200000123));
    ASSERT_EQ(r->decisions.size(), 1u);
    const Decision& d = r->decisions[0];
    EXPECT_EQ(d.allowed, n > 0) << n;
    EXPECT_EQ(d.limit, 5);
    EXPECT_EQ(d.remaining, remaining[n]) << n;
    EXPECT_EQ(d.reset_after, Duration::Micros(900)) << n;
    EXPECT_EQ(d.retry_after, n > 0 ? Duration::Zero() : Duration::Micros(400)) << n;
    EXPECT_EQ(d.delay, Duration::Zero());
  }
  const CallPart two_short[] = {short_part, short_part};
  EXPECT_EQ(ParseItems({Integer(7), Integer(0), Integer(4), Integer(1000), Integer(1)}, two_short)
                .status()
                .code(),
            absl::StatusCode::kInternal);
  EXPECT_EQ(
      ParseItems({String("WRONGTYPE Operation against a key"), Integer(7), Integer(1)}, two_short)
          .status()
          .code(),
      absl::StatusCode::kInternal);
  const CallPart short_then_long[] = {short_part, PartOf(ScriptOp::kDecide, 2)};
  EXPECT_EQ(
      ParseItems({Integer(0), Integer(4), Integer(1000), Integer(7), Integer(1)}, short_then_long)
          .status()
          .code(),
      absl::StatusCode::kInternal);
}

TEST(ParseCallReplyTest, ErrorRepliesKeepRedisMessage) {
  const CallPart part = PartOf(ScriptOp::kDecide, 1);
  auto error = [&](std::string text) {
    redisReply r{};
    r.type = REDIS_REPLY_ERROR;
    static std::string keep;
    keep = std::move(text);
    r.str = keep.data();
    r.len = keep.size();
    return ParseCallReply(r, {&part, 1}).status();
  };
  EXPECT_EQ(error("BUSY Redis is busy running a script").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(error("LOADING Redis is loading").code(), absl::StatusCode::kUnavailable);
  const absl::Status script = error("ERR user_function:1: sluice: a call with no part");
  EXPECT_EQ(script.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(script.message(), HasSubstr("a call with no part"));
  redisReply status{};
  status.type = REDIS_REPLY_STATUS;
  EXPECT_EQ(ParseCallReply(status, {&part, 1}).status().code(), absl::StatusCode::kInternal);
}

// ---- against Redis ----

TEST_F(RedisTest, TheLibraryIsNamedAfterItsCode) {
  EXPECT_TRUE(FunctionLibrary().starts_with("#!lua name=sluice_"));
  EXPECT_EQ(FunctionName().size(), 7u + 16u);
  Reply list = Command({"FUNCTION", "LIST", "LIBRARYNAME", FunctionName()});
  ASSERT_EQ(list->type, REDIS_REPLY_ARRAY);
  EXPECT_EQ(list->elements, 1u);
}

TEST_F(RedisTest, AFlushedLibraryAnswersFunctionNotFound) {
  const std::string params[] = {LimitParams(Limit(Algorithm::kGcra, "10/s"))};
  const std::string_view keys[] = {"{n}:k"};
  ASSERT_TRUE(Run({.op = ScriptOp::kDecide}, keys, params).ok());
  Command({"FUNCTION", "FLUSH"});
  const absl::StatusOr<ScriptResult> r = Run({.op = ScriptOp::kDecide}, keys, params);
  ASSERT_FALSE(r.ok());
  // What the client recognizes: load, resend.
  EXPECT_THAT(r.status().message(), HasSubstr("ERR Function not found")) << r.status();
  EXPECT_EQ(Text(*Command({"FUNCTION", "LOAD", FunctionLibrary()})), FunctionName());
  EXPECT_TRUE(Run({.op = ScriptOp::kDecide}, keys, params).ok());
}

TEST_F(RedisTest, AFailingPartIsAnsweredAloneAndMalformedCallsAreRefused) {
  const std::string params = LimitParams(Limit(Algorithm::kGcra, "10/s"));
  const std::string_view limits[] = {params};
  Command({"RPUSH", "{e}:bad", "not a gcra state"});
  const std::string_view bad[] = {"{e}:bad"};
  const std::string_view good[] = {"{e}:good"};
  const CallPart parts[] = {EncodePart({.op = ScriptOp::kDecide}, good, limits),
                            EncodePart({.op = ScriptOp::kDecide}, bad, limits),
                            EncodePart({.op = ScriptOp::kDecide}, good, limits)};
  Reply reply = Raw(JoinParts(parts));
  auto results = ParseCallReply(*reply, parts);
  ASSERT_TRUE(results.ok()) << results.status();
  ASSERT_TRUE((*results)[0].ok()) << (*results)[0].status();
  EXPECT_EQ((*results)[1].status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT((*results)[1].status().message(), HasSubstr("WRONGTYPE"));
  ASSERT_TRUE((*results)[2].ok()) << (*results)[2].status();
  // The parts around the failed one decided in order, on one Redis time.
  EXPECT_EQ((*results)[0]->now, (*results)[2]->now);
  EXPECT_EQ((*results)[0]->decisions[0].remaining, 9);
  EXPECT_EQ((*results)[2]->decisions[0].remaining, 8);
  // An unknown algorithm code is the part's error too, named.
  const std::string_view unknown[] = {"zz 1 2"};
  const CallPart odd = EncodePart({.op = ScriptOp::kDecide}, good, unknown);
  auto refused = ParseCallReply(*Raw(JoinParts({&odd, 1})), {&odd, 1});
  ASSERT_TRUE(refused.ok());
  EXPECT_THAT(refused->front().status().message(), HasSubstr("sluice: unknown algorithm code"));
  // In a run, an unknown code is every part's error, each answered.
  const CallPart* odd_run[] = {&odd, &odd, &odd};
  auto refused_run = ParseCallReply(*Raw(JoinParts(odd_run)), odd_run);
  ASSERT_TRUE(refused_run.ok()) << refused_run.status();
  for (const auto& r : *refused_run) EXPECT_THAT(r.status().message(), HasSubstr("unknown"));
  // A run that fails at its first part and at its last still decides the
  // rest, in order.
  const CallPart g = EncodePart({.op = ScriptOp::kDecide}, good, limits);
  const CallPart b = EncodePart({.op = ScriptOp::kDecide}, bad, limits);
  const CallPart* edges[] = {&b, &g, &g, &b};
  auto around = ParseCallReply(*Raw(JoinParts(edges)), edges);
  ASSERT_TRUE(around.ok()) << around.status();
  EXPECT_FALSE((*around)[0].ok());
  ASSERT_TRUE((*around)[1].ok()) << (*around)[1].status();
  ASSERT_TRUE((*around)[2].ok()) << (*around)[2].status();
  EXPECT_FALSE((*around)[3].ok());
  EXPECT_EQ((*around)[1]->decisions[0].remaining, 7);
  EXPECT_EQ((*around)[2]->decisions[0].remaining, 6);
  // A part naming more keys than the call has: the whole call is refused.
  Reply whole =
      Command({"FCALL", FunctionName(), "1", "{e}:k", "D", "", "1", "", "2", "fw 1 1", "fw 1 1"});
  EXPECT_EQ(whole->type, REDIS_REPLY_ERROR);
  EXPECT_THAT(Text(*whole), HasSubstr("does not have them"));
  // So is a run longer than the keys, an empty run, or a run of long parts.
  for (const std::vector<std::string>& run :
       {std::vector<std::string>{"*", "2", "d", "1", "fw 1 1"},
        std::vector<std::string>{"*", "0", "d", "1", "fw 1 1"},
        std::vector<std::string>{"*", "1", "D", "", "1", "", "1", "fw 1 1"},
        std::vector<std::string>{"*", "1", "d", "1"}}) {
    std::vector<std::string> command = {"FCALL", std::string(FunctionName()), "1", "{e}:k"};
    command.insert(command.end(), run.begin(), run.end());
    std::vector<std::string_view> views(command.begin(), command.end());
    Reply refused_whole = Command(views);
    EXPECT_EQ(refused_whole->type, REDIS_REPLY_ERROR) << run[1];
    EXPECT_THAT(Text(*refused_whole), HasSubstr("does not have them")) << run[1];
  }
}

// In a run of decisions, a key that comes back is decided on what the run
// wrote to it before, a key held before the call on what it held, a new key
// as new; and a key of another type fails its part alone, not written over.
TEST_F(RedisTest, ARunDecidesEachKeyOnWhatTheRunWroteBefore) {
  for (Algorithm algorithm : {Algorithm::kFixedWindow, Algorithm::kGcra, Algorithm::kTokenBucket,
                              Algorithm::kSlidingWindow}) {
    const std::string name(AlgorithmName(algorithm));
    SCOPED_TRACE(name);
    const bool bucket = algorithm == Algorithm::kGcra || algorithm == Algorithm::kTokenBucket;
    const std::string params = LimitParams(Limit(algorithm, "3/h", bucket ? 3 : 0));
    const std::string_view limits[] = {params};
    const std::string held = "{r}:held:" + name, fresh = "{r}:new:" + name,
                      other = "{r}:list:" + name;
    Command({"DEL", held, fresh, other});
    Command({"RPUSH", other, "x"});
    const std::string_view held_key[] = {held};
    const CallPart first = EncodePart({.op = ScriptOp::kDecide}, held_key, limits);
    auto before = ParseCallReply(*Raw(JoinParts({&first, 1})), {&first, 1});
    ASSERT_TRUE(before.ok() && before->front().ok());
    EXPECT_EQ(before->front()->decisions[0].remaining, 2);

    const std::string_view fresh_key[] = {fresh}, other_key[] = {other};
    const CallPart h = EncodePart({.op = ScriptOp::kDecide}, held_key, limits);
    const CallPart f = EncodePart({.op = ScriptOp::kDecide}, fresh_key, limits);
    const CallPart o = EncodePart({.op = ScriptOp::kDecide}, other_key, limits);
    const CallPart* run[] = {&h, &f, &o, &h, &f, &h, &h, &f};
    auto results = ParseCallReply(*Raw(JoinParts(run)), run);
    ASSERT_TRUE(results.ok()) << results.status();
    std::vector<std::string> got;
    for (const auto& r : *results) {
      if (!r.ok()) {
        got.push_back(r.status().message().find("WRONGTYPE") != std::string_view::npos
                          ? "wrongtype"
                          : std::string(r.status().message()));
      } else {
        const Decision& d = r->decisions[0];
        got.push_back(d.allowed ? "r=" + std::to_string(d.remaining) : "denied");
      }
    }
    EXPECT_THAT(got,
                ElementsAre("r=1", "r=2", "wrongtype", "r=0", "r=1", "denied", "denied", "r=0"));
    // The key of another type is as it was.
    EXPECT_EQ(Command({"TYPE", other})->str, std::string("list"));
    EXPECT_EQ(Command({"LLEN", other})->integer, 1);
  }
}

// At Redis' clock a fast path reads a key it may write either with GET or,
// where its limit's keys have lately been found empty, with the write of
// the fresh state (SET ... NX GET; common.lua). Either read decides as the
// algorithm: new keys (read with the write), one key again and again (read
// with the write, then, once keys are seen to hold states, with GET, past
// its limit too), then new keys again (read with GET until they are seen
// to be empty, then with the write), every field of every decision against
// the C++ algorithm at the time Redis decided at.
class RedisReadTest : public RedisTest {
 protected:
  // `integer_windows`: a fixed window's states in the integer form.
  template <typename Config>
  static void ExpectEitherReadDecidesAsTheAlgorithm(const LimitConfig& limit,
                                                    bool integer_windows = false);
};

template <typename Config>
void RedisReadTest::ExpectEitherReadDecidesAsTheAlgorithm(const LimitConfig& limit,
                                                          bool integer_windows) {
  const Config& config = std::get<Config>(limit);
  const std::string params[] = {LimitParams(limit, integer_windows)};
  const std::string prefix = "{e}:" + std::string(AlgorithmName(AlgorithmOf(limit))) + ":";
  std::map<std::string, StateOf_t<Config>> states;
  // Redis' decision of `key` against the algorithm's at the time Redis decided at.
  auto expect_as_algorithm = [&](const std::string& key, int64_t cost, const ScriptResult& r) {
    const Decision want = DecideInPlace(config, states[key], r.now, cost);
    const Decision& got = r.decisions[0];
    EXPECT_EQ(got.allowed, want.allowed);
    EXPECT_EQ(got.limit, want.limit);
    EXPECT_EQ(got.remaining, want.remaining);
    EXPECT_EQ(got.reset_after, want.reset_after);
    EXPECT_EQ(got.retry_after, want.retry_after);
    EXPECT_EQ(got.delay, want.delay);
  };
  auto decide = [&](const std::string& key, int64_t cost) {
    const std::string_view keys[] = {key};
    absl::StatusOr<ScriptResult> r = Run({.op = ScriptOp::kDecide, .cost = cost}, keys, params);
    ASSERT_TRUE(r.ok()) << r.status();
    SCOPED_TRACE(key);
    expect_as_algorithm(key, cost, *r);
  };
  // Calls of many parts, decided at one time: runs of short parts alike,
  // for which the state an empty key takes is made once a run. New keys,
  // one of them again within the call (it holds a state by then), a run of
  // another cost, and the hot key, past its limit.
  const std::string_view limits[] = {params[0]};
  auto decide_call = [&](const std::vector<std::pair<std::string, int64_t>>& requests) {
    std::vector<CallPart> parts;
    for (const auto& [key, cost] : requests) {
      const std::string_view keys[] = {key};
      parts.push_back(EncodePart({.op = ScriptOp::kDecide, .cost = cost}, keys, limits));
    }
    auto results = ParseCallReply(*Raw(JoinParts(parts)), parts);
    ASSERT_TRUE(results.ok()) << results.status();
    for (size_t i = 0; i < requests.size(); ++i) {
      const auto& [key, cost] = requests[i];
      ASSERT_TRUE((*results)[i].ok()) << (*results)[i].status();
      SCOPED_TRACE(key + " in a call, part " + std::to_string(i));
      expect_as_algorithm(key, cost, *(*results)[i]);
    }
  };
  for (int i = 0; i < 60; ++i) Command({"DEL", prefix + std::to_string(i)});
  for (int i = 0; i < 30; ++i) Command({"DEL", prefix + "call:" + std::to_string(i)});
  Command({"DEL", prefix + "hot"});
  for (int i = 0; i < 20; ++i) decide(prefix + std::to_string(i), 1 + i % 3);
  for (int i = 0; i < 80; ++i) decide(prefix + "hot", 1);
  for (int i = 20; i < 60; ++i) decide(prefix + std::to_string(i), 2);
  for (int c = 0; c < 3; ++c) {
    auto call_key = [&](int i) { return prefix + "call:" + std::to_string(c * 10 + i); };
    // A run of cost 1: keys 0-5 new, 0 again, 6 new; a run of cost 3: keys
    // 7-9 new; a run of cost 1: the hot key, key 1 again.
    std::vector<std::pair<std::string, int64_t>> requests;
    for (int i = 0; i < 6; ++i) requests.emplace_back(call_key(i), 1);
    requests.emplace_back(call_key(0), 1);
    requests.emplace_back(call_key(6), 1);
    for (int i = 7; i < 10; ++i) requests.emplace_back(call_key(i), 3);
    requests.emplace_back(prefix + "hot", 1);
    requests.emplace_back(call_key(1), 1);
    decide_call(requests);
  }
}

TEST_F(RedisReadTest, EitherReadOfAKeyDecidesAsTheAlgorithm) {
  ExpectEitherReadDecidesAsTheAlgorithm<FixedWindowConfig>(Limit(Algorithm::kFixedWindow, "50/s"));
  // The integer form: held keys are read and raised by INCRBY.
  ExpectEitherReadDecidesAsTheAlgorithm<FixedWindowConfig>(Limit(Algorithm::kFixedWindow, "50/s"),
                                                           true);
  ExpectEitherReadDecidesAsTheAlgorithm<SlidingWindowConfig>(
      Limit(Algorithm::kSlidingWindow, "50/s"), true);
  ExpectEitherReadDecidesAsTheAlgorithm<GcraConfig>(Limit(Algorithm::kGcra, "50/s", 20));
  ExpectEitherReadDecidesAsTheAlgorithm<TokenBucketConfig>(
      Limit(Algorithm::kTokenBucket, "50/s", 20));
  ExpectEitherReadDecidesAsTheAlgorithm<SlidingWindowConfig>(
      Limit(Algorithm::kSlidingWindow, "50/s"));
}

// The window fast paths take a state's numbers from the texts the library
// formatted (the kept window text, COUNT_OF) and anything else by tonumber:
// a state however written decides alike. At a given time, 10,000/s: states
// of this window with counts the library writes, with texts it never writes
// (leading zeros, a count above the 4,096 it keeps), and of the window before.
TEST_F(RedisTest, AWindowsFastPathReadsAStateHoweverItsNumbersAreWritten) {
  const int64_t period_us = 1'000'000;
  const int64_t window = 1'704'067'200;  // 2024-01-01, in windows of a second
  // Half-way through the window: sliding_window weighs `prev` by one half.
  const Time now = Time::FromUnixMicros(window * period_us + period_us / 2);
  const std::string w = std::to_string(window), before = std::to_string(window - 1);
  struct Case {
    std::string fixed, sliding;  // the states written; "" for none
    int64_t fixed_remaining, sliding_remaining;
    std::string fixed_after, sliding_after;  // the states after one request
  };
  const Case cases[] = {
      {"", "", 9'999, 9'999, w + " 1", w + " 0 1"},
      {w + " 7", w + " 8 7", 9'992, 9'988, w + " 8", w + " 8 8"},
      {w + " 0042", w + " 0010 0042", 9'957, 9'952, w + " 43", w + " 0010 43"},
      {"0" + w + " 5000", "0" + w + " 6000 5000", 4'999, 1'999, w + " 5001", w + " 6000 5001"},
      {before + " 9000", before + " 1 9000", 9'999, 5'499, w + " 1", w + " 9000 1"},
  };
  for (const Algorithm algorithm : {Algorithm::kFixedWindow, Algorithm::kSlidingWindow}) {
    const bool fixed = algorithm == Algorithm::kFixedWindow;
    const std::string params[] = {LimitParams(Limit(algorithm, "10000/s"))};
    const std::string key = "{n}:" + std::string(AlgorithmName(algorithm));
    const std::string_view keys[] = {key};
    for (const Case& c : cases) {
      const std::string& state = fixed ? c.fixed : c.sliding;
      SCOPED_TRACE(state.empty() ? "no state" : state);
      Command({"DEL", key});
      if (!state.empty()) Command({"SET", key, state});
      absl::StatusOr<ScriptResult> r = Run({.op = ScriptOp::kDecide, .now = now}, keys, params);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_TRUE(r->decisions[0].allowed);
      EXPECT_EQ(r->decisions[0].remaining, fixed ? c.fixed_remaining : c.sliding_remaining);
      EXPECT_EQ(Text(*Command({"GET", key})), fixed ? c.fixed_after : c.sliding_after);
    }
  }
}

// ---- a fixed window's state in the integer form (store.redis.window_state) ----

// The text and the integer form of a window state (fixed_window.lua,
// sliding_window.lua).
std::string TextState(const FixedWindowState& s) {
  return std::to_string(s.window) + " " + std::to_string(s.count);
}
std::string TextState(const SlidingWindowState& s) {
  return std::to_string(s.window) + " " + std::to_string(s.prev) + " " + std::to_string(s.curr);
}
std::string IntegerState(const FixedWindowConfig&, const FixedWindowState& s) {
  return std::to_string(s.count * 256 + s.window % 255 + 1);
}
std::string IntegerState(const SlidingWindowConfig& c, const SlidingWindowState& s) {
  return std::to_string((s.curr * (c.limit() + 1) + s.prev) * 256 + s.window % 255 + 1);
}

// Over some ten windows of 40 ms at Redis' clock, keys of a window limit in
// the integer form decide as the algorithm, every field of every decision:
// new keys, keys raised within their window (one INCRBY), past the limit
// (denied, the count given back), keys of the window before, a key idle
// until it expired, two costs in one call, and a key found holding text
// in the middle of a run (the run's INCRBY loop stops there, and goes on
// after it). Every key the function wrote holds an integer.
class RedisIntegerFormTest : public RedisTest {
 protected:
  template <typename Config>
  static void ExpectDecidesAsTheAlgorithmAcrossWindows(const LimitConfig& limit);
};

template <typename Config>
void RedisIntegerFormTest::ExpectDecidesAsTheAlgorithmAcrossWindows(const LimitConfig& limit) {
  const Config& config = std::get<Config>(limit);
  const std::string params = LimitParams(limit, true);
  const std::string_view limits[] = {params};
  std::vector<std::string> keys;
  for (int i = 0; i < 5; ++i) {
    keys.push_back("{i}:" + std::string(AlgorithmName(AlgorithmOf(limit))) + ":" +
                   std::to_string(i));
    Command({"DEL", keys.back()});
  }
  const std::string& text_key = keys[4];
  std::map<std::string, StateOf_t<Config>> states;
  int64_t allowed = 0, denied = 0;
  for (int round = 0; round < 240; ++round) {
    // Keys 0-2 every round (key 0 twice), key 3 every 80th (idle long
    // enough to expire: three windows at most), key 4 every round, written
    // as text before each call (as an instance in text leaves it).
    Command({"SET", text_key, TextState(states[text_key])});
    std::vector<std::string_view> order = {keys[0], keys[1], text_key, keys[0], keys[2]};
    if (round % 80 == 0) order.push_back(keys[3]);
    // Key 1 costs 2 every other round: two costs of one limit in one call
    // (the limit keeps its INCRBY's step as text: it must follow the cost).
    std::vector<int64_t> costs(order.size(), 1);
    if (round % 2 == 1) costs[1] = 2;
    std::vector<CallPart> parts;
    for (size_t i = 0; i < order.size(); ++i) {
      parts.push_back(
          EncodePart({.op = ScriptOp::kDecide, .cost = costs[i]}, {&order[i], 1}, limits));
    }
    auto results = ParseCallReply(*Raw(JoinParts(parts)), parts);
    ASSERT_TRUE(results.ok()) << results.status();
    for (size_t i = 0; i < order.size(); ++i) {
      SCOPED_TRACE(std::string(order[i]) + ", round " + std::to_string(round));
      ASSERT_TRUE((*results)[i].ok()) << (*results)[i].status();
      const ScriptResult& r = *(*results)[i];
      const Decision want = DecideInPlace(config, states[std::string(order[i])], r.now, costs[i]);
      const Decision& got = r.decisions[0];
      EXPECT_EQ(got.allowed, want.allowed);
      EXPECT_EQ(got.remaining, want.remaining);
      EXPECT_EQ(got.reset_after, want.reset_after);
      EXPECT_EQ(got.retry_after, want.retry_after);
      (got.allowed ? allowed : denied) += 1;
    }
    for (const std::string& key : keys) {
      Reply state = Command({"GET", key});
      if (state->type == REDIS_REPLY_NIL || key == text_key) continue;
      EXPECT_EQ(Text(*state).find_first_not_of("0123456789"), std::string_view::npos)
          << key << ": " << Text(*state);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GT(allowed, 60);
  EXPECT_GT(denied, 60);
}

TEST_F(RedisIntegerFormTest, AWindowDecidesAsTheAlgorithmAcrossWindows) {
  ExpectDecidesAsTheAlgorithmAcrossWindows<FixedWindowConfig>(
      Limit(Algorithm::kFixedWindow, "6/40ms"));
  ExpectDecidesAsTheAlgorithmAcrossWindows<SlidingWindowConfig>(
      Limit(Algorithm::kSlidingWindow, "6/40ms"));
}

// A window limit reads both forms whichever it writes (fixed_window and
// sliding_window, in windows of an hour at Redis' clock, tried again should
// one turn): a text state raised by a limit in the integer form and an
// integer state by one in text, up to the limit and past it (a denial
// leaves the count as it was), a state of the window before, a check, a
// charge past the limit (a debt: kept as text) and a refund. Every decision
// against the C++ algorithm on the same states, and after each write the
// form the writer's setting calls for.
class RedisFormsTest : public RedisTest {
 protected:
  template <typename Config>
  static void ExpectBothFormsDecideAsTheAlgorithm(const LimitConfig& limit, StateOf_t<Config> seed,
                                                  StateOf_t<Config> seed_before);
};

template <typename Config>
void RedisFormsTest::ExpectBothFormsDecideAsTheAlgorithm(const LimitConfig& limit,
                                                         StateOf_t<Config> seed,
                                                         StateOf_t<Config> seed_before) {
  const Config& config = std::get<Config>(limit);
  const std::string text[] = {LimitParams(limit)};
  const std::string integer[] = {LimitParams(limit, true)};
  const int64_t period_us = config.period().micros();
  const std::string key = "{m}:" + std::string(AlgorithmName(AlgorithmOf(limit)));
  const std::string_view keys[] = {key};
  auto redis_micros = [] {
    Reply time = Command({"TIME"});
    return std::stoll(std::string(Text(*time->element[0]))) * 1'000'000 +
           std::stoll(std::string(Text(*time->element[1])));
  };
  auto stored = [&] { return std::string(Text(*Command({"GET", key}))); };
  auto bytes = [&] { return Command({"MEMORY", "USAGE", key, "SAMPLES", "0"})->integer; };
  for (int attempt = 0;; ++attempt) {
    ASSERT_LT(attempt, 3);
    const int64_t window = redis_micros() / period_us;
    std::vector<int64_t> windows;  // of every decision: all `window`, or again
    StateOf_t<Config> state{};
    auto seed_as = [&](StateOf_t<Config> s, bool as_integer) {
      s.window += window;
      state = s;
      Command({"SET", key, as_integer ? IntegerState(config, s) : TextState(s), "PX", "600000"});
    };
    // One request; its decision as the algorithm's on `state`, and the
    // key's form after it.
    auto request = [&](std::span<const std::string> params, ScriptOp op, int64_t cost) {
      absl::StatusOr<ScriptResult> r = Run({.op = op, .cost = cost}, keys, params);
      ASSERT_TRUE(r.ok()) << r.status();
      windows.push_back(r->now.unix_micros() / period_us);
      if (op == ScriptOp::kCharge) {
        ChargeInPlace(config, state, r->now, cost);
      } else {
        const Decision want = op == ScriptOp::kCheck ? CheckInPlace(config, state, r->now, cost)
                                                     : DecideInPlace(config, state, r->now, cost);
        const Decision& got = r->decisions[0];
        EXPECT_EQ(got.allowed, want.allowed);
        EXPECT_EQ(got.remaining, want.remaining);
        EXPECT_EQ(got.reset_after, want.reset_after);
        EXPECT_EQ(got.retry_after, want.retry_after);
      }
      // The key holds the algorithm's state, in one form or the other.
      const std::string now_stored = stored();
      EXPECT_TRUE(now_stored == IntegerState(config, state) || now_stored == TextState(state))
          << now_stored << " against " << TextState(state);
    };
    Command({"DEL", key});
    seed_as(seed, false);
    request(integer, ScriptOp::kDecide, 1);
    EXPECT_EQ(stored(), IntegerState(config, state));
    const long long integer_bytes = bytes();
    request(text, ScriptOp::kDecide, 1);
    EXPECT_EQ(stored(), TextState(state));
    const long long text_bytes = bytes();
    std::cout << key << ": " << integer_bytes << " bytes as an integer, " << text_bytes
              << " as text\n";
    EXPECT_LT(integer_bytes, text_bytes);
    for (int i = 0; i < 6; ++i) request(integer, ScriptOp::kDecide, 1);  // to the limit, past it
    request(integer, ScriptOp::kCheck, 1);
    request(text, ScriptOp::kDecide, 1);
    seed_as(seed_before, true);
    request(integer, ScriptOp::kDecide, 1);
    EXPECT_EQ(stored(), IntegerState(config, state));
    seed_as(seed_before, true);
    request(text, ScriptOp::kDecide, 2);
    EXPECT_EQ(stored(), TextState(state));
    seed_as(seed, true);
    request(integer, ScriptOp::kCharge, 15);  // a debt: text
    EXPECT_NE(stored().find(' '), std::string::npos);
    seed_as(seed, true);
    const Time taken_at = Time::FromUnixMicros(redis_micros());
    ASSERT_TRUE(
        Run({.op = ScriptOp::kRefund, .cost = 3, .taken_at = taken_at}, keys, integer).ok());
    RefundInPlace(config, state, taken_at, 3);
    EXPECT_EQ(stored(), IntegerState(config, state));
    if (std::all_of(windows.begin(), windows.end(), [&](int64_t w) { return w == window; }) &&
        taken_at.unix_micros() / period_us == window) {
      break;
    }
  }
}

// A part of two window limits in the integer form at Redis' clock (the
// general path: each decided, then written only if both allow): a fixed
// window of 5 and a sliding window of 8 an hour. Every decision against the
// algorithms, all-or-nothing (the sliding window takes nothing once the
// fixed one denies), and both keys left in the integer form.
TEST_F(RedisFormsTest, APartOfTwoWindowsInTheIntegerFormIsAllOrNothing) {
  const LimitConfig fixed_limit = Limit(Algorithm::kFixedWindow, "5/h");
  const LimitConfig sliding_limit = Limit(Algorithm::kSlidingWindow, "8/h");
  const auto& fixed = std::get<FixedWindowConfig>(fixed_limit);
  const auto& sliding = std::get<SlidingWindowConfig>(sliding_limit);
  const std::string params[] = {LimitParams(fixed_limit, true), LimitParams(sliding_limit, true)};
  const std::string keys_held[] = {"{p}:fw", "{p}:sw"};
  const std::string_view keys[] = {keys_held[0], keys_held[1]};
  for (int attempt = 0;; ++attempt) {
    ASSERT_LT(attempt, 3);
    for (const std::string& key : keys_held) Command({"DEL", key});
    FixedWindowState fixed_state{};
    SlidingWindowState sliding_state{};
    bool one_window = true;
    int64_t first_window = -1;
    for (int i = 0; i < 8; ++i) {
      absl::StatusOr<ScriptResult> r = Run({.op = ScriptOp::kDecide}, keys, params);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(r->decisions.size(), 2u);
      const int64_t window = r->now.unix_micros() / fixed.period().micros();
      if (first_window < 0) first_window = window;
      one_window = one_window && window == first_window;
      FixedWindowState f = fixed_state;
      SlidingWindowState w = sliding_state;
      const Decision want_fixed = DecideInPlace(fixed, f, r->now, 1);
      const Decision want_sliding = DecideInPlace(sliding, w, r->now, 1);
      if (want_fixed.allowed && want_sliding.allowed) fixed_state = f, sliding_state = w;
      EXPECT_EQ(r->decisions[0].allowed, want_fixed.allowed) << i;
      EXPECT_EQ(r->decisions[0].remaining, want_fixed.remaining) << i;
      EXPECT_EQ(r->decisions[1].allowed, want_sliding.allowed) << i;
      EXPECT_EQ(r->decisions[1].remaining, want_sliding.remaining) << i;
      EXPECT_EQ(Text(*Command({"GET", keys_held[0]})), IntegerState(fixed, fixed_state)) << i;
      EXPECT_EQ(Text(*Command({"GET", keys_held[1]})), IntegerState(sliding, sliding_state)) << i;
    }
    EXPECT_EQ(fixed_state.count, 5);
    EXPECT_EQ(sliding_state.curr, 5);  // nothing taken past the fixed window's limit
    if (one_window) break;
  }
}

TEST_F(RedisFormsTest, AWindowReadsBothFormsWhicheverItWrites) {
  ExpectBothFormsDecideAsTheAlgorithm<FixedWindowConfig>(Limit(Algorithm::kFixedWindow, "10/h"),
                                                         {.window = 0, .count = 5},
                                                         {.window = -1, .count = 9});
  ExpectBothFormsDecideAsTheAlgorithm<SlidingWindowConfig>(Limit(Algorithm::kSlidingWindow, "10/h"),
                                                           {.window = 0, .prev = 2, .curr = 3},
                                                           {.window = -1, .prev = 4, .curr = 6});
}

// Where a fixed window's keys (integer form) have lately held no state of
// their window, the function reads a key with a write that replaces what
// it holds (SET ... GET, fixed_window.replaced). Eight new keys before each
// request put its limit there. Whatever the write replaced, the request is
// decided as the algorithm decides it, and what counts is kept: this
// window's count (raised by an INCRBY, or put back where the request does
// not fit), a debt (put back, expiring no earlier than it is fresh), a
// malformed state and a key of another type (the part fails, the key as it
// was). The window before's count is spent: the fresh state stands.
TEST_F(RedisTest, AFixedWindowsReadThatReplacesAStateKeepsWhatCounts) {
  const LimitConfig limit = Limit(Algorithm::kFixedWindow, "4/300ms");
  const auto& config = std::get<FixedWindowConfig>(limit);
  const std::string params = LimitParams(limit, true);
  const std::string_view limits[] = {params};
  const int64_t period_us = config.period().micros();
  const std::string key = "{q}:fw";
  auto redis_micros = [] {
    Reply time = Command({"TIME"});
    return std::stoll(std::string(Text(*time->element[0]))) * 1'000'000 +
           std::stoll(std::string(Text(*time->element[1])));
  };
  auto calls_of = [](std::string_view command) -> int64_t {
    const std::string stats(Text(*Command({"INFO", "commandstats"})));
    const std::string mark = "cmdstat_" + std::string(command) + ":calls=";
    const size_t at = stats.find(mark);
    return at == std::string::npos ? 0 : std::stoll(stats.substr(at + mark.size()));
  };
  int new_keys = 0;
  for (int attempt = 0;; ++attempt) {
    ASSERT_LT(attempt, 3);
    // Begun just after a window's start: the calls below take a few tens of
    // milliseconds (under a sanitizer, on a busy machine), and each check
    // holds only while they stay in one window. (Begun anywhere, about one
    // run in ten crossed into the next window and failed.)
    const int64_t begun = redis_micros();
    std::this_thread::sleep_for(std::chrono::microseconds(period_us - begun % period_us + 2'000));
    const int64_t window = redis_micros() / period_us;
    bool one_window = true;
    FixedWindowState state{};
    // One call: eight new keys, then `key` at `cost`. Its result, and the
    // SETs and INCRBYs the call ran for `key`.
    struct Ran {
      absl::StatusOr<ScriptResult> result;
      int64_t sets, incrs;
    };
    auto request = [&](int64_t cost) {
      std::vector<std::string> fresh;
      for (int i = 0; i < 8; ++i) fresh.push_back("{q}:new:" + std::to_string(new_keys++));
      std::vector<CallPart> parts;
      for (const std::string& k : fresh) {
        const std::string_view keys[] = {k};
        parts.push_back(EncodePart({.op = ScriptOp::kDecide}, keys, limits));
      }
      const std::string_view keys[] = {key};
      parts.push_back(EncodePart({.op = ScriptOp::kDecide, .cost = cost}, keys, limits));
      const int64_t sets = calls_of("set"), incrs = calls_of("incrby");
      auto results = ParseCallReply(*Raw(JoinParts(parts)), parts);
      EXPECT_TRUE(results.ok()) << results.status();
      Ran ran{.result = results.ok() ? std::move(results->back()) : results.status(),
              .sets = calls_of("set") - sets - 8,
              .incrs = calls_of("incrby") - incrs};
      for (size_t i = 0; results.ok() && i + 1 < results->size(); ++i) {
        EXPECT_TRUE((*results)[i].ok() && (*results)[i]->decisions[0].allowed) << i;
      }
      return ran;
    };
    // `key`'s request against the algorithm on `state`.
    auto expect_as_algorithm = [&](const Ran& ran, int64_t cost) {
      ASSERT_TRUE(ran.result.ok()) << ran.result.status();
      const ScriptResult& r = *ran.result;
      one_window = one_window && r.now.unix_micros() / period_us == window;
      const Decision want = DecideInPlace(config, state, r.now, cost);
      const Decision& got = r.decisions[0];
      EXPECT_EQ(got.allowed, want.allowed);
      EXPECT_EQ(got.remaining, want.remaining);
      EXPECT_EQ(got.reset_after, want.reset_after);
      EXPECT_EQ(got.retry_after, want.retry_after);
    };
    auto stored = [&] { return std::string(Text(*Command({"GET", key}))); };
    auto expiry_ms = [&] { return Command({"PEXPIRETIME", key})->integer; };
    const int64_t end_ms = (window + 1) * period_us / 1000;  // of this window

    Command({"DEL", key});
    Ran ran = request(1);  // an empty key
    expect_as_algorithm(ran, 1);
    EXPECT_EQ(ran.sets, 1);
    {
      SCOPED_TRACE("this window's count, raised");
      ran = request(1);
      expect_as_algorithm(ran, 1);
      EXPECT_EQ(ran.sets, 1);
      EXPECT_EQ(ran.incrs, 1);
      EXPECT_EQ(stored(), IntegerState(config, state));
    }
    {
      SCOPED_TRACE("this window's count, put back: the request does not fit");
      const std::string before = stored();
      ran = request(3);
      expect_as_algorithm(ran, 3);
      EXPECT_FALSE(ran.result.ok() && ran.result->decisions[0].allowed);
      EXPECT_EQ(ran.sets, 2);
      EXPECT_EQ(ran.incrs, 0);
      EXPECT_EQ(stored(), before);
      EXPECT_GE(expiry_ms(), end_ms);
      EXPECT_LE(expiry_ms(), end_ms + period_us / 1000);
    }
    {
      SCOPED_TRACE("the window before's count: spent");
      state = {.window = window - 1, .count = 4};
      Command({"SET", key, IntegerState(config, state), "PX", "600000"});
      ran = request(1);
      expect_as_algorithm(ran, 1);
      EXPECT_EQ(ran.sets, 1);
      EXPECT_EQ(ran.incrs, 0);
      EXPECT_EQ(stored(), IntegerState(config, state));
      EXPECT_GE(expiry_ms(), end_ms);
      EXPECT_LE(expiry_ms(), end_ms + period_us / 1000);
    }
    {
      SCOPED_TRACE("a debt of the window before, put back");
      state = {.window = window - 1, .count = 12};  // weighs on the next two windows
      Command({"SET", key, TextState(state), "PX", "600000"});
      ran = request(1);
      expect_as_algorithm(ran, 1);
      EXPECT_FALSE(ran.result.ok() && ran.result->decisions[0].allowed);
      EXPECT_EQ(stored(), TextState(state));
      EXPECT_GE(expiry_ms(), (window + 2) * period_us / 1000);  // when it is fresh
    }
    {
      SCOPED_TRACE("a malformed state, put back");
      Command({"SET", key, "x7", "PX", "600000"});
      ran = request(1);
      EXPECT_THAT(ran.result.status().message(), HasSubstr("malformed state"));
      EXPECT_EQ(stored(), "x7");
    }
    {
      SCOPED_TRACE("a key of another type, not written over");
      Command({"DEL", key});
      Command({"RPUSH", key, "x"});
      ran = request(1);
      EXPECT_THAT(ran.result.status().message(), HasSubstr("WRONGTYPE"));
      EXPECT_EQ(Command({"LLEN", key})->integer, 1);
      Command({"DEL", key});
    }
    if (one_window) break;
  }
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

// fixed_window's or sliding_window's period; zero for the others.
Duration WindowPeriod(const LimitConfig& config) {
  return std::visit(
      [](const auto& c) {
        using C = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<C, FixedWindowConfig> ||
                      std::is_same_v<C, SlidingWindowConfig>) {
          return c.period();
        } else {
          return Duration::Zero();
        }
      },
      config);
}

// How long after its state is fresh a key written at `now` is kept: for
// the windows, the time into the window it is written at (common.lua, "How
// long a window's key is kept"); none for the others.
Duration KeptAfterFresh(const LimitConfig& config, Time now) {
  const Duration period = WindowPeriod(config);
  if (period == Duration::Zero()) return Duration::Zero();
  return Duration::Micros(now.unix_micros() % period.micros());
}

std::string KeyFor(const LimitConfig& config) {
  return "{x}:" + std::string(AlgorithmName(AlgorithmOf(config))) +
         (IsShape(config) ? "_shape" : "");
}

// Op L, a leased slice (docs/distributed.md, "Leased limits"): `cost`
// slots, the bucket's use first raised to the lead, granted when the first
// slot fits now; the others may lie past the capacity. 100/s with a burst
// of 10: T = 10 ms, a capacity of 100 ms.
TEST_F(RedisTest, OpLeaseTakesSlotsALeadAheadAndPastTheCapacity) {
  for (const Algorithm algorithm : {Algorithm::kGcra, Algorithm::kTokenBucket}) {
    SCOPED_TRACE(AlgorithmName(algorithm));
    const LimitConfig config = Limit(algorithm, "100/s", 10);
    const std::string key = KeyFor(config);
    const std::string params[] = {LimitParams(config)};
    const std::string_view keys[] = {key};
    const Time t0 = Time::FromUnixMicros(1'800'000'000'000'000);
    auto lease = [&](Time at, int64_t n, Duration lead) {
      absl::StatusOr<ScriptResult> r =
          Run({.op = ScriptOp::kLease, .now = at, .cost = n, .lead = lead}, keys, params);
      EXPECT_TRUE(r.ok()) << r.status();
      return r.ok() ? r->decisions.at(0) : Decision{};
    };
    // Idle: 20 ms of lead, then 3 slots: used 50 ms, 5 left.
    Decision d = lease(t0, 3, Duration::Millis(20));
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.remaining, 5);
    EXPECT_EQ(d.reset_after, Duration::Millis(50));
    // A lead below the use changes nothing: 5 more fill the capacity.
    d = lease(t0, 5, Duration::Millis(1));
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.remaining, 0);
    EXPECT_EQ(d.reset_after, Duration::Millis(100));
    // Full: denied until one slot fits, 10 ms.
    d = lease(t0, 4, Duration::Millis(1));
    EXPECT_FALSE(d.allowed);
    EXPECT_EQ(d.retry_after, Duration::Millis(10));
    // Then the first fits and the other three lie past the capacity.
    d = lease(t0 + Duration::Millis(10), 4, Duration::Millis(1));
    EXPECT_TRUE(d.allowed);
    EXPECT_EQ(d.remaining, 0);
    EXPECT_EQ(d.reset_after, Duration::Millis(130));
    // A plain request waits for all of them: 130 - 90 ms.
    absl::StatusOr<ScriptResult> plain =
        Run({.op = ScriptOp::kDecide, .now = t0 + Duration::Millis(10)}, keys, params);
    ASSERT_TRUE(plain.ok()) << plain.status();
    EXPECT_FALSE(plain->decisions[0].allowed);
    EXPECT_EQ(plain->decisions[0].retry_after, Duration::Millis(40));
    // More slots than the burst: never.
    d = lease(t0 + Duration::Seconds(10), 11, Duration::Millis(1));
    EXPECT_FALSE(d.allowed);
    EXPECT_TRUE(d.retry_after.IsInfinite());
  }
  const LimitConfig window = Limit(Algorithm::kFixedWindow, "40/min");
  const std::string key = KeyFor(window);
  const std::string params[] = {LimitParams(window)};
  const std::string_view keys[] = {key};
  absl::StatusOr<ScriptResult> r = Run({.op = ScriptOp::kLease, .cost = 2}, keys, params);
  EXPECT_THAT(r.status().message(), HasSubstr("op L takes one gcra or token_bucket limit"));
}

TEST_F(RedisTest, EveryWriteExpiresWhenTheStateIsFreshAgain) {
  for (const LimitConfig& config :
       {Limit(Algorithm::kTokenBucket, "1/h", 5), Limit(Algorithm::kGcra, "3/250ms"),
        Limit(Algorithm::kLeakyBucket, "7/min"), ShapeLimit("2/s", Duration::Zero(), 3),
        Limit(Algorithm::kFixedWindow, "40/min"), Limit(Algorithm::kSlidingLog, "5/h"),
        Limit(Algorithm::kSlidingWindow, "100/day")}) {
    const std::string key = KeyFor(config);
    SCOPED_TRACE(key);
    const std::string params[] = {LimitParams(config)};
    const std::string_view keys[] = {key};
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<ScriptResult> r = Run({.op = ScriptOp::kDecide, .cost = 2}, keys, params);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->decisions[0].allowed);
    const long long pttl = Command({"PTTL", key})->integer;
    const auto elapsed_us = std::chrono::duration_cast<std::chrono::microseconds>(
                                std::chrono::steady_clock::now() - start)
                                .count();
    const int64_t elapsed_ms = (elapsed_us + 999) / 1000;
    const int64_t want_ms =
        (FreshAfterDecide(config, r->now, 2) + KeptAfterFresh(config, r->now) - r->now)
            .CeilMillis();
    // PXAT the millisecond after the state is fresh (a window's key: and
    // kept as long again as it was written into its window), counted from
    // Redis' millisecond: never before, at most one more millisecond than
    // the relative ceiling. PTTL is counted at most elapsed_ms later, and
    // from a millisecond Redis truncates: up to one more millisecond gone,
    // and one more for the ceiling of want_ms.
    EXPECT_LE(pttl, want_ms + 1);
    EXPECT_GE(pttl, want_ms - elapsed_ms - 2);
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
    const std::string params[] = {LimitParams(config)};
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

// A window's keys are all fresh at its end, but expire over the period
// after it, each as long after the end as it was written after the start:
// never all at once (common.lua, "How long a window's key is kept"). Keys
// written 30 ms apart, each first written in its window by one of the three
// ways: as an empty key (read with GET or with the write of an empty key's
// state), by the fast path over a state of the window before, and by a
// charge (the general path). Each expires one period (a sliding window's:
// two) after the decision that wrote it, and a decision that raises it
// within its window keeps that expiry (KEEPTTL).
TEST_F(RedisTest, AWindowsKeysExpireAsLongAfterItsEndAsTheyWereWrittenAfterItsStart) {
  const int64_t period_us = 200'000;
  for (Algorithm algorithm : {Algorithm::kFixedWindow, Algorithm::kSlidingWindow}) {
    SCOPED_TRACE(AlgorithmName(algorithm));
    const bool fixed = algorithm == Algorithm::kFixedWindow;
    const int64_t fresh_windows = fixed ? 1 : 2;
    const std::string params[] = {LimitParams(Limit(algorithm, "1000/200ms"))};
    const std::string prefix = "{s}:" + std::string(AlgorithmName(algorithm)) + ":";
    std::set<int64_t> expiries;
    for (int i = 0; i < 9; ++i) {
      const std::string key = prefix + std::to_string(i);
      SCOPED_TRACE(key);
      const std::string_view keys[] = {key};
      Command({"DEL", key});
      ScriptArgs args{.op = ScriptOp::kDecide};
      if (i % 3 == 1) {  // a state of the window before
        Reply time = Command({"TIME"});
        const int64_t redis_us = std::stoll(std::string(Text(*time->element[0]))) * 1'000'000 +
                                 std::stoll(std::string(Text(*time->element[1])));
        Command({"SET", key, std::to_string(redis_us / period_us - 1) + (fixed ? " 1" : " 0 1")});
      } else if (i % 3 == 2) {
        args.op = ScriptOp::kCharge;
      }
      absl::StatusOr<ScriptResult> first = Run(args, keys, params);
      ASSERT_TRUE(first.ok()) << first.status();
      const int64_t now_us = first->now.unix_micros();
      const int64_t want_ms = (now_us + fresh_windows * period_us + 999) / 1000;
      EXPECT_EQ(Command({"PEXPIRETIME", key})->integer, want_ms);
      absl::StatusOr<ScriptResult> again = Run({.op = ScriptOp::kDecide}, keys, params);
      ASSERT_TRUE(again.ok()) << again.status();
      if (again->now.unix_micros() / period_us == now_us / period_us) {
        EXPECT_EQ(Command({"PEXPIRETIME", key})->integer, want_ms);
      }
      expiries.insert(want_ms);
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    EXPECT_EQ(expiries.size(), 9u);  // 30 ms apart: nine expiries, not one
  }
}

// When a window state stored as text ("window count", or "window prev curr"
// for a sliding window) is fresh: the algorithm's own FreshAt of it.
Time WindowFreshAt(const LimitConfig& config, std::string_view state) {
  std::vector<int64_t> n;
  for (const char* at = state.data(); at <= state.data() + state.size(); ++at) {
    int64_t v = 0;
    const std::from_chars_result read = std::from_chars(at, state.data() + state.size(), v);
    EXPECT_EQ(read.ec, std::errc()) << state;
    n.push_back(v);
    at = read.ptr;  // the space after the number, or the end
  }
  if (const auto* fixed = std::get_if<FixedWindowConfig>(&config)) {
    EXPECT_EQ(n.size(), 2u) << state;
    n.resize(2);
    return FreshAt(*fixed, FixedWindowState{.window = n[0], .count = n[1]});
  }
  EXPECT_EQ(n.size(), 3u) << state;
  n.resize(3);
  return FreshAt(std::get<SlidingWindowConfig>(config),
                 SlidingWindowState{.window = n[0], .prev = n[1], .curr = n[2]});
}

TEST_F(RedisTest, AWindowKeyExpiresWhenItsStateIsFreshAfterEveryWrite) {
  // A decision within a window keeps its key's expiry (SET KEEPTTL) where
  // the key was written in that window with a count; every other write sets
  // it. Whatever the path (the fast one, debt, refunds down to a previous
  // count alone, a new window), each write leaves the key expiring when its
  // state is fresh or at most one period later (how long a window's key is
  // kept): never sooner, which would forget a count. No key, no expiry.
  const auto expect_expiry_of_state = [](std::string_view key, const LimitConfig& config, int op) {
    Reply state = Command({"GET", key});
    const int64_t expiry_ms = Command({"PEXPIRETIME", key})->integer;
    if (state->type == REDIS_REPLY_NIL) {
      EXPECT_EQ(expiry_ms, -2) << "op " << op;  // no key
      return;
    }
    const int64_t fresh_at_us = WindowFreshAt(config, Text(*state)).unix_micros();
    const int64_t period_us = WindowPeriod(config).micros();
    EXPECT_GE(expiry_ms, (fresh_at_us + 999) / 1000) << "op " << op << ", " << Text(*state);
    EXPECT_LE(expiry_ms, (fresh_at_us + period_us + 999) / 1000)
        << "op " << op << ", " << Text(*state);
  };
  std::mt19937 random(7);
  for (Algorithm algorithm : {Algorithm::kFixedWindow, Algorithm::kSlidingWindow}) {
    const LimitConfig config = Limit(algorithm, "5/100ms");
    const std::string key = KeyFor(config);
    SCOPED_TRACE(key);
    const std::string params[] = {LimitParams(config)};
    const std::string_view keys[] = {key};
    std::vector<std::pair<Time, int64_t>> taken;  // allowed decisions, to refund
    for (int i = 0; i < 120; ++i) {
      ScriptArgs args{.op = ScriptOp::kDecide, .cost = static_cast<int64_t>(random() % 3)};
      const uint32_t pick = random() % 8;
      if (pick == 0 && !taken.empty()) {
        args = {
            .op = ScriptOp::kRefund, .cost = taken.back().second, .taken_at = taken.back().first};
        taken.pop_back();
      } else if (pick == 1) {
        args = {.op = ScriptOp::kCharge, .cost = static_cast<int64_t>(random() % 8)};
      }
      absl::StatusOr<ScriptResult> r = Run(args, keys, params);
      ASSERT_TRUE(r.ok()) << r.status();
      if (args.op == ScriptOp::kDecide && args.cost > 0 && r->decisions[0].allowed)
        taken.emplace_back(r->now, args.cost);
      expect_expiry_of_state(key, config, i);
      if (random() % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(random() % 30));
    }
  }
  // The case a kept expiry would get wrong: a sliding window's count refunded
  // to nothing, its previous count left (fresh when this window ends), then
  // a decision in the same window, whose count weighs on the next window.
  constexpr int64_t kLongPeriodUs = 300'000;
  const std::string key = "{refunded}:sliding_window";
  const LimitConfig refunded = Limit(Algorithm::kSlidingWindow, "5/300ms");
  const std::string params[] = {LimitParams(refunded)};
  const std::string_view keys[] = {key};
  absl::StatusOr<ScriptResult> r = Run({.op = ScriptOp::kDecide}, keys, params);
  ASSERT_TRUE(r.ok()) << r.status();
  // Into the next window, just after it starts (Redis' clock is this host's).
  const int64_t next_us = (r->now.unix_micros() / kLongPeriodUs + 1) * kLongPeriodUs;
  std::this_thread::sleep_for(std::chrono::microseconds(next_us - r->now.unix_micros() + 5'000));
  r = Run({.op = ScriptOp::kDecide}, keys, params);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(Run({.op = ScriptOp::kRefund, .taken_at = r->now}, keys, params).ok());
  expect_expiry_of_state(key, refunded, 1);
  ASSERT_EQ(Text(*Command({"GET", key})), std::to_string(next_us / kLongPeriodUs) + " 1 0");
  ASSERT_TRUE(Run({.op = ScriptOp::kDecide}, keys, params).ok());
  ASSERT_EQ(Text(*Command({"GET", key})), std::to_string(next_us / kLongPeriodUs) + " 1 1");
  expect_expiry_of_state(key, refunded, 2);
}

TEST_F(RedisTest, NoKeySurvivesItsFreshAtByMoreThanAPeriod) {
  std::vector<std::string> names;
  for (const LimitConfig& config :
       {Limit(Algorithm::kTokenBucket, "10/100ms"), Limit(Algorithm::kGcra, "10/100ms"),
        Limit(Algorithm::kLeakyBucket, "10/100ms"), ShapeLimit("10/100ms", Duration::Zero(), 3),
        Limit(Algorithm::kFixedWindow, "10/100ms"), Limit(Algorithm::kSlidingLog, "10/100ms"),
        Limit(Algorithm::kSlidingWindow, "10/100ms")}) {
    names.push_back(KeyFor(config));
    const std::string params[] = {LimitParams(config)};
    const std::string_view keys[] = {names.back()};
    ASSERT_TRUE(Run({.op = ScriptOp::kDecide, .cost = 3}, keys, params).ok());
    EXPECT_EQ(Command({"EXISTS", names.back()})->integer, 1);
    // At most two windows, and the millisecond PXAT rounds up to.
    EXPECT_LE(Command({"PTTL", names.back()})->integer, 201);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  for (const std::string& key : names) EXPECT_EQ(Command({"EXISTS", key})->integer, 0) << key;
}

TEST_F(RedisTest, SlidingLogHoldsOneEntryPerInstantAndAtMostTheLimit) {
  const LimitConfig config = Limit(Algorithm::kSlidingLog, "50/min");
  const std::string params[] = {LimitParams(config)};
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
    const std::string params[] = {LimitParams(c.config)};
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
