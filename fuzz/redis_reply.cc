// Fuzz target: what a Redis server sends back, read as the Redis client
// reads it (hiredis' reader: redisReaderFeed, then redisReaderGetReply until
// no whole reply is left; CreateReader says how this reader differs), and
// every reply decoded as the Redis store decodes the answer to its script
// (redis::ParseScriptReply, for no limit, one limit and as many as the
// reply's length suggests), then merged as the limiter merges one call's
// decisions (redis::MergeDecisions).
#include <hiredis/hiredis.h>
#include <hiredis/read.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

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

void Decode(const redisReply& reply, size_t limits) {
  absl::StatusOr<sluice::redis::ScriptResult> r = sluice::redis::ParseScriptReply(reply, limits);
  if (!r.ok()) {
    (void)sluice::redis::IsNoScript(r.status());
    return;
  }
  if (r->decisions.size() != limits) __builtin_trap();
  if (!r->decisions.empty()) (void)sluice::redis::MergeDecisions(r->decisions);
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
    Decode(*reply, 0);
    Decode(*reply, 1);
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements > 1) {
      Decode(*reply, (reply->elements - 1) / 6);
    }
  }
}
