// store/redis/script.h: the Redis function that runs sluice's algorithms
// inside Redis, and the C++ that encodes a call to it and decodes its answer.
//
// One function library (lua/*.lua, joined at build time) serves every
// policy; it is loaded once per node (FUNCTION LOAD) and named after its
// code, so two versions of sluice sharing a Redis each call their own. Each
// algorithm in it is the exact twin of its C++ Decide/Refund/FreshAt: same
// decisions, field by field (the parity tests hold it to that). A call
// carries one or more parts (requests), decided in order, each over one
// Redis key per limit of a policy, all-or-nothing within the part, each with
// its own answer; see docs/redis-scripts.md.
//
//   FCALL <FunctionName()> numkeys key... part...
//   part: op now_us cost taken_at_us n limit_1 ... limit_n
//     or, one limit at Redis' time (most requests): d|c cost limit_1
//   (taken_at_us "taken_at_us:slot" where a concurrency limit's slots are named)
//
// limit_i is LimitParams(config), one string computed once per limit. Keys
// are the caller's: distinct per limit, sharing one {hash tag} (one Cluster
// slot) within a part, and naming the limit's config, since a key's stored
// state is read with the limit's parameters. All the keys of one call must
// be in one Cluster slot.
//
// Thread-safety: the free functions are pure and safe from any thread.
//
//   const std::string params = sluice::redis::LimitParams(config);  // once
//   const std::string_view keys[] = {"{user-42}:api:0"};
//   const std::string_view limits[] = {params};
//   sluice::redis::CallPart part = sluice::redis::EncodePart({}, keys, limits);
//   std::string command = sluice::redis::JoinParts({&part, 1});  // RESP, to send
//   ... the reply to it:
//   absl::StatusOr<std::vector<absl::StatusOr<sluice::redis::ScriptResult>>> results =
//       sluice::redis::ParseCallReply(reply, {&part, 1});
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

// The library's code (what FUNCTION LOAD takes, starting "#!lua
// name=<FunctionName()>") and the name of its function, which is also the
// library's, both fixed at build time.
std::string_view FunctionLibrary();
std::string_view FunctionName();

// A part's arguments before its limits (op, now_us, cost, taken_at_us, n).
inline constexpr size_t kPartFixedArgs = 5;

// Every value the function keeps stays an integer below 2^53, exact in Lua's
// doubles, when the bucket capacity (burst x ticks_per_token) and the
// leaky_bucket shape bound (bound_ticks + ticks_per_token) are at most this;
// the other intermediates are at most twice that plus a little.
inline constexpr int64_t kMaxScriptTicks = int64_t{1} << 51;

// The most entries a sliding_log keeps in Redis. A call walks at most the
// entries that leave the window since the key's last call (or, denied, those
// that must leave for it to fit), about 0.7 us each in Redis' Lua: bounded
// by this, a call holds Redis for milliseconds at worst, not a second.
inline constexpr int64_t kMaxRedisSlidingLogLimit = 10'000;

// OK when the function computes `config` exactly and in bounded time;
// otherwise InvalidArgument naming the value and the bound.
absl::Status ValidateForRedis(const LimitConfig& config);

// The limit's parameters as the function reads them: its algorithm's code
// and its integers, space-separated ("fw 100 60000000"); a fixed or sliding
// window with `integer_windows` ends with " i": its states are written in
// the integer form (WindowState::kInteger).
// REQUIRES: ValidateForRedis(config).ok().
std::string LimitParams(const LimitConfig& config, bool integer_windows = false);

// The limit every decision of the limit with parameters `params`
// (LimitParams) answers (Decision::limit): a window's or log's limit, a
// bucket's burst, a shaper's capacity; 0 where `params` is malformed. A
// short part's answer leaves it out (the caller knows it).
int64_t ParamsLimit(std::string_view params);

enum class ScriptOp {
  kDecide,  // decide all limits, write only if all allow
  kCheck,   // the same decisions, nothing written
  kRefund,  // give back `cost` taken at `taken_at` (leaky shape limits keep it)
  kLease,   // kDecide of one gcra or token_bucket limit, its slots `lead` ahead
  kRenew,   // kRefund of `cost` taken at `taken_at`, then kDecide, in one part
  kCharge,  // take `cost` whether or not it fits: debt (settled costs)
};

struct ScriptArgs {
  ScriptOp op = ScriptOp::kDecide;
  // The time the function decides at. Default (production): Redis' own clock
  // (TIME), so instances with skewed clocks agree. A given time is for tests
  // and replays; keys then get no expiry, since it is not Redis' clock.
  std::optional<Time> now;
  // Weight of the request, >= 0. Costs above 2^52 are sent as 2^52, which
  // decides the same: every capacity is below it.
  int64_t cost = 1;
  // kRefund and kRenew: the time the cost was taken (ScriptResult::now of
  // that call).
  Time taken_at;
  // kDecide, kRefund and kRenew: the name a concurrency limit's slots are
  // held under, given back and renewed by (LimitTable::Hold); 0: none.
  uint64_t slot = 0;
  // kLease only: decide as if at least this much of the bucket were used
  // (its fill time), so that the `cost` slots taken lie at least this far
  // ahead of now (docs/distributed.md, "Leased limits").
  Duration lead;
};

// One request of a call, encoded: its keys and its arguments as RESP bulk
// strings, ready to be joined with other parts into one FCALL.
struct CallPart {
  std::string keys;
  std::string args;
  uint32_t key_count = 0;
  uint32_t arg_count = 0;
  // The decisions its answer holds: one per limit, none for a refund.
  uint32_t decisions = 0;
  // One limit at Redis' time ("d|c cost limit"): JoinParts sends a run of
  // such parts with the same arguments once, as "* g d|c cost limit".
  bool short_form = false;
  // A short part's limit (ParamsLimit), which its answer leaves out.
  int64_t limit = 0;
};

// The part deciding (or checking, or refunding) `args` over `keys`, the
// i-th limit with parameters `limits[i]` (LimitParams), in decision order
// (a leaky_bucket shape limit last, as Limiter does).
// REQUIRES: !keys.empty(), keys.size() == limits.size().
CallPart EncodePart(const ScriptArgs& args, std::span<const std::string_view> keys,
                    std::span<const std::string_view> limits);

// The FCALL that runs `parts` in order, as RESP. Consecutive short-form
// parts with the same arguments (one policy's requests) go as one run, whose
// arguments Redis reads once; the reply is the same, part by part.
// REQUIRES: !parts.empty().
std::string JoinParts(std::span<const CallPart* const> parts);
std::string JoinParts(std::span<const CallPart> parts);

struct ScriptResult {
  // The time the function decided at: Redis' clock, or ScriptArgs::now. A
  // caller keeps it to refund later (ScriptArgs::taken_at).
  Time now;
  // One per limit, in call order; empty for kRefund.
  std::vector<Decision> decisions;
};

// Decodes the reply to a call of `parts`: one result per part, in order (a
// short part answered by a nil has the answer of the short part before it;
// one answered by an odd integer is allowed with that answer's reset).
// A part that failed in Redis (a key of another type, a malformed state)
// is Internal with the function's message. An error reply to the whole call
// is a Status carrying Redis' message: LOADING / BUSY / MASTERDOWN /
// READONLY / TRYAGAIN / CLUSTERDOWN / MOVED / ASK / OOM are Unavailable (the
// server cannot run the function now), the rest (the function missing, a
// malformed call) Internal. A reply of the wrong shape is Internal.
absl::StatusOr<std::vector<absl::StatusOr<ScriptResult>>> ParseCallReply(
    const redisReply& reply, std::span<const CallPart* const> parts);
absl::StatusOr<std::vector<absl::StatusOr<ScriptResult>>> ParseCallReply(
    const redisReply& reply, std::span<const CallPart> parts);

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
