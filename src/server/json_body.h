// A request body read as JSON, for the decision API, the lease and settle
// endpoints and POST /v1/sim.
#ifndef SLUICE_SERVER_JSON_BODY_H_
#define SLUICE_SERVER_JSON_BODY_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "nlohmann/json.hpp"

namespace sluice::server {

// `body` parsed; discarded (is_discarded()) when it is not JSON, and when an
// object in it names a member twice, whose name is then in `duplicate`:
// RFC 8259 leaves which of the two counts to each reader, so the caller
// that wrote it and sluice could read different ones.
inline nlohmann::json ParseJsonBody(std::string_view body, std::optional<std::string>& duplicate) {
  std::vector<absl::flat_hash_set<std::string>> names;  // one per open object
  nlohmann::json::parser_callback_t see = [&](int /*depth*/, nlohmann::json::parse_event_t event,
                                              nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) {
      names.emplace_back();
    } else if (event == Event::object_end) {
      names.pop_back();
    } else if (event == Event::key && !names.empty() &&
               !names.back().insert(parsed.get<std::string>()).second && !duplicate) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  nlohmann::json json = nlohmann::json::parse(body, see, /*allow_exceptions=*/false);
  if (duplicate) return nlohmann::json(nlohmann::json::value_t::discarded);
  return json;
}

}  // namespace sluice::server

#endif  // SLUICE_SERVER_JSON_BODY_H_
