#include "store/redis/script.h"

#include <algorithm>
#include <charconv>
#include <type_traits>
#include <variant>

#include "base/cat.h"

namespace sluice::redis {

// Defined in the file CMake generates from lua/*.lua (embed_script.cmake).
namespace internal {
extern const std::string_view kDecideScript;
extern const std::string_view kDecideScriptSha;
}  // namespace internal

using sluice::internal::Cat;

std::string_view DecideScript() { return internal::kDecideScript; }
std::string_view DecideScriptSha() { return internal::kDecideScriptSha; }

namespace {

// Larger costs decide like this one: every capacity a script compares a
// cost with is at most kMaxScriptTicks (2^51) < 2^52.
constexpr int64_t kMaxScriptCost = int64_t{1} << 52;

std::string Int(int64_t value) { return std::to_string(value); }

std::vector<std::string> BucketParams(std::string_view code, const BucketConfig& c) {
  const int64_t per_us = c.bucket_rate().ticks_per_us;
  // fill_us: any gap longer than this refills the whole bucket (BucketConfig::TicksIn).
  return {std::string(code),
          Int(per_us),
          Int(c.bucket_rate().ticks_per_token),
          Int(c.burst()),
          Int(c.capacity_ticks()),
          Int(c.capacity_ticks() / per_us + 1)};
}

std::vector<std::string> WindowParams(std::string_view code, const WindowConfig& c) {
  return {std::string(code), Int(c.limit()), Int(c.period().micros()), "", "", ""};
}

}  // namespace

absl::Status ValidateForRedis(const LimitConfig& config) {
  return std::visit(
      [](const auto& c) -> absl::Status {
        using Config = std::decay_t<decltype(c)>;
        if constexpr (std::is_base_of_v<BucketConfig, Config>) {
          if (c.capacity_ticks() > kMaxScriptTicks) {
            return absl::InvalidArgumentError(Cat(
                AlgorithmName(AlgorithmOf(LimitConfig(c))), ": burst ", c.burst(), " at rate ",
                FormatRate(c.rate()), " is ", c.capacity_ticks(),
                " ticks of capacity (burst x ticks_per_token), above the Redis scripts' bound of "
                "2^51 = ",
                kMaxScriptTicks, " (Lua computes in doubles, exact below 2^53); lower the burst"));
          }
        } else if constexpr (std::is_same_v<Config, LeakyShapeConfig>) {
          const int64_t per_token = c.bucket_rate().ticks_per_token;
          if (c.bound_ticks() > kMaxScriptTicks - per_token) {
            return absl::InvalidArgumentError(
                Cat("leaky_bucket mode shape: the wait bound (max_delay ",
                    FormatDuration(c.max_delay()), ", queue ", c.queue(), ") at rate ",
                    FormatRate(c.rate()), " is ", c.bound_ticks(), " ticks, plus ", per_token,
                    " ticks per token above the Redis scripts' bound of 2^51 = ", kMaxScriptTicks,
                    " (Lua computes in doubles, exact below 2^53); lower max_delay or queue"));
          }
        }
        if constexpr (std::is_same_v<Config, SlidingLogConfig>) {
          // The script walks the entries that leave the window in one call;
          // Redis runs nothing else meanwhile, so the log is kept short.
          if (c.rate().limit > kMaxRedisSlidingLogLimit) {
            return absl::InvalidArgumentError(Cat(
                "sliding_log: limit ", c.rate().limit, " is above ", kMaxRedisSlidingLogLimit,
                ", the most a sliding_log keeps in Redis (its log is walked in one script call, "
                "while Redis serves no one else); use sliding_window, or a local scope"));
          }
        }
        // Window limits are at most 2^40 and periods at most 366 days < 2^45
        // (ValidateRate); the script's products of the two are exact (muldiv).
        return absl::OkStatus();
      },
      config);
}

std::vector<std::string> LimitParams(const LimitConfig& config) {
  return std::visit(
      [](const auto& c) -> std::vector<std::string> {
        using Config = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<Config, TokenBucketConfig>) {
          return BucketParams("tb", c);
        } else if constexpr (std::is_same_v<Config, GcraConfig>) {
          return BucketParams("gc", c);
        } else if constexpr (std::is_same_v<Config, LeakyPoliceConfig>) {
          return BucketParams("lp", c);
        } else if constexpr (std::is_same_v<Config, LeakyShapeConfig>) {
          return {"ls",
                  Int(c.bucket_rate().ticks_per_us),
                  Int(c.bucket_rate().ticks_per_token),
                  Int(c.capacity()),
                  Int(c.bound_ticks()),
                  ""};
        } else if constexpr (std::is_same_v<Config, FixedWindowConfig>) {
          return WindowParams("fw", c);
        } else if constexpr (std::is_same_v<Config, SlidingLogConfig>) {
          return WindowParams("sl", c);
        } else {
          static_assert(std::is_same_v<Config, SlidingWindowConfig>);
          return WindowParams("sw", c);
        }
      },
      config);
}

// ---- ScriptCall ----
//
// argv layout: EVALSHA sha numkeys | key x N | op now cost taken_at |
// (code p1..p5) x N.

void ScriptCall::Start(std::string_view sha, const ScriptArgs& args, size_t limits) {
  limits_ = limits;
  added_ = 0;
  const size_t argc = 3 + limits + kScriptFixedArgs + limits * kParamsPerLimit;
  // Keeps the capacity: no allocation on reuse. A limit never added stays
  // "", which the script rejects.
  argv_.assign(argc, "");
  argvlen_.assign(argc, 0);
  argv_[0] = "EVALSHA";
  argvlen_[0] = 7;
  argv_[1] = sha.data();
  argvlen_[1] = sha.size();
  SetNumber(2, numkeys_, static_cast<int64_t>(limits));
  const size_t fixed = 3 + limits;
  argv_[fixed] = args.op == ScriptOp::kDecide ? "D" : args.op == ScriptOp::kCheck ? "C" : "R";
  argvlen_[fixed] = 1;
  if (args.now.has_value()) {
    SetNumber(fixed + 1, now_, args.now->unix_micros());
  } else {
    now_[0] = '\0';
    argvlen_[fixed + 1] = 0;
  }
  SetNumber(fixed + 2, cost_, std::clamp<int64_t>(args.cost, 0, kMaxScriptCost));
  if (args.op == ScriptOp::kRefund) {
    SetNumber(fixed + 3, taken_at_, args.taken_at.unix_micros());
  } else {
    taken_at_[0] = '\0';
    argvlen_[fixed + 3] = 0;
  }
}

void ScriptCall::AddLimit(std::string_view key, std::span<const std::string> params) {
  // A misuse leaves a "" argument, which the script rejects with an error.
  if (added_ >= limits_ || params.size() != kParamsPerLimit) return;
  argv_[3 + added_] = key.data();
  argvlen_[3 + added_] = key.size();
  const size_t first = 3 + limits_ + kScriptFixedArgs + added_ * kParamsPerLimit;
  for (size_t i = 0; i < kParamsPerLimit; ++i) {
    argv_[first + i] = params[i].data();
    argvlen_[first + i] = params[i].size();
  }
  ++added_;
}

const char** ScriptCall::argv() {
  const size_t fixed = 3 + limits_;
  argv_[2] = numkeys_.data();
  argv_[fixed + 1] = now_.data();
  argv_[fixed + 2] = cost_.data();
  argv_[fixed + 3] = taken_at_.data();
  return argv_.data();
}

void ScriptCall::SetNumber(size_t index, Number& buffer, int64_t value) {
  const auto [end, ec] = std::to_chars(buffer.data(), buffer.data() + buffer.size() - 1, value);
  *end = '\0';
  argv_[index] = buffer.data();
  argvlen_[index] = static_cast<size_t>(end - buffer.data());
}

// ---- replies ----

namespace {

absl::Status ErrorReply(std::string_view message) {
  const std::string_view code = message.substr(0, message.find(' '));
  const std::string text = Cat("redis: ", message);
  if (code == "NOSCRIPT") return absl::FailedPreconditionError(text);
  for (std::string_view transient : {"LOADING", "BUSY", "MASTERDOWN", "READONLY", "TRYAGAIN",
                                     "CLUSTERDOWN", "MOVED", "ASK", "OOM"}) {
    if (code == transient) return absl::UnavailableError(text);
  }
  return absl::InternalError(text);
}

}  // namespace

absl::StatusOr<ScriptResult> ParseScriptReply(const redisReply& reply, size_t limits) {
  if (reply.type == REDIS_REPLY_ERROR) {
    return ErrorReply(std::string_view(reply.str, reply.len));
  }
  const size_t expected = 1 + limits * 6;
  if (reply.type != REDIS_REPLY_ARRAY || reply.elements != expected) {
    return absl::InternalError(Cat("the sluice script answered a reply of type ", reply.type,
                                   " with ", reply.elements, " elements; expected an array of ",
                                   expected, " integers"));
  }
  for (size_t i = 0; i < expected; ++i) {
    if (reply.element[i]->type != REDIS_REPLY_INTEGER) {
      return absl::InternalError(
          Cat("the sluice script's reply element ", i, " is not an integer"));
    }
  }
  auto at = [&](size_t i) -> int64_t { return reply.element[i]->integer; };
  ScriptResult result;
  result.now = Time::FromUnixMicros(at(0));
  result.decisions.reserve(limits);
  for (size_t n = 0; n < limits; ++n) {
    const size_t i = 1 + n * 6;
    const int64_t allowed = at(i);
    const int64_t retry = at(i + 4);
    if ((allowed != 0 && allowed != 1) || retry < -1 || at(i + 3) < 0 || at(i + 5) < 0) {
      return absl::InternalError(Cat("the sluice script's decision for limit ", n,
                                     " is malformed (allowed ", allowed, ", retry_after ", retry,
                                     ")"));
    }
    Decision d;
    d.allowed = allowed == 1;
    d.limit = at(i + 1);
    d.remaining = at(i + 2);
    d.reset_after = Duration::Micros(at(i + 3));
    d.retry_after = retry == -1 ? Duration::Infinite() : Duration::Micros(retry);
    d.delay = Duration::Micros(at(i + 5));
    result.decisions.push_back(d);
  }
  return result;
}

bool IsNoScript(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         status.message().find("NOSCRIPT") != std::string_view::npos;
}

// ---- merging ----

MergedDecision MergeDecisions(std::span<const Decision> decisions) {
  MergedDecision result;
  bool denied = false;
  for (size_t i = 0; i < decisions.size(); ++i) {
    const Decision& d = decisions[i];
    if (!d.allowed) {
      // Retry-After must cover every limit that denies: a later limit
      // replaces the first denial only when it waits strictly longer.
      if (!denied || d.retry_after > result.decision.retry_after) result = {d, i};
      denied = true;
    } else if (!denied) {
      // Among allowed decisions the least remaining is the most
      // restrictive; the largest delay wins over all of them.
      const Duration delay = std::max(result.decision.delay, d.delay);
      if (i == 0 || d.remaining < result.decision.remaining) result = {d, i};
      result.decision.delay = delay;
    }
  }
  return result;
}

}  // namespace sluice::redis
