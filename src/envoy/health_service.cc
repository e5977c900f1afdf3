#include "envoy/health_service.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"

namespace sluice::envoy {
namespace {

namespace health = ::grpc::health::v1;
using Status = health::HealthCheckResponse::ServingStatus;

class Health final : public HealthService {
 public:
  Health(std::function<bool()> ready, std::vector<std::string> names)
      : ready_(std::move(ready)), names_(std::move(names)) {
    ticker_ = std::thread([this] { Tick(); });
  }

  // After the server: its streams are done.
  ~Health() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    ticker_.join();
  }

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const health::HealthCheckRequest* request,
                                  health::HealthCheckResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (!Known(request->service())) {
      reactor->Finish(
          grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service: " + request->service()));
      return reactor;
    }
    response->set_status(Now());
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  void LookNow() override {
    {
      std::lock_guard lock(mu_);
      look_now_ = true;
    }
    wake_.notify_all();
  }

  grpc::ServerWriteReactor<health::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext*, const health::HealthCheckRequest* request) override {
    auto* watcher = new Watcher(*this, Known(request->service()));
    std::lock_guard lock(mu_);
    watchers_.insert(watcher);
    watcher->Send();
    return watcher;
  }

 private:
  static constexpr auto kLookEvery = std::chrono::seconds(1);

  // One Watch stream: the status at once, then each change, seen by the
  // ticker within kLookEvery. Its calls come on gRPC's threads; its state
  // is the service's mutex's.
  class Watcher final : public grpc::ServerWriteReactor<health::HealthCheckResponse> {
   public:
    Watcher(Health& service, bool known) : service_(service), known_(known) {}

    // Writes the status if it changed and no write is in flight. Under the
    // service's mutex.
    void Send() {
      const Status now = known_ ? service_.Now() : health::HealthCheckResponse::SERVICE_UNKNOWN;
      if (writing_ || finished_ || (sent_ && now == response_.status())) return;
      response_.set_status(now);
      sent_ = writing_ = true;
      StartWrite(&response_);
    }

    void OnWriteDone(bool ok) override {
      std::lock_guard lock(service_.mu_);
      writing_ = false;
      if (!ok) {
        // The stream is gone (a cancel, whose OnCancel may have finished it).
        if (!finished_) Finish(grpc::Status::CANCELLED);
        finished_ = true;
        return;
      }
      Send();  // a change seen while this write was in flight
    }

    void OnCancel() override {
      std::lock_guard lock(service_.mu_);
      if (!finished_) Finish(grpc::Status::CANCELLED);
      finished_ = true;
    }

    void OnDone() override {
      {
        std::lock_guard lock(service_.mu_);
        service_.watchers_.erase(this);
      }
      delete this;
    }

   private:
    Health& service_;
    const bool known_;
    health::HealthCheckResponse response_;
    bool sent_ = false;
    bool writing_ = false;
    bool finished_ = false;
  };

  bool Known(const std::string& name) const {
    return name.empty() || std::find(names_.begin(), names_.end(), name) != names_.end();
  }

  Status Now() const {
    return ready_() ? health::HealthCheckResponse::SERVING
                    : health::HealthCheckResponse::NOT_SERVING;
  }

  void Tick() {
    std::unique_lock lock(mu_);
    for (;;) {
      wake_.wait_for(lock, kLookEvery, [this] { return stopping_ || look_now_; });
      if (stopping_) return;
      look_now_ = false;
      for (Watcher* watcher : watchers_) watcher->Send();
    }
  }

  const std::function<bool()> ready_;
  const std::vector<std::string> names_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;                   // under mu_
  bool look_now_ = false;                   // under mu_
  absl::flat_hash_set<Watcher*> watchers_;  // under mu_
  std::thread ticker_;
};

}  // namespace

std::unique_ptr<HealthService> MakeHealthService(std::function<bool()> ready,
                                                 std::vector<std::string> names) {
  return std::make_unique<Health>(std::move(ready), std::move(names));
}

}  // namespace sluice::envoy
