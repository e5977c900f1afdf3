// Test support for the script tests: a redis-server per test suite and the
// few calls the tests make over hiredis' synchronous API.
#ifndef SLUICE_STORE_REDIS_SCRIPT_TEST_SUPPORT_H_
#define SLUICE_STORE_REDIS_SCRIPT_TEST_SUPPORT_H_

#include <hiredis/hiredis.h>

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"
#include "redis/redis_server.h"
#include "store/redis/script.h"

namespace sluice::redis {

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

inline std::string_view Text(const redisReply& r) { return {r.str, r.len}; }

// A suite's redis-server and one connection to it, with the function loaded;
// every test starts on an empty database.
class RedisTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<sluice::test::RedisServer>> server =
        sluice::test::RedisServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server).release();
    context_ = redisConnect("127.0.0.1", server_->port());
    ASSERT_TRUE(context_ != nullptr && context_->err == 0);
  }
  static void TearDownTestSuite() {
    if (context_ != nullptr) redisFree(context_);
    context_ = nullptr;
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(context_ != nullptr);
    ASSERT_EQ(Text(*Command({"FLUSHALL"})), "OK");
    Reply loaded = Command({"FUNCTION", "LOAD", "REPLACE", FunctionLibrary()});
    ASSERT_EQ(loaded->type, REDIS_REPLY_STRING) << Text(*loaded);
    ASSERT_EQ(Text(*loaded), FunctionName());
  }

  // Any command; never null (a lost connection fails the test).
  static Reply Command(std::initializer_list<std::string_view> args) {
    return Command(std::span<const std::string_view>(args.begin(), args.size()));
  }
  static Reply Command(std::span<const std::string_view> args) {
    std::vector<const char*> argv;
    std::vector<size_t> argvlen;
    for (std::string_view a : args) {
      argv.push_back(a.data());
      argvlen.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(context_, static_cast<int>(argv.size()), argv.data(), argvlen.data()));
    if (r == nullptr) {
      ADD_FAILURE() << "redis connection lost: " << context_->errstr;
      std::abort();
    }
    return Reply(r);
  }

  // Sends a command written in RESP; never null.
  static Reply Raw(const std::string& command) {
    redisAppendFormattedCommand(context_, command.data(), command.size());
    void* r = nullptr;
    if (redisGetReply(context_, &r) != REDIS_OK || r == nullptr) {
      ADD_FAILURE() << "redis connection lost: " << context_->errstr;
      std::abort();
    }
    return Reply(static_cast<redisReply*>(r));
  }

  // Runs the function once, one part over `keys`, each limit with its
  // LimitParams.
  static absl::StatusOr<ScriptResult> Run(const ScriptArgs& args,
                                          std::span<const std::string_view> keys,
                                          std::span<const std::string> params) {
    std::vector<std::string_view> limits(params.begin(), params.end());
    const CallPart part = EncodePart(args, keys, limits);
    Reply r = Raw(JoinParts({&part, 1}));
    absl::StatusOr<std::vector<absl::StatusOr<ScriptResult>>> results =
        ParseCallReply(*r, {&part, 1});
    if (!results.ok()) return results.status();
    return std::move(results->front());
  }

  static inline sluice::test::RedisServer* server_ = nullptr;
  static inline redisContext* context_ = nullptr;
};

}  // namespace sluice::redis

#endif  // SLUICE_STORE_REDIS_SCRIPT_TEST_SUPPORT_H_
