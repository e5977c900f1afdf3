#include "systemd_notify.h"

#include <systemd/sd-daemon.h>

#include <ctime>
#include <string>

namespace sluice::cli {

void NotifySystemd(server::Lifecycle what, std::string_view status) {
  std::string message;
  switch (what) {
    case server::Lifecycle::kReady:
      message = "READY=1";
      break;
    case server::Lifecycle::kReloading: {
      // systemd 253 and later (Type=notify-reload) want the time the reload
      // began on CLOCK_MONOTONIC beside RELOADING=1; 252 ignores it.
      timespec now{};
      clock_gettime(CLOCK_MONOTONIC, &now);
      message = "RELOADING=1\nMONOTONIC_USEC=" +
                std::to_string(static_cast<long long>(now.tv_sec) * 1'000'000 + now.tv_nsec / 1000);
      break;
    }
    case server::Lifecycle::kStopping:
      message = "STOPPING=1";
      break;
  }
  // One line: a newline would start another field.
  message += "\nSTATUS=";
  for (const char c : status) message += c == '\n' ? ' ' : c;
  // The answer is not checked: systemd gone or not listening changes
  // nothing for the server.
  sd_notify(/*unset_environment=*/0, message.c_str());
}

}  // namespace sluice::cli
