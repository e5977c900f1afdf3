// Fuzz target: what a Redis server sends back, read as the Redis client
// reads it (hiredis' reader: redisReaderFeed, then redisReaderGetReply until
// no whole reply is left; CreateReader says how this reader differs), and
// every reply decoded as the Redis store decodes the answer to its
// function (redis::ParseCallReply, for a part of one limit, a refund, as
// many one-limit parts as the reply's length suggests in the long form and
// in the short one, and a mix), then
// merged as the limiter merges one part's decisions (redis::MergeDecisions).
#include <hiredis/hiredis.h>
#include <hiredis/read.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "store/redis/script.h"

namespace {

// hiredis allocates an array's table of elements when it reads the array's
// header, before any element arrives: "*999999999" asks for 8 GB at once.
// In the Redis client that allocation fails (the reply is a protocol error)
// or reserves memory the reply never fills; libFuzzer reports it as running
// out of memory, about a reply no Redis server sends. So this reader
// refuses arrays of more than kMaxElements elements, as a failed
// allocation. (hiredis 0.14 has no such bound of its own; 1.x has
// maxelements.)
constexpr int kMaxElements = 1 << 16;
const redisReplyObjectFunctions* hiredis_functions = nullptr;

void* CreateArray(const redisReadTask* task, int elements) {
  if (elements > kMaxElements) return nullptr;
  return hiredis_functions->createArray(task, elements);
}

// hiredis' reader with its own reply objects, but for CreateArray.
redisReader* CreateReader() {
  static redisReplyObjectFunctions functions = [] {
    redisReader* r = redisReaderCreate();
    hiredis_functions = r->fn;
    redisReplyObjectFunctions f = *r->fn;
    redisReaderFree(r);
    f.createArray = CreateArray;
    return f;
  }();
  return redisReaderCreateWithFunctions(&functions);
}

struct ReaderDeleter {
  void operator()(redisReader* r) const { redisReaderFree(r); }
};
struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};

// Parts of a call, as many limits each as `limits` says (0: a refund).
std::vector<sluice::redis::CallPart> Parts(std::initializer_list<size_t> limits, size_t repeat) {
  static const std::string_view keys[] = {"{f}:a", "{f}:b", "{f}:c"};
  static const std::string_view params[] = {"fw 1 1", "fw 1 1", "fw 1 1"};
  std::vector<sluice::redis::CallPart> out;
  for (size_t r = 0; r < repeat; ++r) {
    for (size_t n : limits) {
      const sluice::redis::ScriptOp op =
          n == 0 ? sluice::redis::ScriptOp::kRefund : sluice::redis::ScriptOp::kDecide;
      const size_t k = n == 0 ? 1 : n;
      out.push_back(
          sluice::redis::EncodePart({.op = op}, std::span(keys, k), std::span(params, k)));
    }
  }
  return out;
}

void Decode(const redisReply& reply, const std::vector<sluice::redis::CallPart>& parts) {
  auto results = sluice::redis::ParseCallReply(reply, parts);
  if (!results.ok()) return;
  if (results->size() != parts.size()) __builtin_trap();
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto& r = (*results)[i];
    if (!r.ok()) continue;
    if (r->decisions.size() != parts[i].decisions) __builtin_trap();
    if (!r->decisions.empty()) (void)sluice::redis::MergeDecisions(r->decisions);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<redisReader, ReaderDeleter> reader(CreateReader());
  const char* bytes = reinterpret_cast<const char*>(data);
  if (redisReaderFeed(reader.get(), bytes, size) != REDIS_OK) return 0;
  for (;;) {
    void* raw = nullptr;
    if (redisReaderGetReply(reader.get(), &raw) != REDIS_OK) return 0;  // a protocol error
    if (raw == nullptr) return 0;                                       // no whole reply left
    const std::unique_ptr<redisReply, ReplyDeleter> reply(static_cast<redisReply*>(raw));
    Decode(*reply, Parts({1}, 1));
    Decode(*reply, Parts({0}, 1));
    Decode(*reply, Parts({2, 0, 3}, 1));
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements > 7) {
      Decode(*reply, Parts({1}, std::min<size_t>(reply->elements / 7, 64)));
    }
    // Short parts: four integers each, or one nil repeating the answer
    // before it (one answer, then nils, then the call's time).
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements > 5) {
      Decode(*reply, Parts({1}, std::min<size_t>(reply->elements / 4, 64)));
      Decode(*reply, Parts({1}, std::min<size_t>(reply->elements - 4, 64)));
    }
  }
}
