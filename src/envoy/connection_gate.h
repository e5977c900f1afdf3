// ConnectionGate: the listener of grpc.listen. Internal to the Envoy rate
// limit service. It accepts the connections itself and hands them to gRPC
// one by one (grpc::AddInsecureChannelFromFd).
//
// Why not gRPC's own listener: gRPC 1.51 accepts every connection offered
// and has no cap on their number (grpc.max_allowed_incoming_connections
// came in a later release); one that never sends a byte is kept for its
// handshake timeout, 120 s by default. Each holds a file descriptor, shared
// with the HTTP and admin listeners, so a few hundred idle TCP connections
// used to leave the whole process unable to accept anything. The gate
// refuses connections beyond max_connections at once, closes those that
// send nothing within handshake_timeout, and hands the others to gRPC,
// whose channel arguments then close idle and old ones (rls_server.cc).
//
// gRPC does not say when it closes a connection, so the gate looks: it
// keeps each descriptor it handed over with its socket's inode, and one
// that is closed, or now names another file, is gone. It looks every
// second, and when a new connection finds the gate full (at most every
// 100 ms, so a flood of refused connections costs a bounded amount of
// work): a slot gRPC freed is seen within that time.
//
// With TLS (Options::tls), the gate is the TLS end: a connection that sent
// its first bytes goes to one of its relay threads (Options::relay_threads,
// in turn), which makes the handshake (within handshake_timeout of the
// accept, as the first bytes), then hands gRPC one end of a socket pair and
// relays between it and the client's connection, decrypting what comes in
// and encrypting what goes out.
// gRPC 1.51 takes a descriptor only for plaintext
// (grpc_server_add_channel_from_fd "currently only supports insecure server
// credentials"); its own TLS listener would bring back the unbounded
// accepts above. A relayed connection ends when either side closes: the
// client's close reaches gRPC as the pair's end of stream, gRPC's (idle,
// too old, shut down) reaches the client as close_notify.
//
// Thread-safety: Listen, Start, Close and Stop from one thread, SetTls from
// any; the gate's own thread (Start runs it, Stop ends it) accepts, and the
// relay threads do the rest; `hand_off` is called from any of them.
#ifndef SLUICE_ENVOY_CONNECTION_GATE_H_
#define SLUICE_ENVOY_CONNECTION_GATE_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "metrics/metrics.h"
#include "sluice/config.h"
#include "sluice/time.h"
#include "tls/context.h"

namespace sluice::envoy {

class ConnectionGate {
 public:
  struct Options {
    int64_t max_connections = 1;
    Duration handshake_timeout;
    // Non-null: TLS on every connection, with this context (HTTP/2 by
    // ALPN, tls::Protocol::kHttp2).
    std::shared_ptr<tls::Context> tls;
    // With tls: the threads that make the handshakes and relay (at least 1).
    int relay_threads = 1;
  };

  // Listens on `where` (its first address, as the HTTP listeners do);
  // nothing is accepted before Start. Its metrics go to `metrics`, which
  // must outlive it.
  static absl::StatusOr<std::unique_ptr<ConnectionGate>> Listen(const HostPort& where,
                                                                Options options,
                                                                metrics::Metrics& metrics);
  virtual ~ConnectionGate() = default;

  // Accepts on a thread of its own; `hand_off` takes each connection that
  // sent its first bytes, and with it the descriptor.
  virtual void Start(std::function<void(int fd)> hand_off) = 0;
  // The context of the connections accepted from now on (a reload's
  // certificate); only for a gate started with one.
  virtual void SetTls(std::shared_ptr<tls::Context> context) = 0;
  // Closes the listener (new connections are refused by the kernel) and the
  // connections not handed off yet; those handed off are gRPC's to close,
  // and relayed ones are still relayed.
  virtual void Close() = 0;
  // Close, then ends the relayed connections too. Returns when the thread
  // has ended.
  virtual void Stop() = 0;
  virtual uint16_t port() const = 0;
};

}  // namespace sluice::envoy

#endif  // SLUICE_ENVOY_CONNECTION_GATE_H_
