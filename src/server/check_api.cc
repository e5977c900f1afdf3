#include "server/check_api.h"

#include <algorithm>

#include "base/cat.h"
#include "policy/headers.h"
#include "policy/request_text.h"
#include "server/json_body.h"

namespace sluice::server {
namespace {

using internal::Append;
using internal::Cat;

constexpr size_t kMaxBatch = 1000;

CheckError Bad(std::string detail) { return {400, "bad request", std::move(detail)}; }

// One check of a JSON body.
std::variant<CheckItem, CheckError> ReadCheck(const nlohmann::json& item) {
  if (!item.is_object()) return Bad("each check must be a JSON object");
  for (const auto& [k, v] : item.items()) {
    if (k != "policy" && k != "key" && k != "cost" && k != "settle") {
      return Bad(Cat("unknown field \"", k, "\" (expected policy, key, cost, settle)"));
    }
  }
  const auto policy = item.find("policy");
  if (policy == item.end() || !policy->is_string()) return Bad("\"policy\" (a string) is required");
  const auto key = item.find("key");
  if (key == item.end() || !key->is_string()) return Bad("\"key\" (a string) is required");
  CheckItem out{.policy = policy->get<std::string>(), .key = key->get<std::string>()};
  if (const auto c = item.find("cost"); c != item.end()) {
    if (!c->is_number_integer()) return Bad("\"cost\" must be a whole number");
    if (c->is_number_unsigned() ? c->get<uint64_t>() > static_cast<uint64_t>(kMaxLimit)
                                : c->get<int64_t>() > kMaxLimit) {
      return Bad(Cat("\"cost\" must be at most ", kMaxLimit));
    }
    out.cost = c->get<int64_t>();
    if (out.cost < 0) return Bad("\"cost\" must not be negative");
  }
  if (const auto s = item.find("settle"); s != item.end()) {
    if (!s->is_boolean()) return Bad("\"settle\" must be true or false");
    out.settle = s->get<bool>();
  }
  return out;
}

}  // namespace

std::variant<CheckBody, CheckError> ReadCheckBody(std::string_view body) {
  CheckBody out;
  if (std::optional<policy::FlatCheck> flat = policy::ParseFlatCheck(body)) {
    // The common shape, read without building a JSON tree.
    out.checks.emplace_back(
        CheckItem{std::string(flat->policy), std::string(flat->key), flat->cost});
    return out;
  }
  if (!policy::JsonDepthWithin(body, policy::kMaxJsonDepth)) {
    return Bad(Cat("the body nests arrays and objects deeper than ", policy::kMaxJsonDepth,
                   " levels; a check is an object, a batch an array of them"));
  }
  std::optional<std::string> twice;
  const nlohmann::json json = ParseJsonBody(body, twice);
  if (twice) return Bad(Cat("the body names \"", *twice, "\" twice in one object"));
  if (json.is_discarded()) return Bad("the body is not valid JSON");
  if (!json.is_array()) {
    out.checks.push_back(ReadCheck(json));
    return out;
  }
  if (json.size() > kMaxBatch) return Bad(Cat("a batch holds at most ", kMaxBatch, " checks"));
  out.batch = true;
  out.checks.reserve(json.size());
  for (const nlohmann::json& item : json) out.checks.push_back(ReadCheck(item));
  return out;
}

std::variant<policy::Applied, CheckError> PrepareCheck(const policy::PolicySet& set,
                                                       const CheckItem& item) {
  const policy::Policy* policy = set.Find(item.policy);
  if (policy == nullptr) {
    return CheckError{404, "unknown policy", Cat("no policy named \"", item.policy, "\"")};
  }
  if (item.key.empty()) return Bad("\"key\" must not be empty");
  // The decision API names the key itself; the policy's key parts are for
  // the gateway and auth_request. A key over 1024 bytes is the policy's
  // long_keys to decide (hashed, or refused: an error of the verdict).
  return policy::Applied{.policy = policy, .key = item.key, .cost = item.cost};
}

std::string CheckJson(std::string_view policy, const policy::Verdict& verdict) {
  const PolicyDecision& d = verdict.answers[0].decision;
  std::string out;
  out.reserve(192 + policy.size());  // the whole answer in one allocation
  Append(out, "{\"allowed\":", verdict.allowed ? "true" : "false", ",\"policy\":");
  policy::AppendJsonString(out, policy);
  Append(out, ",\"limit\":", d.limit, ",\"remaining\":", d.remaining,
         ",\"reset_after_ms\":", d.reset_after.CeilMillis(), ",\"retry_after_ms\":");
  if (d.can_never_pass()) {
    out += "null";
  } else {
    Append(out, d.retry_after.CeilMillis());
  }
  Append(out, ",\"delay_ms\":", d.delay.CeilMillis());
  if (!verdict.shadow_denied.empty()) out += ",\"shadow_denied\":true";
  if (d.can_never_pass()) out += ",\"never\":true";
  out.push_back('}');
  return out;
}

std::string CheckErrorJson(const CheckError& error) {
  std::string out = "{\"error\":";
  policy::AppendJsonString(out, error.title);
  out += ",\"detail\":";
  policy::AppendJsonString(out, error.detail);
  out += Cat(",\"status\":", error.status, "}");
  return out;
}

}  // namespace sluice::server
