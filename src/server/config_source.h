// ConfigSource: where `sluice serve` gets its config. It reads and validates
// the file once at start, then, on its own thread, re-reads it on request
// (SIGHUP) and when the file changes, and hands every new valid config to its
// subscriber, which builds what it needs (policies, Envoy rules) and swaps it
// in, or refuses it. A refused or invalid file changes nothing: the config in
// force stays.
//
// The file is watched by polling its stamp (mtime, size) every 250 ms; a
// change is loaded once the stamp has held still for one poll, so a file
// caught halfway through an editor's rewrite is not read. An empty file is
// refused. A reload asked for (SIGHUP) counts as having read the file: the
// watcher does not load the same change again. Reloads run one at a time, off
// the event loops.
//
// Thread-safety: Reload and Stop from any thread; the rest from one.
//
//   auto source = ConfigSource::Open("sluice.yaml");
//   source->Subscribe([&](const Config& next) { return Apply(next); });
//   source->Start(metrics);
//   ...  source->Reload("SIGHUP");
//   source->Stop();
#ifndef SLUICE_SERVER_CONFIG_SOURCE_H_
#define SLUICE_SERVER_CONFIG_SOURCE_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "metrics/metrics.h"
#include "server/lifecycle.h"
#include "sluice/config.h"

namespace sluice::server {

class ConfigSource {
 public:
  // Reads and validates `path`. Errors: the file's, with file:line.
  static absl::StatusOr<std::unique_ptr<ConfigSource>> Open(std::string path);
  ~ConfigSource() { Stop(); }

  // The config read by Open.
  const Config& initial() const { return initial_; }
  const std::string& path() const { return path_; }

  // `apply` gets every new valid config; an error it returns fails the
  // reload (logged and counted). Set before Start.
  void Subscribe(std::function<absl::Status(const Config&)> apply) { apply_ = std::move(apply); }
  // `hook` is told kReloading when a reload begins and kReady when it ends,
  // whatever its result. Set before Start.
  void OnLifecycle(LifecycleHook hook) { lifecycle_ = std::move(hook); }
  // Starts the source's thread: watching, and the reloads asked for.
  // Counts reloads in sluice_config_reloads_total{result}.
  void Start(metrics::Metrics& metrics);
  // Asks for a reload, `why` naming the trigger in the log; returns at once.
  void Reload(std::string_view why);
  // Stops watching; a reload under way finishes first.
  void Stop();

  // When the config in force was read, and why the last reload failed if
  // it did (cleared by the next one that succeeds), for the admin listener.
  struct History {
    int64_t loaded_at_unix_ms = 0;
    int64_t failed_at_unix_ms = 0;
    std::string last_error;  // empty: the last reload succeeded, or none failed
    int64_t reloads_ok = 0;
    int64_t reloads_failed = 0;
  };
  History history() const;

 private:
  ConfigSource(std::string path, Config initial)
      : path_(std::move(path)), initial_(std::move(initial)) {}
  using Stamp = std::pair<int64_t, int64_t>;  // mtime (ns), size
  void Loop();
  void Load(const std::string& why);

  const std::string path_;
  const Config initial_;
  Stamp stamp_{0, 0};  // as Open saw it, before reading
  std::function<absl::Status(const Config&)> apply_;
  LifecycleHook lifecycle_;
  metrics::Counter* reloads_ok_ = nullptr;
  metrics::Counter* reloads_failed_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  History history_;                 // guarded by mu_
  std::vector<std::string> asked_;  // reloads asked for, by trigger
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace sluice::server

#endif  // SLUICE_SERVER_CONFIG_SOURCE_H_
