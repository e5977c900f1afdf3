"""Shared helpers for the integration tests of `sluice serve`.

Everything here uses the Python standard library only and 127.0.0.1 only:

- Sluice: starts the real binary (SLUICE_BINARY) with a config written to a
  temporary directory, listeners on port 0, parses the chosen ports from the
  `event=start` log lines (the gRPC listener's too, when configured), keeps
  reading its stderr/stdout in threads (so the pipes never fill) and stops it
  by PID (SIGTERM, then SIGKILL as last resort).
- Upstream: a threaded HTTP/1.1 echo server (JSON of method, path, headers,
  body) that records the arrival of every request and can be made slow.
- parse_sf_list: a strict RFC 8941 List parser for RateLimit-Policy/RateLimit.
- parse_metrics: a Prometheus text-format parser.
- SluiceTestCase: a unittest.TestCase with helpers to start both and to
  issue requests with timeouts.
- wait_for_window_room: waits out the last seconds of a calendar window, for
  tests that count requests in a fixed_window or sliding_window.
"""

import http.client
import http.server
import json
import os
import re
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

BINARY = os.environ.get("SLUICE_BINARY", "")
SOURCE_DIR = os.environ.get("SLUICE_SOURCE_DIR", "")

HOST = "127.0.0.1"
START_TIMEOUT = 10.0   # seconds to wait for the event=start line
STOP_TIMEOUT = 10.0    # seconds to wait for exit after SIGTERM
HTTP_TIMEOUT = 5.0     # every client socket


def require_binary():
    if not BINARY or not os.path.isfile(BINARY) or not os.access(BINARY, os.X_OK):
        raise unittest.SkipTest(
            "SLUICE_BINARY is not set to the built sluice binary (got %r)" % BINARY)


# ---------------------------------------------------------------------------
# The sluice process
# ---------------------------------------------------------------------------

_START_RE = re.compile(r"event=start listen=(\S+):(\d+) admin=(\S+):(\d+) threads=(\d+).*")
# On the same line: decision=HOST:PORT when the decision API has its own listener.
_DECISION_RE = re.compile(r" decision=\S+:(\d+)")
# Logged before the line above, when `grpc:` is configured.
_GRPC_START_RE = re.compile(r"event=start listener=grpc listen=(\S+):(\d+)")


class Sluice:
    """One `sluice serve` process on free loopback ports."""

    def __init__(self, config_text, directory, name="config.yaml"):
        self.dir = directory
        self.config_path = os.path.join(directory, name)
        self.write_config(config_text)
        self.proc = None
        self.lines = []          # stderr and stdout lines, in arrival order
        self._cond = threading.Condition()
        self._readers = []
        self.port = None
        self.admin_port = None
        self.grpc_port = None    # set when the config has a gRPC listener
        self.threads = None

    # -- config file --

    def write_config(self, text, keep_stamp=False):
        """Writes the config. keep_stamp=True pads the text with a YAML comment
        to the old size and restores the old mtime, so the file watcher cannot
        see the change (only SIGHUP can make the server read it)."""
        if keep_stamp:
            st = os.stat(self.config_path)
            data = text.encode()
            pad = st.st_size - len(data)
            if pad < 3:
                raise ValueError("new config must be shorter than the old one by 3+ bytes")
            data = data + b"#" + b"x" * (pad - 2) + b"\n"
            assert len(data) == st.st_size
            with open(self.config_path, "wb") as f:
                f.write(data)
            os.utime(self.config_path, ns=(st.st_atime_ns, st.st_mtime_ns))
            return
        tmp = self.config_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.config_path)

    # -- process --

    def start(self, extra_args=(), preexec_fn=None):
        """preexec_fn runs in the child before the binary (e.g. to lower a
        resource limit with resource.setrlimit)."""
        require_binary()
        self.proc = subprocess.Popen(
            [BINARY, "serve", "--config", self.config_path, *extra_args],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=self.dir, preexec_fn=preexec_fn)
        for stream in (self.proc.stderr, self.proc.stdout):
            t = threading.Thread(target=self._read, args=(stream,), daemon=True)
            t.start()
            self._readers.append(t)
        m = self.wait_for_line(_START_RE, START_TIMEOUT)
        if m is None:
            self.stop()
            raise AssertionError("sluice did not log event=start within %.0fs; exit code %r; "
                                 "output:\n%s" % (START_TIMEOUT, self.proc.returncode, self.output()))
        self.port = int(m.group(2))
        self.admin_port = int(m.group(4))
        self.threads = int(m.group(5))
        d = _DECISION_RE.search(m.string)
        self.decision_port = int(d.group(1)) if d else None  # server.decision.listen's port
        g = self.wait_for_line(_GRPC_START_RE, 0)
        if g is not None:
            self.grpc_port = int(g.group(2))
        return self

    def _read(self, stream):
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
        stream.close()

    def output(self):
        with self._cond:
            return "\n".join(self.lines)

    def wait_for_line(self, pattern, timeout, start_index=0):
        """First line (from start_index on) matching the regex; None on timeout."""
        rx = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        with self._cond:
            i = start_index
            while True:
                while i < len(self.lines):
                    m = rx.search(self.lines[i])
                    if m:
                        return m
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if self.proc is not None and self.proc.poll() is not None and \
                        all(not t.is_alive() for t in self._readers):
                    return None
                self._cond.wait(min(left, 0.1))

    def line_count(self):
        with self._cond:
            return len(self.lines)

    def signal(self, sig):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self):
        """SIGTERM by PID, wait, SIGKILL as last resort. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT)
        for t in self._readers:
            t.join(2)
        return self.proc.returncode


def rss_kib(pid):
    """The resident memory of process `pid`, in KiB (0 if /proc does not say)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid):
    """The CPU time of process `pid`, all its threads, user and system, in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # After the ")" of comm: state is fields[0], utime field 14 (index 11), stime 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for_window_room(period_s, need_s):
    """Calendar windows (fixed_window, sliding_window) start at multiples of
    their period since the Unix epoch: a minute's on the minute, an hour's
    on the hour, UTC. When fewer than `need_s` seconds are left in the
    current window of `period_s` seconds (on this machine's clock, which the
    sluice processes here share), sleeps until the next window starts, so
    that requests sent within `need_s` seconds cannot straddle a boundary.
    `need_s` is a few seconds at most, and so is the wait. Returns the
    seconds slept."""
    if not 0 < need_s <= 10 or need_s >= period_s:
        raise ValueError("need_s must be a few seconds within the period")
    left = period_s - (time.time() % period_s)
    if left >= need_s:
        return 0.0
    wait = left + 0.05
    time.sleep(wait)
    return wait


def run_check(config_text, directory, name="config.yaml"):
    """`sluice serve --config FILE --check` -> (exit code, stdout, stderr)."""
    require_binary()
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(config_text)
    p = subprocess.run([BINARY, "serve", "--config", path, "--check"], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=30, cwd=directory)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


# ---------------------------------------------------------------------------
# The upstream
# ---------------------------------------------------------------------------

class _EchoHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def _handle(self):
        arrived = time.monotonic()
        up = self.server.upstream
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        record = {
            "time": arrived,
            "method": self.command,
            "path": self.path,
            "headers": {k: v for k, v in self.headers.items()},
            "header_list": list(self.headers.items()),
            "body": body.decode("utf-8", "replace"),
            # The sending end of the connection: one per connection sluice opens.
            "peer": self.client_address,
            # Over TLS, the certificate sluice presented (None without one).
            "client_cert": (self.connection.getpeercert()
                            if isinstance(self.connection, ssl.SSLSocket) else None),
        }
        with up.lock:
            up.requests.append(record)
            up.in_flight += 1
            up.max_in_flight = max(up.max_in_flight, up.in_flight)
        try:
            delay = up.delay_for(self.path)
            if delay > 0:
                time.sleep(delay)
        finally:
            with up.lock:
                up.in_flight -= 1
        if self.path.startswith("/switch"):
            # Switching protocols though nobody asked (sluice forwards no
            # Upgrade).
            self.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n"
                             b"Connection: upgrade\r\n\r\n")
            self.close_connection = True
            return
        if self.path.startswith("/pieces"):
            # An answer in three writes 50 ms apart: the head, then a body
            # larger than one of sluice's reads (64 KiB) in two parts.
            body = b"x" * 200000 + b"end"
            half = len(body) // 2
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(body))
            time.sleep(0.05)
            self.wfile.write(body[:half])
            time.sleep(0.05)
            self.wfile.write(body[half:])
            return
        if self.path.startswith("/close-ended"):
            # An answer whose body ends with the connection (no length, not
            # chunked), written in one go: its last bytes and the close
            # (FIN) reach sluice together.
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                             b"Connection: close\r\n\r\n" + b"y" * 1000 + b"end")
            self.wfile.flush()
            self.close_connection = True
            return
        if self.path.startswith("/te-coded"):
            # An answer transfer-coded with gzip before chunked (the body
            # is not really gzip: the proxy must not relay it either way).
            self.wfile.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
                             b"5\r\nhello\r\n0\r\n\r\n")
            self.close_connection = True
            return
        payload = json.dumps({
            "upstream": up.name,
            "method": self.command,
            "path": self.path,
            "headers": record["headers"],
            "body": record["body"],
        }).encode()
        # ?tokens=N: the answer says what it cost (settled costs).
        tokens = re.search(r"[?&]tokens=(\d+)", self.path)
        try:
            self.send_response(200)
            if tokens:
                self.send_header("X-Tokens-Used", tokens.group(1))
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)
        except OSError:
            self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_TRACE = _handle


class _EchoServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, *args, tls=None, **kwargs):
        self.open_sockets = set()
        self.sockets_lock = threading.Lock()
        self.tls = tls  # an ssl.SSLContext: TLS on every connection
        super().__init__(*args, **kwargs)

    def get_request(self):
        sock, addr = super().get_request()
        if self.tls is not None:
            # An https:// upstream: the handshake here (a failure is an
            # OSError, which the server drops with the connection).
            sock.settimeout(5)
            sock = self.tls.wrap_socket(sock, server_side=True)
        with self.sockets_lock:
            self.open_sockets.add(sock)
        return sock, addr

    def shutdown_request(self, request):
        with self.sockets_lock:
            self.open_sockets.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address):
        # sluice closing a connection (timeouts, shutdown) is not an error here.
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, OSError)):
            return
        super().handle_error(request, client_address)

    def close_all_connections(self):
        with self.sockets_lock:
            socks = list(self.open_sockets)
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Upstream:
    """A JSON echo server on 127.0.0.1:0. Paths starting with /slow sleep
    `slow_seconds` before answering. With `tls` (an ssl.SSLContext made for
    a server), an https:// one."""

    def __init__(self, name="upstream", slow_seconds=2.0, port=0, tls=None):
        self.name = name
        self.slow_seconds = slow_seconds
        self.lock = threading.Lock()
        self.requests = []
        # Requests being answered now, and the most at once (concurrency limits).
        self.in_flight = 0
        self.max_in_flight = 0
        self.server = _EchoServer((HOST, port), _EchoHandler, tls=tls)
        self.server.upstream = self
        self.port = self.server.server_address[1]
        self.url = "%s://%s:%d" % ("https" if tls else "http", HOST, self.port)
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def delay_for(self, path):
        return self.slow_seconds if path.startswith("/slow") else 0.0

    def hits(self, path_prefix=""):
        with self.lock:
            return [r for r in self.requests if r["path"].startswith(path_prefix)]

    def count(self, path_prefix=""):
        return len(self.hits(path_prefix))

    def close(self):
        """Stops listening and closes every open connection (keep-alive ones
        included): the upstream is really gone."""
        self.server.shutdown()
        self.server.server_close()
        self.server.close_all_connections()
        self.thread.join(5)


class DeadPort:
    """A port nothing listens on: bound (so no one else takes it) but not
    listening, so connecting to it is refused."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((HOST, 0))
        self.port = self.sock.getsockname()[1]
        self.url = "http://%s:%d" % (HOST, self.port)

    def close(self):
        self.sock.close()


# ---------------------------------------------------------------------------
# HTTP client helpers
# ---------------------------------------------------------------------------

class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.header_list = headers          # [(name, value)] as received
        self.body = body                    # bytes

    def header(self, name):
        """The value of a header (None when absent; fails if it is repeated)."""
        values = self.headers_named(name)
        if not values:
            return None
        if len(values) > 1:
            raise AssertionError("header %s repeated: %r" % (name, values))
        return values[0]

    def headers_named(self, name):
        return [v for k, v in self.header_list if k.lower() == name.lower()]

    def json(self):
        return json.loads(self.body.decode("utf-8"))

    @property
    def content_type(self):
        ct = self.header("Content-Type") or ""
        return ct.split(";")[0].strip().lower()

    def __repr__(self):
        return "<Response %d %r %r>" % (self.status, self.header_list, self.body[:500])


def request(port, method, path, body=None, headers=None, timeout=HTTP_TIMEOUT, conn=None):
    """One HTTP request; a new connection unless conn is given."""
    own = conn is None
    if own:
        conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        return Response(r.status, r.getheaders(), data)
    finally:
        if own:
            conn.close()


def post_json(port, path, body):
    """POST `body` (a dict or list, sent as JSON) to `path`."""
    return request(port, "POST", path, body=body, headers={"Content-Type": "application/json"})


def raw_exchange(port, data, timeout=HTTP_TIMEOUT, shutdown_write=False):
    """Sends raw bytes and reads until the server closes (or timeout).
    Returns the bytes received."""
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(data)
        if shutdown_write:
            s.shutdown(socket.SHUT_WR)
        return read_until_close(s, timeout)


def timed_exchange(port, data, timeout=5):
    """Sends `data` on a new connection and reads to the close (or
    `timeout`): what came back, and the seconds it took."""
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        start = time.monotonic()
        s.sendall(data)
        answer = read_until_close(s, timeout)
        return answer, time.monotonic() - start


def ask_then_send(port, head, body, timeout=5):
    """One request on a new connection from a client that expects
    100-continue: sends `head` (its header block, with the blank line), reads
    the interim answer it gets (to its blank line: b"" if the connection
    closes first), then sends `body` and reads the final answer to the close.
    Returns both: the interim's bytes and the final answer, parsed."""
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(head)
        asked = b""
        while not asked.endswith(b"\r\n\r\n"):
            chunk = s.recv(64)
            if not chunk:
                break
            asked += chunk
        s.sendall(body)
        return asked, parse_raw_response(read_until_close(s, timeout))


def read_until_close(s, timeout):
    chunks = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        s.settimeout(left)
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            break
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def parse_raw_response(data):
    """Parses one HTTP/1.1 response from raw bytes -> Response."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        raise AssertionError("no complete response header in %r" % data[:300])
    lines = head.decode("latin-1").split("\r\n")
    m = re.match(r"HTTP/1\.[01] (\d{3})(?: .*)?$", lines[0])
    if not m:
        raise AssertionError("bad status line %r" % lines[0])
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.append((name.strip(), value.strip()))
    resp = Response(int(m.group(1)), headers, b"")
    length = resp.header("Content-Length")
    resp.body = rest[:int(length)] if length is not None else rest
    return resp


# ---------------------------------------------------------------------------
# RFC 8941 Structured Field Lists
# ---------------------------------------------------------------------------

class SfError(ValueError):
    pass


class SfItem:
    def __init__(self, value, params):
        self.value = value
        self.params = params      # dict, insertion ordered

    def __repr__(self):
        return "SfItem(%r, %r)" % (self.value, self.params)


class SfToken(str):
    pass


_KEY_FIRST = set("abcdefghijklmnopqrstuvwxyz*")
_KEY_CHARS = _KEY_FIRST | set("0123456789_-.")
_TCHAR = set("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


class _SfParser:
    def __init__(self, text):
        self.s = text
        self.i = 0

    def peek(self):
        return self.s[self.i] if self.i < len(self.s) else ""

    def fail(self, why):
        raise SfError("%s at offset %d in %r" % (why, self.i, self.s))

    def parse_list(self):
        # RFC 8941 4.2: discard leading SP, parse, then trailing SP must end it.
        while self.peek() == " ":
            self.i += 1
        members = []
        while self.i < len(self.s):
            members.append(self.parse_member())
            while self.peek() in (" ", "\t") and self.peek():
                self.i += 1
            if self.i >= len(self.s):
                return members
            if self.peek() != ",":
                self.fail("expected ',' between list members")
            self.i += 1
            while self.peek() in (" ", "\t") and self.peek():
                self.i += 1
            if self.i >= len(self.s):
                self.fail("trailing comma")
        return members

    def parse_member(self):
        if self.peek() == "(":
            self.i += 1
            items = []
            while True:
                while self.peek() == " ":
                    self.i += 1
                if self.peek() == ")":
                    self.i += 1
                    break
                items.append(SfItem(self.parse_bare_item(), self.parse_params()))
                if self.peek() not in (" ", ")"):
                    self.fail("bad inner list")
            return SfItem(items, self.parse_params())
        return SfItem(self.parse_bare_item(), self.parse_params())

    def parse_params(self):
        params = {}
        while self.peek() == ";":
            self.i += 1
            while self.peek() == " ":
                self.i += 1
            key = self.parse_key()
            value = True
            if self.peek() == "=":
                self.i += 1
                value = self.parse_bare_item()
            params[key] = value
        return params

    def parse_key(self):
        c = self.peek()
        if not c or c not in _KEY_FIRST:
            self.fail("bad parameter key start")
        start = self.i
        while self.peek() and self.peek() in _KEY_CHARS:
            self.i += 1
        return self.s[start:self.i]

    def parse_bare_item(self):
        c = self.peek()
        if c == "-" or c.isdigit() and c.isascii():
            return self.parse_number()
        if c == '"':
            return self.parse_string()
        if c == ":":
            return self.parse_bytes()
        if c == "?":
            self.i += 1
            v = self.peek()
            if v not in ("0", "1") or not v:
                self.fail("bad boolean")
            self.i += 1
            return v == "1"
        if c and (c.isalpha() and c.isascii() or c == "*"):
            start = self.i
            self.i += 1
            while self.peek() and (self.peek() in _TCHAR or self.peek() in ":/"):
                self.i += 1
            return SfToken(self.s[start:self.i])
        self.fail("bad bare item")

    def parse_number(self):
        m = re.compile(r"-?\d+(\.\d+)?").match(self.s, self.i)
        if not m:
            self.fail("bad number")
        text = m.group(0)
        self.i = m.end()
        if m.group(1) is None:
            if len(text.lstrip("-")) > 15:
                self.fail("integer longer than 15 digits")
            return int(text)
        int_part, frac = text.lstrip("-").split(".")
        if len(int_part) > 12 or len(frac) > 3:
            self.fail("bad decimal")
        return float(text)

    def parse_string(self):
        self.i += 1
        out = []
        while True:
            if self.i >= len(self.s):
                self.fail("unterminated string")
            c = self.s[self.i]
            self.i += 1
            if c == "\\":
                if self.i >= len(self.s):
                    self.fail("unterminated escape")
                n = self.s[self.i]
                self.i += 1
                if n not in ('"', "\\"):
                    self.fail("bad escape")
                out.append(n)
            elif c == '"':
                return "".join(out)
            elif ord(c) < 0x20 or ord(c) > 0x7e:
                self.fail("bad string character")
            else:
                out.append(c)

    def parse_bytes(self):
        end = self.s.find(":", self.i + 1)
        if end < 0:
            self.fail("unterminated byte sequence")
        import base64
        raw = self.s[self.i + 1:end]
        if not re.fullmatch(r"[A-Za-z0-9+/=]*", raw):
            self.fail("bad byte sequence")
        self.i = end + 1
        return base64.b64decode(raw)


def parse_sf_list(text):
    """Parses an RFC 8941 List; raises SfError on anything malformed."""
    if text is None:
        raise SfError("field is absent")
    return _SfParser(text).parse_list()


def ratelimit_members(text):
    """A RateLimit / RateLimit-Policy field as {policy name: params}; every
    member must be an sf-string, each named once."""
    out = {}
    for member in parse_sf_list(text):
        if not isinstance(member.value, str) or isinstance(member.value, SfToken):
            raise SfError("member %r is not an sf-string" % (member.value,))
        if member.value in out:
            raise SfError("policy %r listed twice" % member.value)
        for name in ("q", "w", "r", "t"):
            v = member.params.get(name)
            if v is not None and (type(v) is not int or v < 0):
                raise SfError("parameter %s=%r of %r is not a non-negative Integer" % (
                    name, v, member.value))
        out[member.value] = member.params
    return out


# ---------------------------------------------------------------------------
# Prometheus text format
# ---------------------------------------------------------------------------

_METRIC_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)( -?\d+)?$")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(,|$)')


def _parse_labels(text):
    labels = {}
    pos = 0
    while pos < len(text):
        m = _LABEL_RE.match(text, pos)
        if not m or m.end() == pos:
            raise ValueError("bad labels %r" % text)
        labels[m.group(1)] = re.sub(r"\\(.)", lambda e: {"n": "\n"}.get(e.group(1), e.group(1)),
                                    m.group(2))
        pos = m.end()
    return labels


def parse_metrics(text):
    """-> list of (name, labels dict, float value); fails on a malformed line."""
    samples = []
    for line in text.split("\n"):
        if not line or line.startswith("#"):
            continue
        m = _METRIC_RE.match(line)
        if not m:
            raise ValueError("malformed metrics line %r" % line)
        value = m.group(4)
        if value in ("+Inf", "-Inf", "NaN"):
            v = float(value.replace("Inf", "inf").replace("NaN", "nan"))
        else:
            v = float(value)
        samples.append((m.group(1), _parse_labels(m.group(3) or ""), v))
    return samples


def metric_value(samples, name, **labels):
    """Sum of the samples with that name whose labels include `labels`; 0 if none."""
    total = 0.0
    for n, l, v in samples:
        if n == name and all(l.get(k) == str(val) for k, val in labels.items()):
            total += v
    return total


# What a gRPC client sends first: the HTTP/2 preface and an empty SETTINGS frame.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
FRAME_SETTINGS = 0x4
FRAME_GOAWAY = 0x7


def frame_types(data):
    """The types of the whole HTTP/2 frames at the start of `data`."""
    types = []
    while len(data) >= 9:
        length = struct.unpack(">I", b"\x00" + data[:3])[0]
        types.append(data[3])
        data = data[9 + length:]
    return types


# ---------------------------------------------------------------------------
# Base test case
# ---------------------------------------------------------------------------

SERVER_BLOCK = """\
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
  threads: {threads}
{extra}"""


def server_block(threads=2, **settings):
    """The `server:` section on free ports, with more settings (already YAML text)."""
    extra = "".join("  %s: %s\n" % (k, v) for k, v in settings.items())
    return SERVER_BLOCK.format(threads=threads, extra=extra)


NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)


def free_port():
    """A TCP port on HOST that nothing listens on now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start_nginx(test, conf, port):
    """Debian's nginx on `conf` (the text of its nginx.conf, written to the
    test's tmpdir, its prefix; no `daemon` directive), once it answers on
    HOST:`port`; stopped by PID (only the process this test started) when
    the test ends. Returns its Popen."""
    if NGINX is None:
        test.fail("nginx is not installed (scripts/test installs nginx-light)")
    path = os.path.join(test.tmpdir, "nginx.conf")
    with open(path, "w") as f:
        f.write(conf)
    return _start_server(test, "nginx", [NGINX, "-e", "stderr", "-p", test.tmpdir, "-c", path,
                                         "-g", "daemon off;"], port)


APACHE = shutil.which("apache2") or ("/usr/sbin/apache2" if os.path.exists("/usr/sbin/apache2")
                                     else None)
APACHE_MODULES = "/usr/lib/apache2/modules"


def start_apache(test, conf, port):
    """Debian's Apache httpd (apache2-bin) on `conf` (the text of its
    configuration, written to the test's tmpdir; its modules are in
    APACHE_MODULES), in the foreground, once it answers on HOST:`port`;
    stopped by PID as start_nginx's. Returns its Popen."""
    if APACHE is None:
        test.fail("apache2 is not installed (scripts/test installs apache2-bin)")
    path = os.path.join(test.tmpdir, "httpd.conf")
    with open(path, "w") as f:
        f.write(conf)
    return _start_server(test, "apache2", [APACHE, "-f", path, "-DFOREGROUND"], port)


def _start_server(test, name, argv, port):
    """Runs `argv` (a server whose workers run as an unprivileged user and
    read the test's tmpdir), once it answers on HOST:`port`; stopped by PID
    when the test ends. In a session of its own: Apache's prefork signals
    its whole process group when it stops, which would be the test's."""
    os.chmod(test.tmpdir, 0o755)
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              start_new_session=True)

    def stop():
        if server.poll() is None:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        server.stderr.close()

    test.addCleanup(stop)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return server
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                test.fail("%s did not start: %s" % (name, server.stderr.read().decode()))
            time.sleep(0.05)


class SluiceTestCase(unittest.TestCase):
    def setUp(self):
        require_binary()
        self._tmp = tempfile.TemporaryDirectory(prefix="sluice-it-")
        self.addCleanup(self._tmp.cleanup)
        self.tmpdir = self._tmp.name

    def start_upstream(self, name="upstream", slow_seconds=2.0, port=0, tls=None):
        up = Upstream(name, slow_seconds, port, tls)
        self.addCleanup(up.close)
        return up

    def start_sluice(self, config_text, preexec_fn=None):
        s = Sluice(config_text, self.tmpdir)
        self.addCleanup(self._stop_and_report, s)
        s.start(preexec_fn=preexec_fn)
        self.sluice = s
        # The event=start line is logged before the event loops run. An
        # answer from the admin listener (served by the first loop, after the
        # config watcher took its first look at the file) means it is all up.
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if request(s.admin_port, "GET", "/healthz", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.fail("sluice never answered /healthz; output:\n" + s.output())
            time.sleep(0.02)
        return s

    def _stop_and_report(self, s):
        code = s.stop()
        if code not in (0, None) and code != -signal.SIGKILL:
            sys.stderr.write("sluice exited with %r; output:\n%s\n" % (code, s.output()))

    # -- requests --

    def get(self, path, headers=None, admin=False, s=None):
        s = s or self.sluice
        return request(s.admin_port if admin else s.port, "GET", path, headers=headers)

    def post(self, path, body=None, headers=None, s=None):
        s = s or self.sluice
        return request(s.port, "POST", path, body=body, headers=headers)

    def post_json(self, path, body, s=None):
        return post_json((s or self.sluice).port, path, body)

    def check(self, policy, key, cost=None, s=None, conn=None):
        body = {"policy": policy, "key": key}
        if cost is not None:
            body["cost"] = cost
        s = s or self.sluice
        return request(s.port, "POST", "/v1/check", body=body,
                       headers={"Content-Type": "application/json"}, conn=conn)

    def metrics(self, s=None):
        r = self.get("/metrics", admin=True, s=s)
        self.assertEqual(r.status, 200, r)
        return parse_metrics(r.body.decode())

    def assert_healthy(self, s=None):
        r = self.get("/healthz", admin=True, s=s)
        self.assertEqual(r.status, 200, r)

    def assert_problem(self, r, status):
        """A problem+json answer (RFC 9457) with that status."""
        self.assertEqual(r.status, status, r)
        self.assertEqual(r.content_type, "application/problem+json", r)
        body = r.json()
        self.assertIsInstance(body, dict, r)
        self.assertEqual(body.get("status"), status, r)
        self.assertIn("title", body, r)
        self.assertIn("type", body, r)
        return body
