// store/redis/script.h: the Lua script that runs sluice's algorithms inside
// Redis, and the C++ that encodes a call to it and decodes its answer.
//
// One script (lua/*.lua, joined at build time) serves every policy, so one
// SHA is loaded per server. Each algorithm in it is the exact twin of its
// C++ Decide/Refund/FreshAt: same decisions, field by field (the parity
// tests hold it to that). A call names one Redis key per limit of a policy
// and decides them all-or-nothing inside Redis; see docs/redis-scripts.md.
//
//   EVALSHA sha numkeys key... op now_us cost taken_at_us [code p1..p5]...
//
// The per-limit group [code p1..p5] is LimitParams(config), computed once per
// limit; a call formats only op, now, cost and taken_at. Keys are the
// caller's: distinct per limit, sharing one {hash tag} (one Cluster slot),
// and naming the limit's config, since a key's stored state is read with
// the limit's parameters.
//
// Thread-safety: the free functions are pure and safe from any thread. A
// ScriptCall is one caller's scratch space: not shared between threads.
//
//   const std::vector<std::string> params = sluice::redis::LimitParams(config);  // once
//   sluice::redis::ScriptCall call;
//   call.Start(sluice::redis::DecideScriptSha(), {.op = sluice::redis::ScriptOp::kDecide}, 1);
//   call.AddLimit("{user-42}:api:0", params);
//   auto* reply = static_cast<redisReply*>(
//       redisCommandArgv(context, call.argc(), call.argv(), call.argvlen()));
//   absl::StatusOr<sluice::redis::ScriptResult> result =
//       sluice::redis::ParseScriptReply(*reply, /*limits=*/1);
#ifndef SLUICE_STORE_REDIS_SCRIPT_H_
#define SLUICE_STORE_REDIS_SCRIPT_H_

#include <hiredis/hiredis.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sluice/algorithm.h"
#include "sluice/decision.h"
#include "sluice/time.h"

namespace sluice::redis {

// The whole script, and its SHA1 in hex (what EVALSHA names and SCRIPT LOAD
// returns), both fixed at build time.
std::string_view DecideScript();
std::string_view DecideScriptSha();

// Arguments before the per-limit groups (op, now_us, cost, taken_at_us), and
// the size of each group (an algorithm code and five parameters).
inline constexpr size_t kScriptFixedArgs = 4;
inline constexpr size_t kParamsPerLimit = 6;

// Every value the script keeps stays an integer below 2^53, exact in Lua's
// doubles, when the bucket capacity (burst x ticks_per_token) and the
// leaky_bucket shape bound (bound_ticks + ticks_per_token) are at most this;
// the other intermediates are at most twice that plus a little.
inline constexpr int64_t kMaxScriptTicks = int64_t{1} << 51;

// The most entries a sliding_log keeps in Redis. A call walks at most the
// entries that leave the window since the key's last call (or, denied, those
// that must leave for it to fit), about 0.7 us each in Redis' Lua: bounded
// by this, a call holds Redis for milliseconds at worst, not a second.
inline constexpr int64_t kMaxRedisSlidingLogLimit = 10'000;

// OK when the script computes `config` exactly and in bounded time;
// otherwise InvalidArgument naming the value and the bound.
absl::Status ValidateForRedis(const LimitConfig& config);

// The per-limit argument group for `config`, kParamsPerLimit strings.
// REQUIRES: ValidateForRedis(config).ok().
std::vector<std::string> LimitParams(const LimitConfig& config);

enum class ScriptOp {
  kDecide,  // decide all limits, write only if all allow
  kCheck,   // the same decisions, nothing written
  kRefund,  // give back `cost` taken at `taken_at` (leaky shape limits keep it)
};

struct ScriptArgs {
  ScriptOp op = ScriptOp::kDecide;
  // The time the script decides at. Default (production): Redis' own clock
  // (TIME), so instances with skewed clocks agree. A given time is for tests
  // and replays; keys then get no expiry, since it is not Redis' clock.
  std::optional<Time> now;
  // Weight of the request, >= 0. Costs above 2^52 are sent as 2^52, which
  // decides the same: every capacity is below it.
  int64_t cost = 1;
  // kRefund only: the time the cost was taken (ScriptResult::now of that call).
  Time taken_at;
};

// The argv of one EVALSHA, in the form hiredis' *CommandArgv functions take.
// Keys and params are referenced, not copied: they must outlive the use of
// argv(). Reusing one ScriptCall allocates nothing once it has held a call
// with as many limits.
class ScriptCall {
 public:
  // Begins a call over `limits` limits (>= 1), then AddLimit each of them in
  // decision order (a leaky_bucket shape limit last, as Limiter does).
  void Start(std::string_view sha, const ScriptArgs& args, size_t limits);
  void AddLimit(std::string_view key, std::span<const std::string> params);

  // REQUIRES: all limits added.
  int argc() const { return static_cast<int>(argv_.size()); }
  const char** argv();
  const size_t* argvlen() const { return argvlen_.data(); }

 private:
  using Number = std::array<char, 24>;
  void SetNumber(size_t index, Number& buffer, int64_t value);

  std::vector<const char*> argv_;
  std::vector<size_t> argvlen_;
  size_t limits_ = 0;
  size_t added_ = 0;
  // Formatted numbers, pointed at by argv() (re-pointed there, so a copied
  // or moved ScriptCall stays valid).
  Number numkeys_{};
  Number now_{};
  Number cost_{};
  Number taken_at_{};
};

struct ScriptResult {
  // The time the script decided at: Redis' clock, or ScriptArgs::now. A
  // caller keeps it to refund later (ScriptArgs::taken_at).
  Time now;
  // One per limit, in call order; empty for kRefund.
  std::vector<Decision> decisions;
};

// Decodes the reply to a call over `limits` limits (0 for kRefund). An error
// reply becomes a Status carrying Redis' message: NOSCRIPT is
// FailedPrecondition (see IsNoScript), LOADING / BUSY / MASTERDOWN /
// READONLY / TRYAGAIN / CLUSTERDOWN / MOVED / ASK / OOM are Unavailable (the
// server cannot run the script now), the rest (a failing script, WRONGTYPE)
// Internal. A reply of the wrong shape is
// Internal.
absl::StatusOr<ScriptResult> ParseScriptReply(const redisReply& reply, size_t limits);

// Whether `status` is Redis' NOSCRIPT answer: load the script and retry.
bool IsNoScript(const absl::Status& status);

// The decision a policy reports for one call's per-limit decisions (given in
// decision order), merged exactly as Limiter does: when any denies, the
// first denial, replaced by a later one that waits strictly longer; when
// all allow, the one with the least remaining (the first on ties), with the
// longest delay of all. `index` is the reported limit's position in
// `decisions`. REQUIRES: !decisions.empty().
struct MergedDecision {
  Decision decision;
  size_t index = 0;
};
MergedDecision MergeDecisions(std::span<const Decision> decisions);

}  // namespace sluice::redis

#endif  // SLUICE_STORE_REDIS_SCRIPT_H_
