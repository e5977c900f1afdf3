// Fuzz target: the body of POST /v1/check, as server.cc's Check reads it.
// The flat fast path (ParseFlatCheck); else the nesting bound
// (JsonDepthWithin) before nlohmann::json builds a tree, then each check's
// fields (an object, or an array of up to 1000 objects: policy, key, cost)
// and a decision by the named policy of a fixed config (server_fixture.h).
// A bad single check's error object is read back as JSON, as the server does.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "server_fixture.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sluice::fuzz::DecideCheckBody(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
