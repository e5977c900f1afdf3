// Lifecycle: what `sluice serve` tells whoever supervises it, as it happens.
// The server layer knows nothing of any supervisor: apps/sluice turns these
// into systemd's sd_notify messages (READY=1, RELOADING=1, STOPPING=1), so
// only the binary links libsystemd.
//
//   kReady      every listener is bound and the loops are about to serve;
//               again after each reload, whether it succeeded or not (the
//               config in force serves either way)
//   kReloading  a reload (SIGHUP, a changed file) has begun
//   kStopping   the drain has begun (SIGTERM, SIGINT, Stop); nothing is
//               told after it
//
// `status` is one line for the supervisor's status display, e.g. "serving:
// 3 policies, listen 127.0.0.1:8080, admin 127.0.0.1:9090".
//
// Thread-safety: a hook is called from the thread where the change happens
// (the first event loop, the config source's thread), one call at a time;
// it must return quickly.
#ifndef SLUICE_SERVER_LIFECYCLE_H_
#define SLUICE_SERVER_LIFECYCLE_H_

#include <functional>
#include <string_view>

namespace sluice::server {

enum class Lifecycle { kReady, kReloading, kStopping };

using LifecycleHook = std::function<void(Lifecycle, std::string_view status)>;

}  // namespace sluice::server

#endif  // SLUICE_SERVER_LIFECYCLE_H_
