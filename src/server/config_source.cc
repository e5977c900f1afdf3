#include "server/config_source.h"

#include <sys/stat.h>

#include <chrono>
#include <optional>

#include "base/cat.h"
#include "spdlog/spdlog.h"

namespace sluice::server {

namespace {

// The file's mtime (ns) and size; zeros when it cannot be read.
std::pair<int64_t, int64_t> StampOf(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return {0, 0};
  return {static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
          static_cast<int64_t>(st.st_size)};
}

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ConfigSource>> ConfigSource::Open(std::string path) {
  // Taken before the file is read, so a change written from here on is seen
  // by the watcher.
  const Stamp stamp = StampOf(path);
  absl::StatusOr<Config> config = LoadConfigFile(path);
  if (!config.ok()) return config.status();
  std::unique_ptr<ConfigSource> source(new ConfigSource(std::move(path), *std::move(config)));
  source->stamp_ = stamp;
  source->history_.loaded_at_unix_ms = UnixMillis();
  return source;
}

void ConfigSource::Start(metrics::Metrics& metrics) {
  reloads_ok_ = metrics.Get("sluice_config_reloads_total", {{"result", "success"}});
  reloads_failed_ = metrics.Get("sluice_config_reloads_total", {{"result", "failure"}});
  metrics.SetHelp("sluice_config_reloads_total", "Config reloads, by result.");
  thread_ = std::thread([this] { Loop(); });
}

void ConfigSource::Reload(std::string_view why) {
  {
    std::lock_guard lock(mu_);
    asked_.emplace_back(why);
  }
  wake_.notify_one();
}

ConfigSource::History ConfigSource::history() const {
  std::lock_guard lock(mu_);
  History h = history_;
  if (reloads_ok_ != nullptr) h.reloads_ok = reloads_ok_->value();
  if (reloads_failed_ != nullptr) h.reloads_failed = reloads_failed_->value();
  return h;
}

void ConfigSource::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void ConfigSource::Loop() {
  Stamp last = stamp_;
  std::optional<Stamp> changed;  // seen at the previous poll
  std::unique_lock lock(mu_);
  while (!stopping_) {
    wake_.wait_for(lock, std::chrono::milliseconds(250),
                   [this] { return stopping_ || !asked_.empty(); });
    if (stopping_) break;
    std::vector<std::string> asked = std::move(asked_);
    asked_.clear();
    lock.unlock();
    if (!asked.empty()) {
      // A reload asked for reads the file as it is now: the watcher must not
      // load the same change a second time. The stamp is taken before the
      // read, so a write during it is still seen.
      last = StampOf(path_);
      changed.reset();
      for (const std::string& why : asked) Load(why);
    }
    const Stamp now = StampOf(path_);
    if (now == last || now.first == 0) {
      changed.reset();
    } else if (changed == now) {
      last = now;
      changed.reset();
      Load("file-change");
    } else {
      changed = now;
    }
    lock.lock();
  }
}

void ConfigSource::Load(const std::string& why) {
  if (lifecycle_) {
    lifecycle_(Lifecycle::kReloading, internal::Cat("reloading the config (", why, ")"));
  }
  absl::StatusOr<Config> next = LoadConfigFile(path_, {.allow_empty = false});
  absl::Status status = next.status();
  if (next.ok()) {
    for (const std::string& line : ConfigWarnings(*next)) {
      spdlog::warn("event=reload note=\"{}\"", line);
    }
    status = apply_ ? apply_(*next) : absl::OkStatus();
  }
  {
    std::lock_guard lock(mu_);
    if (status.ok()) {
      history_.loaded_at_unix_ms = UnixMillis();
      history_.last_error.clear();
    } else {
      history_.failed_at_unix_ms = UnixMillis();
      history_.last_error = std::string(status.message());
    }
  }
  if (!status.ok()) {
    reloads_failed_->Add();
    spdlog::error("event=reload result=failure trigger={} error=\"{}\"", why,
                  std::string(status.message()));
    if (lifecycle_) {
      lifecycle_(Lifecycle::kReady, internal::Cat("serving the config in force; reload (", why,
                                                  ") failed: ", status.message()));
    }
    return;
  }
  reloads_ok_->Add();
  spdlog::info("event=reload result=success trigger={} policies={}", why, next->policies.size());
  if (lifecycle_) {
    lifecycle_(Lifecycle::kReady, internal::Cat("serving: config reloaded (", why, "), ",
                                                next->policies.size(), " policies"));
  }
}

}  // namespace sluice::server
