// RedisServer does what the tests that use it rely on: a server that
// answers, goes silent when paused, dies when killed and comes back on the
// same port, empty.
#include "redis/redis_server.h"

#include <hiredis/hiredis.h>

#include <string>

#include "gtest/gtest.h"

namespace sluice::test {
namespace {

// The reply to `command` as text ("PONG", "OK", the value), or "" when the
// server does not answer within 200 ms.
std::string Ask(int port, const char* command) {
  const timeval timeout{0, 200'000};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, timeout);
  std::string text;
  if (c != nullptr && c->err == 0 && redisSetTimeout(c, timeout) == REDIS_OK) {
    auto* reply = static_cast<redisReply*>(redisCommand(c, command));
    if (reply != nullptr) {
      if (reply->str != nullptr) text.assign(reply->str, reply->len);
      freeReplyObject(reply);
    }
  }
  if (c != nullptr) redisFree(c);
  return text;
}

TEST(RedisServerTest, AnswersPausesResumesDiesAndRestartsEmptyOnTheSamePort) {
  absl::StatusOr<std::unique_ptr<RedisServer>> server = RedisServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  RedisServer& redis = **server;
  const int port = redis.port();
  EXPECT_GT(redis.pid(), 0);
  EXPECT_EQ(Ask(port, "SET k v"), "OK");

  ASSERT_TRUE(redis.Pause().ok());
  EXPECT_EQ(Ask(port, "PING"), "");
  ASSERT_TRUE(redis.Resume().ok());
  EXPECT_EQ(Ask(port, "GET k"), "v");

  ASSERT_TRUE(redis.Kill().ok());
  EXPECT_EQ(redis.pid(), 0);
  EXPECT_EQ(Ask(port, "PING"), "");
  EXPECT_FALSE(redis.Kill().ok());  // nothing left to kill

  ASSERT_TRUE(redis.Restart().ok());
  EXPECT_EQ(redis.port(), port);
  EXPECT_EQ(Ask(port, "PING"), "PONG");
  EXPECT_EQ(Ask(port, "GET k"), "");  // no persistence: the data died with it
}

TEST(RedisServerTest, AMissingBinaryIsAnError) {
  absl::StatusOr<std::unique_ptr<RedisServer>> server =
      RedisServer::Start({.binary = "redis-server-that-does-not-exist"});
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace sluice::test
