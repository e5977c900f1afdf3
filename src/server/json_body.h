// A request body read as JSON, for the decision API, the lease and settle
// endpoints and POST /v1/sim; and the methods a gateway request's body
// names (BodyMethods).
#ifndef SLUICE_SERVER_JSON_BODY_H_
#define SLUICE_SERVER_JSON_BODY_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "base/ascii.h"
#include "nlohmann/json.hpp"
#include "policy/policy_set.h"

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

// The methods a POST's body names in `_method` (RequestFacts::body_methods),
// `content_type` its Content-Type (nullopt: none): its form fields as Rack
// and PHP read a form (policy::FormMethods); and where the whole field
// holds "/json" or "+json" (Laravel then reads the body as JSON), a JSON
// body's top-level `_method` strings, every one where the name comes twice
// (PHP keeps the last). A body read both ways (a form type that names
// "/json" in a parameter) counts both readings.
inline absl::InlinedVector<std::string, 2> BodyMethods(std::optional<std::string_view> content_type,
                                                       std::string_view body) {
  absl::InlinedVector<std::string, 2> methods = policy::FormMethods(content_type, body);
  const std::string type = internal::AsciiLower(content_type.value_or(std::string_view()));
  if (type.find("/json") == std::string::npos && type.find("+json") == std::string::npos) {
    return methods;
  }
  int open = 0;               // containers open
  bool top_object = false;    // the outermost is an object
  bool method_value = false;  // the value to come is the outermost object's `_method`
  nlohmann::json::parser_callback_t see = [&](int /*depth*/, nlohmann::json::parse_event_t event,
                                              nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        if (open++ == 0) top_object = event == Event::object_start;
        return true;
      case Event::object_end:
      case Event::array_end:
        method_value = false;
        return --open == 0;  // what is inside is dropped as it ends
      case Event::key:
        method_value = open == 1 && top_object && parsed == "_method";
        return true;
      case Event::value:
        if (method_value && open == 1 && parsed.is_string() && methods.size() < 16) {
          methods.push_back(parsed.get<std::string>());
        }
        method_value = false;
        return false;  // kept nowhere: only the methods are wanted
    }
    return false;
  };
  (void)nlohmann::json::parse(body, see, /*allow_exceptions=*/false);
  return methods;
}

}  // namespace sluice::server

#endif  // SLUICE_SERVER_JSON_BODY_H_
