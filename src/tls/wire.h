// Wire: what OpenSSL reads and writes a TLS connection's socket through,
// for the connections sluice serves over TLS (the HTTP listeners'
// server/tls_socket.h, the gRPC listener's envoy/connection_gate.cc).
// Internal.
//
// OpenSSL's own socket BIO writes with write(2): a write to a client that
// is gone raises SIGPIPE. This one sends with MSG_NOSIGNAL (the write fails
// with EPIPE), and notes whether the last recv drained the socket (took
// less than asked, or found nothing), so that a reader knows it need not
// read again before the next readiness event.
//
// Thread-safety: a wire and its BIO belong to their connection's thread.
#ifndef SLUICE_TLS_WIRE_H_
#define SLUICE_TLS_WIRE_H_

#include <openssl/bio.h>

namespace sluice::tls {

struct Wire {
  int fd = -1;
  bool drained = false;
};

// A BIO on `wire`, which must outlive it; null when out of memory.
BIO* NewWireBio(Wire* wire);

}  // namespace sluice::tls

#endif  // SLUICE_TLS_WIRE_H_
