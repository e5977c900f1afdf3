// The decision API: POST /v1/check (docs/api.md). A body is one check
// `{"policy": ..., "key": ..., "cost": ...}` or a batch (an array of up to
// 1000); each check names its policy and key, and the policy decides it
// through policy::Evaluate like every other front end.
//
// The reading and writing are pure functions, free of Beast and Asio, so the
// HTTP fuzz targets run the same code; Check is the coroutine the server
// calls with them.
#ifndef SLUICE_SERVER_CHECK_API_H_
#define SLUICE_SERVER_CHECK_API_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "policy/evaluation.h"
#include "policy/policy_set.h"

namespace sluice::server {

// One check, its fields read.
struct CheckItem {
  std::string policy;
  std::string key;
  int64_t cost = 1;
  // "settle": true: an admitted check's cost is a reservation, settled
  // later by POST /v1/settle (docs/settled-costs.md).
  bool settle = false;
};

// Why a check (or a whole body) cannot be decided.
struct CheckError {
  int status = 400;
  std::string title;
  std::string detail;
};

// A body's checks, each read or refused; `batch` when the body is an array.
struct CheckBody {
  bool batch = false;
  std::vector<std::variant<CheckItem, CheckError>> checks;
};

// Reads a POST /v1/check body. A CheckError when the body as a whole is bad
// (not JSON, nested too deep, a batch too long).
std::variant<CheckBody, CheckError> ReadCheckBody(std::string_view body);

// What Evaluate decides for `item` (its policy in `set`, its key and cost),
// or why it cannot be decided (an unknown policy, an empty key).
std::variant<policy::Applied, CheckError> PrepareCheck(const policy::PolicySet& set,
                                                       const CheckItem& item);

// The JSON object answering a decided check; the check's status is 200, or
// 429 when !verdict.allowed.
std::string CheckJson(std::string_view policy, const policy::Verdict& verdict);
// The JSON object a batch answers in place of a check that was refused.
std::string CheckErrorJson(const CheckError& error);

}  // namespace sluice::server

#endif  // SLUICE_SERVER_CHECK_API_H_
