#include "envoy/health_service.h"

#include <algorithm>
#include <utility>

namespace sluice::envoy {
namespace {

namespace health = ::grpc::health::v1;

class HealthService final : public health::Health::CallbackService {
 public:
  HealthService(std::function<bool()> ready, std::vector<std::string> names)
      : ready_(std::move(ready)), names_(std::move(names)) {}

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const health::HealthCheckRequest* request,
                                  health::HealthCheckResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    const std::string& name = request->service();
    if (!name.empty() && std::find(names_.begin(), names_.end(), name) == names_.end()) {
      reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service: " + name));
      return reactor;
    }
    response->set_status(ready_() ? health::HealthCheckResponse::SERVING
                                  : health::HealthCheckResponse::NOT_SERVING);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  const std::function<bool()> ready_;
  const std::vector<std::string> names_;
};

}  // namespace

std::unique_ptr<health::Health::CallbackService> MakeHealthService(std::function<bool()> ready,
                                                                   std::vector<std::string> names) {
  return std::make_unique<HealthService>(std::move(ready), std::move(names));
}

}  // namespace sluice::envoy
