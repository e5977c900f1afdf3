// NotifySystemd: `sluice serve`'s lifecycle (server/lifecycle.h) told to
// systemd with sd_notify(3), for a `Type=notify` unit
// (packaging/sluice.service): READY=1 once every listener is bound,
// RELOADING=1 and READY=1 around a reload, STOPPING=1 when the drain begins,
// each with a STATUS= line for `systemctl status`. Outside systemd
// (NOTIFY_SOCKET unset) it does nothing.
//
// Thread-safety: safe from any thread.
//
//   sluice::server::Server::Create(source, {.lifecycle = sluice::cli::NotifySystemd});
#ifndef SLUICE_APPS_SLUICE_SYSTEMD_NOTIFY_H_
#define SLUICE_APPS_SLUICE_SYSTEMD_NOTIFY_H_

#include <string_view>

#include "server/lifecycle.h"

namespace sluice::cli {

void NotifySystemd(server::Lifecycle what, std::string_view status);

}  // namespace sluice::cli

#endif  // SLUICE_APPS_SLUICE_SYSTEMD_NOTIFY_H_
