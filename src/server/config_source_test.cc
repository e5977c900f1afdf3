#include "server/config_source.h"

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <mutex>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice::server {
namespace {

using ::testing::HasSubstr;

constexpr std::string_view kOne = R"yaml(policies:
  - name: one
    limits: [{algorithm: fixed_window, rate: 1/s}]
)yaml";
constexpr std::string_view kTwo = R"yaml(policies:
  - name: one
    limits: [{algorithm: fixed_window, rate: 1/s}]
  - name: two
    limits: [{algorithm: fixed_window, rate: 2/s}]
)yaml";

class ConfigSourceTest : public ::testing::Test {
 protected:
  void Write(std::string_view text) { std::ofstream(path_, std::ios::trunc) << text; }
  void TearDown() override { ::unlink(path_.c_str()); }

  // Subscribes, starts, and records the policies of every config applied.
  void Start(ConfigSource& source, absl::Status answer = absl::OkStatus()) {
    source.Subscribe([this, answer](const Config& next) {
      std::lock_guard lock(mu_);
      applied_.push_back(next.policies.size());
      return answer;
    });
    source.Start(metrics_);
  }
  // Waits (up to 5 s) until `n` configs were applied.
  bool WaitFor(size_t n) {
    for (int i = 0; i < 500; ++i) {
      {
        std::lock_guard lock(mu_);
        if (applied_.size() >= n) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  int64_t Reloads(const char* result) {
    return metrics_.Get("sluice_config_reloads_total", {{"result", result}})->value();
  }

  std::string path_ =
      ::testing::TempDir() + "config_source_test_" + std::to_string(::getpid()) + ".yaml";
  metrics::Metrics metrics_;
  std::mutex mu_;
  std::vector<size_t> applied_;
};

TEST_F(ConfigSourceTest, ReadsTheFileOnceAtOpen) {
  Write(kOne);
  absl::StatusOr<std::unique_ptr<ConfigSource>> source = ConfigSource::Open(path_);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->initial().policies.size(), 1u);
  EXPECT_EQ((*source)->path(), path_);
}

TEST_F(ConfigSourceTest, AnInvalidFileIsRefusedWithItsLine) {
  Write("policies:\n  - name: one\n    limits: [{algorithm: nope, rate: 1/s}]\n");
  absl::StatusOr<std::unique_ptr<ConfigSource>> source = ConfigSource::Open(path_);
  ASSERT_FALSE(source.ok());
  EXPECT_THAT(source.status().message(), HasSubstr(":3"));
}

TEST_F(ConfigSourceTest, AReloadAskedForHandsTheNewConfigToTheSubscriber) {
  Write(kOne);
  auto source = ConfigSource::Open(path_);
  ASSERT_TRUE(source.ok());
  Start(**source);
  // Same size, same second: only the request can tell it changed.
  Write(kTwo);
  (*source)->Reload("test");
  ASSERT_TRUE(WaitFor(1));
  (*source)->Stop();
  EXPECT_EQ(applied_.back(), 2u);
  EXPECT_GE(Reloads("success"), 1);
}

TEST_F(ConfigSourceTest, AChangedFileIsLoadedOnceItHoldsStill) {
  Write(kOne);
  auto source = ConfigSource::Open(path_);
  ASSERT_TRUE(source.ok());
  Start(**source);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  Write(kTwo);  // another size: the watcher sees it
  ASSERT_TRUE(WaitFor(1));
  (*source)->Stop();
  EXPECT_EQ(applied_, std::vector<size_t>{2});
}

TEST_F(ConfigSourceTest, AChangeReloadedOnRequestIsNotLoadedAgainByTheWatcher) {
  Write(kOne);
  auto source = ConfigSource::Open(path_);
  ASSERT_TRUE(source.ok());
  Start(**source);
  Write(kTwo);  // another size: the watcher would see it
  (*source)->Reload("test");
  ASSERT_TRUE(WaitFor(1));
  // Four polls: the watcher would have loaded the change by now.
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  (*source)->Stop();
  EXPECT_EQ(applied_, std::vector<size_t>{2});
  EXPECT_EQ(Reloads("success"), 1);
}

TEST_F(ConfigSourceTest, AnInvalidOrRefusedConfigChangesNothingAndIsCounted) {
  Write(kOne);
  auto source = ConfigSource::Open(path_);
  ASSERT_TRUE(source.ok());
  Start(**source, absl::FailedPreconditionError("refused"));
  Write("policies: [");
  (*source)->Reload("test");
  Write("");  // empty: refused on reload
  (*source)->Reload("test");
  Write(kTwo);  // valid, but the subscriber refuses it
  (*source)->Reload("test");
  for (int i = 0; i < 500 && Reloads("failure") < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  (*source)->Stop();
  EXPECT_EQ(Reloads("success"), 0);
  EXPECT_GE(Reloads("failure"), 3);
}

}  // namespace
}  // namespace sluice::server
