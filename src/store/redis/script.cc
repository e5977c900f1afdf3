#include "store/redis/script.h"

#include <algorithm>
#include <charconv>
#include <type_traits>
#include <variant>

#include "base/cat.h"
#include "redis/resp.h"

namespace sluice::redis {

// Defined in the file CMake generates from lua/*.lua (embed_script.cmake).
namespace internal {
extern const std::string_view kFunctionLibrary;
extern const std::string_view kFunctionName;
}  // namespace internal

using sluice::internal::Cat;

std::string_view FunctionLibrary() { return internal::kFunctionLibrary; }
std::string_view FunctionName() { return internal::kFunctionName; }

namespace {

// Larger costs decide like this one: every capacity a script compares a
// cost with is at most kMaxScriptTicks (2^51) < 2^52.
constexpr int64_t kMaxScriptCost = int64_t{1} << 52;

std::string BucketParams(std::string_view code, const BucketConfig& c) {
  const int64_t per_us = c.bucket_rate().ticks_per_us;
  // fill_us: any gap longer than this refills the whole bucket (BucketConfig::TicksIn).
  return Cat(code, " ", per_us, " ", c.bucket_rate().ticks_per_token, " ", c.burst(), " ",
             c.capacity_ticks(), " ", c.capacity_ticks() / per_us + 1);
}

std::string WindowParams(std::string_view code, const WindowConfig& c) {
  return Cat(code, " ", c.limit(), " ", c.period().micros());
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
        if constexpr (std::is_base_of_v<SlidingLogConfig, Config>) {
          // The script walks the entries that leave the window in one call;
          // Redis runs nothing else meanwhile, so the log is kept short.
          if (c.rate().limit > kMaxRedisSlidingLogLimit) {
            return absl::InvalidArgumentError(Cat(
                AlgorithmName(AlgorithmOf(LimitConfig(c))), ": limit ", c.rate().limit,
                " is above ", kMaxRedisSlidingLogLimit,
                ", the most a sliding_log or concurrency limit keeps in Redis (its log is walked "
                "in one script call, while Redis serves no one else); use sliding_window, or a "
                "local scope"));
          }
        }
        // Window limits are at most 2^40 and periods at most 366 days < 2^45
        // (ValidateRate); the script's products of the two are exact (muldiv).
        return absl::OkStatus();
      },
      config);
}

std::string LimitParams(const LimitConfig& config, bool integer_windows) {
  return std::visit(
      [integer_windows](const auto& c) -> std::string {
        using Config = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<Config, TokenBucketConfig>) {
          return BucketParams("tb", c);
        } else if constexpr (std::is_same_v<Config, GcraConfig>) {
          return BucketParams("gc", c);
        } else if constexpr (std::is_same_v<Config, LeakyPoliceConfig>) {
          return BucketParams("lp", c);
        } else if constexpr (std::is_same_v<Config, LeakyShapeConfig>) {
          return Cat("ls ", c.bucket_rate().ticks_per_us, " ", c.bucket_rate().ticks_per_token, " ",
                     c.capacity(), " ", c.bound_ticks());
        } else if constexpr (std::is_same_v<Config, FixedWindowConfig>) {
          return integer_windows ? Cat(WindowParams("fw", c), " i") : WindowParams("fw", c);
        } else if constexpr (std::is_same_v<Config, ConcurrencyConfig>) {
          // The sliding log whose period is the lease TTL, its entries named.
          return WindowParams("cc", c);
        } else if constexpr (std::is_same_v<Config, SlidingLogConfig>) {
          return WindowParams("sl", c);
        } else {
          static_assert(std::is_same_v<Config, SlidingWindowConfig>);
          return integer_windows ? Cat(WindowParams("sw", c), " i") : WindowParams("sw", c);
        }
      },
      config);
}

int64_t ParamsLimit(std::string_view params) {
  // The code, then its integers: the limit is the first of a window's or
  // log's, the third of a bucket's (burst) or a shaper's (capacity).
  const size_t code_end = params.find(' ');
  const std::string_view code = params.substr(0, code_end);
  const int word = code == "fw" || code == "sw" || code == "sl" || code == "cc" ? 1 : 3;
  size_t at = code_end;
  for (int i = 1; i < word && at != std::string_view::npos; ++i) at = params.find(' ', at + 1);
  if (at == std::string_view::npos) return 0;
  const char* begin = params.data() + at + 1;
  const char* end = params.data() + params.size();
  int64_t limit = 0;
  const auto [ptr, ec] = std::from_chars(begin, end, limit);
  if (ec != std::errc() || (ptr != end && *ptr != ' ')) return 0;
  return limit;
}

// ---- calls ----

namespace {

void AppendNumber(std::string& out, int64_t value) {
  char digits[24];
  const auto [end, ec] = std::to_chars(digits, digits + sizeof digits, value);
  AppendBulk(out, std::string_view(digits, static_cast<size_t>(end - digits)));
}

}  // namespace

CallPart EncodePart(const ScriptArgs& args, std::span<const std::string_view> keys,
                    std::span<const std::string_view> limits) {
  CallPart part;
  const size_t n = std::min(keys.size(), limits.size());
  part.key_count = static_cast<uint32_t>(n);
  part.arg_count = static_cast<uint32_t>(kPartFixedArgs + n);
  part.decisions =
      args.op == ScriptOp::kRefund || args.op == ScriptOp::kCharge ? 0 : static_cast<uint32_t>(n);
  size_t key_bytes = 0;
  for (size_t i = 0; i < n; ++i) key_bytes += keys[i].size() + 16;
  part.keys.reserve(key_bytes);
  for (size_t i = 0; i < n; ++i) AppendBulk(part.keys, keys[i]);
  std::string& a = part.args;
  // Each argument's RESP header and ending take at most 10 bytes (`$`, up
  // to 5 digits of length, CRLF twice); the part's five before its limits
  // are numbers or letters of at most 20 bytes.
  size_t arg_bytes = 5 * 30;
  for (size_t i = 0; i < n; ++i) arg_bytes += limits[i].size() + 10;
  a.reserve(arg_bytes);
  const bool named =
      args.slot != 0 &&
      (args.op == ScriptOp::kDecide || args.op == ScriptOp::kRefund || args.op == ScriptOp::kRenew);
  if (n == 1 && !args.now.has_value() && !named &&
      (args.op == ScriptOp::kDecide || args.op == ScriptOp::kCheck)) {
    // The short form, for most requests: one limit, Redis' time.
    part.arg_count = 3;
    part.short_form = true;
    part.limit = ParamsLimit(limits[0]);
    AppendBulk(a, args.op == ScriptOp::kDecide ? "d" : "c");
    AppendNumber(a, std::clamp<int64_t>(args.cost, 0, kMaxScriptCost));
    AppendBulk(a, limits[0]);
    return part;
  }
  AppendBulk(a, args.op == ScriptOp::kDecide   ? "D"
                : args.op == ScriptOp::kCheck  ? "C"
                : args.op == ScriptOp::kLease  ? "L"
                : args.op == ScriptOp::kRenew  ? "N"
                : args.op == ScriptOp::kCharge ? "G"
                                               : "R");
  if (args.now.has_value()) {
    AppendNumber(a, args.now->unix_micros());
  } else {
    AppendBulk(a, "");
  }
  AppendNumber(a, std::clamp<int64_t>(args.cost, 0, kMaxScriptCost));
  if (named) {
    const int64_t at = args.op == ScriptOp::kDecide ? 0 : args.taken_at.unix_micros();
    AppendBulk(a, Cat(at, ":", args.slot));
  } else if (args.op == ScriptOp::kRefund || args.op == ScriptOp::kRenew) {
    AppendNumber(a, args.taken_at.unix_micros());
  } else if (args.op == ScriptOp::kLease) {
    AppendNumber(a, std::max<int64_t>(0, args.lead.micros()));
  } else {
    AppendBulk(a, "");
  }
  // n == 0 (a misuse) is sent as it is: the function refuses the call.
  AppendNumber(a, static_cast<int64_t>(n));
  for (size_t i = 0; i < n; ++i) AppendBulk(a, limits[i]);
  return part;
}

std::string JoinParts(std::span<const CallPart* const> parts) {
  // The length of the run of short parts alike that starts at parts[i].
  auto run_at = [&](size_t i) {
    size_t j = i + 1;
    if (parts[i]->short_form) {
      while (j < parts.size() && parts[j]->short_form && parts[j]->args == parts[i]->args) ++j;
    }
    return j - i;
  };
  uint64_t keys = 0;
  uint64_t args = 0;
  size_t bytes = 64;
  for (size_t i = 0; i < parts.size();) {
    const size_t run = run_at(i);
    if (run > 1) args += 2;  // "*" and the run's length
    args += parts[i]->arg_count;
    bytes += parts[i]->args.size() + 16;
    for (size_t j = i; j < i + run; ++j) {
      keys += parts[j]->key_count;
      bytes += parts[j]->keys.size();
    }
    i += run;
  }
  std::string out;
  out.reserve(bytes);
  AppendHeader(out, '*', 3 + keys + args);
  AppendBulk(out, "FCALL");
  AppendBulk(out, FunctionName());
  AppendNumber(out, static_cast<int64_t>(keys));
  for (const CallPart* p : parts) out += p->keys;
  for (size_t i = 0; i < parts.size();) {
    const size_t run = run_at(i);
    if (run > 1) {
      AppendBulk(out, "*");
      AppendNumber(out, static_cast<int64_t>(run));
    }
    out += parts[i]->args;
    i += run;
  }
  return out;
}

std::string JoinParts(std::span<const CallPart> parts) {
  std::vector<const CallPart*> pointers;
  pointers.reserve(parts.size());
  for (const CallPart& p : parts) pointers.push_back(&p);
  return JoinParts(pointers);
}

// ---- replies ----

namespace {

absl::Status ErrorReply(std::string_view message) {
  const std::string_view code = message.substr(0, message.find(' '));
  const std::string text = Cat("redis: ", message);
  for (std::string_view transient : {"LOADING", "BUSY", "MASTERDOWN", "READONLY", "TRYAGAIN",
                                     "CLUSTERDOWN", "MOVED", "ASK", "OOM"}) {
    if (code == transient) return absl::UnavailableError(text);
  }
  return absl::InternalError(text);
}

}  // namespace

absl::StatusOr<std::vector<absl::StatusOr<ScriptResult>>> ParseCallReply(
    const redisReply& reply, std::span<const CallPart* const> parts) {
  if (reply.type == REDIS_REPLY_ERROR) {
    return ErrorReply(std::string_view(reply.str, reply.len));
  }
  if (reply.type != REDIS_REPLY_ARRAY) {
    return absl::InternalError(
        Cat("the sluice function answered a reply of type ", reply.type, "; expected an array"));
  }
  std::vector<absl::StatusOr<ScriptResult>> results;
  results.reserve(parts.size());
  size_t i = 0;
  auto shape_error = [&](std::string_view what) {
    return absl::InternalError(Cat("the sluice function's answer to part ", results.size(), " of ",
                                   parts.size(), " (reply element ", i, " of ", reply.elements,
                                   ") ", what));
  };
  // A call with short parts ends with their time.
  size_t end = reply.elements;
  int64_t call_now = 0;
  if (std::any_of(parts.begin(), parts.end(), [](const CallPart* p) { return p->short_form; })) {
    if (end == 0 || reply.element[end - 1]->type != REDIS_REPLY_INTEGER) {
      return absl::InternalError("the sluice function's answer does not end with its time");
    }
    call_now = reply.element[--end]->integer;
  }
  // Whether the part before `part`, a short one too, was answered.
  auto after_short_answer = [&](const CallPart* part) {
    return part->short_form && !results.empty() && results.back().ok() &&
           results.back()->decisions.size() == 1 && parts[results.size() - 1]->short_form;
  };
  for (const CallPart* part : parts) {
    if (i >= end) return shape_error("is missing");
    const redisReply& head = *reply.element[i];
    if (head.type == REDIS_REPLY_NIL) {
      // A short part answered as the short part before it.
      if (!after_short_answer(part)) return shape_error("repeats no short answer before it");
      absl::StatusOr<ScriptResult> same = results.back();
      results.push_back(std::move(same));
      ++i;
      continue;
    }
    if (part->short_form && head.type == REDIS_REPLY_INTEGER && head.integer > 0 &&
        head.integer % 2 == 1) {
      // One odd code, 2 x remaining + 1: allowed with no delay, and the
      // reset_after of the short part before it (a window's run).
      if (!after_short_answer(part)) return shape_error("takes the reset of no answer before it");
      Decision d;
      d.allowed = true;
      d.limit = part->limit;
      d.remaining = head.integer / 2;
      d.reset_after = results.back()->decisions[0].reset_after;
      results.push_back(ScriptResult{.now = Time::FromUnixMicros(call_now), .decisions = {d}});
      ++i;
      continue;
    }
    if (head.type == REDIS_REPLY_STRING || head.type == REDIS_REPLY_STATUS ||
        head.type == REDIS_REPLY_ERROR) {
      results.push_back(absl::InternalError(
          Cat("redis: the sluice function failed: ", std::string_view(head.str, head.len))));
      ++i;
      continue;
    }
    const size_t count = part->short_form ? 3 : 1 + size_t{part->decisions} * 6;
    if (i + count > end) return shape_error("is cut short");
    for (size_t j = i; j < i + count; ++j) {
      if (reply.element[j]->type != REDIS_REPLY_INTEGER) return shape_error("is not integers");
    }
    auto at = [&](size_t j) -> int64_t { return reply.element[i + j]->integer; };
    if (part->short_form) {
      // code, remaining, reset_after_us; code: twice the delay (even,
      // >= 0) when allowed, -2 - retry_after_us when denied (-1: never).
      // The limit is the part's own.
      const int64_t code = at(0);
      if (code < -(int64_t{1} << 62) || at(2) < 0) {
        return shape_error(Cat("has a malformed decision (code ", code, ")"));
      }
      Decision d;
      d.allowed = code >= 0;
      d.limit = part->limit;
      d.remaining = at(1);
      d.reset_after = Duration::Micros(at(2));
      d.retry_after = code >= 0    ? Duration::Zero()
                      : code == -1 ? Duration::Infinite()
                                   : Duration::Micros(-code - 2);
      d.delay = Duration::Micros(std::max<int64_t>(code, 0) / 2);
      results.push_back(ScriptResult{.now = Time::FromUnixMicros(call_now), .decisions = {d}});
      i += count;
      continue;
    }
    ScriptResult result;
    result.now = Time::FromUnixMicros(at(0));
    result.decisions.reserve(part->decisions);
    for (size_t n = 0; n < part->decisions; ++n) {
      const size_t d0 = 1 + n * 6;
      const int64_t allowed = at(d0);
      const int64_t retry = at(d0 + 4);
      if ((allowed != 0 && allowed != 1) || retry < -1 || at(d0 + 3) < 0 || at(d0 + 5) < 0) {
        return shape_error(Cat("has a malformed decision for limit ", n, " (allowed ", allowed,
                               ", retry_after ", retry, ")"));
      }
      Decision d;
      d.allowed = allowed == 1;
      d.limit = at(d0 + 1);
      d.remaining = at(d0 + 2);
      d.reset_after = Duration::Micros(at(d0 + 3));
      d.retry_after = retry == -1 ? Duration::Infinite() : Duration::Micros(retry);
      d.delay = Duration::Micros(at(d0 + 5));
      result.decisions.push_back(d);
    }
    results.push_back(std::move(result));
    i += count;
  }
  if (i != end) {
    return absl::InternalError(Cat("the sluice function answered ", reply.elements,
                                   " elements for ", parts.size(), " parts; expected ",
                                   i + (reply.elements - end)));
  }
  return results;
}

absl::StatusOr<std::vector<absl::StatusOr<ScriptResult>>> ParseCallReply(
    const redisReply& reply, std::span<const CallPart> parts) {
  std::vector<const CallPart*> pointers;
  pointers.reserve(parts.size());
  for (const CallPart& p : parts) pointers.push_back(&p);
  return ParseCallReply(reply, pointers);
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
