#!/usr/bin/env python3
"""What `sluice serve` does when things fail, measured.

Starts its own redis-server processes (one, then a 3-master + 3-replica
Cluster) and `sluice serve` processes on free loopback ports, breaks them on
purpose and prints what it measured as a markdown table on stdout (ready to
paste into the README's "When things fail"); progress goes to stderr.

Scenarios (--only picks some: kill,pause,cluster,flood,fds):

  kill     1. Redis SIGKILLed under a steady, paced load of POST /v1/check on a
              global limit: latency before, in the first second after, and
              after that; how on_store_error allow / deny / local answer.
           3. Redis restarted on its port: time from Redis accepting
              connections to /readyz 200 and to the first decision in Redis.
  pause    2. Redis SIGSTOPped for --pause seconds, then SIGCONT: latency
              during the pause, sluice_redis_timeouts_total, time from SIGCONT
              to decisions in Redis again; then, without load, whether checks
              that timed out are charged to their key when Redis resumes.
  cluster  4. A Redis Cluster master SIGKILLed (cluster-node-timeout as the
              integration tests use): time until its keys are decided in
              Redis again, and whether a key's count carried over.
  flood    5. Unique keys as fast as wrk sends them against the memory store
              (max_keys bounded): RSS, keys held, evictions, throughput.
  fds      6. sluice started with RLIMIT_NOFILE --nofile, --hold-conns
              connections opened and held: sluice's CPU meanwhile, how long
              until a check is answered once they close,
              sluice_accept_errors_total.

Every load is bounded in count and time; everything started here is stopped
by its PID, also on Ctrl-C. Python standard library only; it reuses the
integration tests' harness (tests/integration/harness.py, redis_harness.py).
External programs: redis-server, redis-cli, wrk (Debian packages; installed
with the project's scripts/deps.sh when missing).

Usage: bench/failure/run.py                      # about 1.5 minutes on 2 cores
       bench/failure/run.py --only kill,pause    # some scenarios
       bench/failure/run.py --binary PATH        # another sluice binary
       bench/failure/run.py --update-readme      # also replace the figures in
                                                 # README.md ("When things fail")
"""

import argparse
import math
import os
import re
import resource
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

import harness  # noqa: E402
import redis_harness  # noqa: E402
from harness import cpu_seconds, metric_value, parse_metrics, request, server_block  # noqa: E402
from redis_harness import (HttpClient, RedisCluster, RedisConnection, RedisError,  # noqa: E402
                           RedisServer, readyz, redis_store_block)

SCENARIOS = ["kill", "pause", "cluster", "flood", "fds"]
T0 = time.monotonic()


def log(msg):
    sys.stderr.write("[%6.1fs] %s\n" % (time.monotonic() - T0, msg))
    sys.stderr.flush()


# ---------------------------------------------------------------------------
# What was started, stopped in reverse order (each by its own PID)
# ---------------------------------------------------------------------------

class Cleanups:
    def __init__(self):
        self.items = []

    def add(self, fn, *args):
        self.items.append((fn, args))

    def run(self):
        while self.items:
            fn, args = self.items.pop()
            try:
                fn(*args)
            except Exception as e:  # keep stopping the rest
                log("cleanup %s failed: %r" % (getattr(fn, "__name__", fn), e))


def stop_sluice(s):
    code = s.stop()
    if code not in (0, None, -signal.SIGKILL):
        log("sluice exited with %r; last output:\n%s" % (code, "\n".join(s.lines[-20:])))


def start_sluice(cleanups, config, directory, name, sluice_class=harness.Sluice, **kwargs):
    s = sluice_class(config, directory, name=name, **kwargs)
    cleanups.add(stop_sluice, s)
    s.start()
    redis_harness.wait_until(
        lambda: request(s.admin_port, "GET", "/healthz", timeout=2).status == 200,
        harness.START_TIMEOUT, what="/healthz of sluice")
    return s


class LimitedSluice(harness.Sluice):
    """A sluice whose RLIMIT_NOFILE (soft and hard) is set before exec."""

    def __init__(self, config_text, directory, name="config.yaml", nofile=256):
        super().__init__(config_text, directory, name)
        self.nofile = nofile

    def _limit(self):
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    def start(self, extra_args=()):
        harness.require_binary()
        self.proc = subprocess.Popen(
            [harness.BINARY, "serve", "--config", self.config_path, *extra_args],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=self.dir, preexec_fn=self._limit)
        for stream in (self.proc.stderr, self.proc.stdout):
            t = threading.Thread(target=self._read, args=(stream,), daemon=True)
            t.start()
            self._readers.append(t)
        m = self.wait_for_line(harness._START_RE, harness.START_TIMEOUT)
        if m is None:
            self.stop()
            raise RuntimeError("sluice (RLIMIT_NOFILE %d) did not start; output:\n%s" % (
                self.nofile, self.output()))
        self.port, self.admin_port = int(m.group(2)), int(m.group(4))
        self.threads = int(m.group(5))
        return self


# ---------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------

def metrics(s, timeout=5):
    r = request(s.admin_port, "GET", "/metrics", timeout=timeout)
    if r.status != 200:
        raise RuntimeError("GET /metrics answered %r" % r)
    return parse_metrics(r.body.decode())


def metric(s, name, **labels):
    return metric_value(metrics(s), name, **labels)


def proc_status_kb(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return None


def pct(values, p):
    """Nearest-rank percentile of a list (None if empty)."""
    if not values:
        return None
    v = sorted(values)
    return v[max(0, min(len(v) - 1, math.ceil(p / 100.0 * len(v)) - 1))]


def ms(seconds):
    if seconds is None:
        return "-"
    x = seconds * 1000
    if x < 1:
        return "%.2f ms" % x
    if x < 10:
        return "%.1f ms" % x
    return "%.0f ms" % x


def lat_summary(samples):
    """'p50 / p99 / max (n checks)' of PacedLoad samples."""
    lat = [x[1] for x in samples]
    if not lat:
        return "no checks"
    return "%s / %s / %s (%d checks)" % (ms(pct(lat, 50)), ms(pct(lat, 99)), ms(max(lat)),
                                         len(lat))


def kib(k):
    return "%.1f MiB" % (k / 1024.0) if k is not None else "-"


def num(x):
    return "{:,}".format(int(x))


class PacedLoad:
    """POST /v1/check at a steady rate: `conns` threads, each on its own
    keep-alive connection, one check in flight each, sending at
    rate/conns per second. Records (sent at, seconds, status,
    retry_after_ms, key) per answer and every failure. Bounded: stops after
    max_seconds or max_requests, whichever first; a lost connection is
    re-opened after 50 ms."""

    def __init__(self, port, policy, rate, conns, max_seconds, keys_per_conn=1000):
        self.port = port
        self.policy = policy
        self.interval = conns / float(rate)
        self.max_seconds = max_seconds
        self.max_per_conn = int(rate * max_seconds / conns) + 1
        self.keys = keys_per_conn
        self.lock = threading.Lock()
        self.samples = []
        self.failures = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i, conns), daemon=True)
                         for i in range(conns)]

    def start(self):
        self.started = time.monotonic()
        for t in self._threads:
            t.start()
        return self

    def _run(self, i, conns):
        deadline = self.started + self.max_seconds
        next_at = self.started + self.interval * i / conns
        client = None
        sent = 0
        tag = "%d-%d" % (i, time.time_ns())
        while not self._stop.is_set() and sent < self.max_per_conn:
            now = time.monotonic()
            if now >= deadline:
                break
            if next_at > now:
                time.sleep(next_at - now)
            next_at = max(next_at + self.interval, time.monotonic() - self.interval)
            try:
                if client is None:
                    client = HttpClient(self.port, timeout=5)
                key = "load-%s-%d" % (tag, sent % self.keys)
                t = time.monotonic()
                status, _, body, took = client.check(self.policy, key)
                sent += 1
                with self.lock:
                    self.samples.append((t, took, status, body.get("retry_after_ms"), key))
            except Exception as e:
                with self.lock:
                    self.failures.append((time.monotonic(), repr(e)))
                if client is not None:
                    client.close()
                    client = None
                time.sleep(0.05)
        if client is not None:
            client.close()

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join(10)
        return self

    def between(self, start, end):
        with self.lock:
            return [x for x in self.samples if start <= x[0] < end]

    def first_redis_answer_after(self, t):
        """Time the first check sent at or after t was answered by Redis (200:
        the load policy denies on a store error and never reaches its limit)."""
        with self.lock:
            done = sorted(x[0] + x[1] for x in self.samples if x[0] >= t and x[2] == 200)
        return done[0] if done else None


class Poller(threading.Thread):
    """Calls fn() every `interval` s until it returns true (or `limit` s);
    .at is the monotonic time it first did."""

    def __init__(self, fn, interval, limit):
        super().__init__(daemon=True)
        self.fn, self.interval, self.limit = fn, interval, limit
        self.at = None
        self._halt = threading.Event()

    def run(self):
        deadline = time.monotonic() + self.limit
        while not self._halt.is_set() and time.monotonic() < deadline:
            try:
                if self.fn():
                    self.at = time.monotonic()
                    return
            except (OSError, RedisError, ValueError, IndexError):
                pass
            time.sleep(self.interval)

    def stop(self):
        self._halt.set()
        self.join(5)


def ready(s):
    return readyz(s)[0] == 200


def not_ready(s):
    return readyz(s)[0] == 503


class Report:
    def __init__(self):
        self.rows = {}      # scenario number -> [(measure, value)]
        self.titles = {}
        self.notes = []

    def title(self, n, text):
        self.titles[n] = text

    def add(self, n, measure, value):
        self.rows.setdefault(n, []).append((measure, value))
        log("  %s: %s" % (measure, value))


# ---------------------------------------------------------------------------
# 1 + 3: Redis killed under load, then restarted
# ---------------------------------------------------------------------------

SINGLE_POLICIES = """\
policies:
  # The load: a rate nobody reaches, fail closed with a 1 s Retry-After, so
  # a 200 is a decision made in Redis and a 429 one made by on_store_error.
  - name: load
    limits:
      - {algorithm: token_bucket, rate: 1000000/1s, burst: 1000000}
    on_store_error: deny
    on_deny: {retry_after_jitter: 0s}
  - name: open
    limits:
      - {algorithm: token_bucket, rate: 1/1m, burst: 1}
    on_store_error: allow
  - name: closed
    limits:
      - {algorithm: token_bucket, rate: 3/1m, burst: 3}
    on_store_error: deny
    on_deny: {retry_after_jitter: 0s}
  - name: fallback
    limits:
      - {algorithm: token_bucket, rate: 3/1m, burst: 3}
    on_store_error: local
    on_deny: {retry_after_jitter: 0s}
  # 10 an hour (one back every 6 minutes): `remaining` counts exactly.
  - name: count
    limits:
      - {algorithm: token_bucket, rate: 10/1h, burst: 10}
    on_store_error: deny
    on_deny: {retry_after_jitter: 0s}
"""


def start_redis_and_sluice(args, cleanups, directory):
    redis = RedisServer(directory)
    cleanups.add(redis.kill)
    redis.start()
    config = server_block(threads=args.threads) + redis_store_block(
        url=redis.url, timeout=args.redis_timeout, connect_timeout="500ms") + SINGLE_POLICIES
    s = start_sluice(cleanups, config, directory, "sluice-redis.yaml")
    redis_harness.wait_until(lambda: ready(s), 5, what="/readyz 200")
    return redis, s


def restart_redis(redis, poll=0.002, limit=10.0):
    """Starts the killed server again on its port; returns the monotonic time
    it first answered PING (polled every `poll` s)."""
    redis.proc = subprocess.Popen(redis._args(), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and redis.proc.poll() is None:
        try:
            with RedisConnection(redis.port, timeout=0.5) as c:
                if c.call("PING") == "PONG":
                    return time.monotonic()
        except (OSError, RedisError):
            pass
        time.sleep(poll)
    raise RuntimeError("redis-server did not come back on port %d:\n%s" % (redis.port,
                                                                           redis.log()))


def mode_probe(s):
    """5 checks on a fresh key for each on_store_error mode -> summary text."""
    c = HttpClient(s.port, timeout=5)
    out = []
    try:
        for policy, mode in (("open", "allow"), ("closed", "deny"), ("fallback", "local")):
            key = "mode-%s-%d" % (policy, time.time_ns())
            answers = [c.check(policy, key) for _ in range(5)]
            statuses = " ".join(str(a[0]) for a in answers)
            retry = sorted({a[1].get("retry-after") for a in answers if a[0] == 429} - {None})
            text = "`%s`: %s" % (mode, statuses)
            if retry:
                text += " (Retry-After %s)" % ", ".join(retry)
            out.append(text)
    finally:
        c.close()
    return "; ".join(out)


def scenario_kill(args, cleanups, directory, report, shared):
    report.title(1, "Redis killed (SIGKILL) under load")
    report.title(3, "Redis back (restarted on its port after the kill)")
    redis, s = start_redis_and_sluice(args, cleanups, directory)
    shared["redis"], shared["sluice"] = redis, s
    errors0 = metric(s, "sluice_store_errors_total", policy="load")
    reconnects0 = metric(s, "sluice_redis_reconnects_total")

    total = args.warmup + args.before + args.dead + args.recovery + 5
    log("1: load of %d checks/s on %d connections for up to %.0f s" % (
        args.rate, args.conns, total))
    load = PacedLoad(s.port, "load", args.rate, args.conns, total).start()
    cleanups.add(load.stop)
    time.sleep(args.warmup + args.before)

    not_ready_poll = Poller(lambda: not_ready(s), 0.005, 5)
    killed = time.monotonic()
    redis.kill()
    not_ready_poll.start()
    log("1: Redis killed")
    time.sleep(min(1.5, args.dead))
    modes = mode_probe(s)
    time.sleep(max(0.0, killed + args.dead - time.monotonic()))
    not_ready_poll.stop()

    log("3: restarting Redis on port %d" % redis.port)
    launched = time.monotonic()
    ready_poll = Poller(lambda: ready(s), 0.005, 10)
    accepting = restart_redis(redis)
    ready_poll.start()
    time.sleep(args.recovery)
    ready_poll.stop()
    load.stop()
    cleanups.items.remove((load.stop, ()))

    before = load.between(load.started + args.warmup, killed)
    first = load.between(killed, killed + 1.0)
    after = load.between(killed + 1.0, launched)
    back_at = load.first_redis_answer_after(launched)
    back = load.between(back_at + 0.5, back_at + args.recovery) if back_at else []

    def refused(samples):
        n = sum(1 for x in samples if x[2] == 429)
        return "%d of %d" % (n, len(samples))

    t = args.redis_timeout
    report.add(1, "load", "%d checks/s on %d keep-alive connections (Python client), "
               "policy fail-closed, `store.redis.timeout: %s`" % (args.rate, args.conns, t))
    report.add(1, "before the kill: p50 / p99 / max", lat_summary(before))
    report.add(1, "first second after the kill: p50 / p99 / max", lat_summary(first))
    report.add(1, "first second: answered by `on_store_error`", refused(first))
    report.add(1, "after that, Redis still down: p50 / p99 / max", lat_summary(after))
    report.add(1, "after that: answered by `on_store_error`", refused(after))
    report.add(1, "connections dropped or stalled (> 5 s)", str(len(load.failures)))
    report.add(1, "/readyz 503 after the kill",
               ms(not_ready_poll.at - killed) if not_ready_poll.at else "not seen")
    report.add(1, "5 checks per mode on a fresh key, Redis down", modes)
    report.add(1, "`sluice_store_errors_total{policy=\"load\"}`",
               "+" + num(metric(s, "sluice_store_errors_total", policy="load") - errors0))

    report.add(3, "Redis answering PING after its restart began", ms(accepting - launched))
    report.add(3, "from Redis answering to /readyz 200",
               ms(ready_poll.at - accepting) if ready_poll.at else "not within 10 s")
    report.add(3, "from Redis answering to the first check decided in Redis",
               ms(back_at - accepting) if back_at else "never")
    report.add(3, "checks once back (from 0.5 s after): p50 / p99 / max", lat_summary(back))
    report.add(3, "`sluice_redis_reconnects_total`",
               "+" + num(metric(s, "sluice_redis_reconnects_total") - reconnects0))


# ---------------------------------------------------------------------------
# 2: Redis paused
# ---------------------------------------------------------------------------

def scenario_pause(args, cleanups, directory, report, shared):
    report.title(2, "Redis paused (SIGSTOP %.0f s, then SIGCONT)" % args.pause)
    if "redis" in shared:
        redis, s = shared["redis"], shared["sluice"]
    else:
        redis, s = start_redis_and_sluice(args, cleanups, directory)
    redis_harness.wait_until(lambda: ready(s), 10, what="/readyz 200 before the pause")
    timeouts0 = metric(s, "sluice_redis_timeouts_total")
    errors0 = metric(s, "sluice_redis_errors_total")

    total = args.warmup + args.before + args.pause + args.recovery + 5
    load = PacedLoad(s.port, "load", args.rate, args.conns, total).start()
    cleanups.add(load.stop)
    time.sleep(args.warmup + args.before)

    cleanups.add(redis.resume)   # never leave it stopped
    not_ready_poll = Poller(lambda: not_ready(s), 0.005, args.pause)
    stopped = time.monotonic()
    redis.pause()
    not_ready_poll.start()
    log("2: Redis paused")
    time.sleep(args.pause)
    ready_poll = Poller(lambda: ready(s), 0.005, 10)
    resumed = time.monotonic()
    redis.resume()
    ready_poll.start()
    log("2: Redis resumed")
    time.sleep(args.recovery)
    ready_poll.stop()
    not_ready_poll.stop()
    load.stop()
    cleanups.items.remove((load.stop, ()))

    paused = load.between(stopped, resumed)
    waited = [x for x in paused if x[1] >= 0.9 * parse_duration(args.redis_timeout)]
    back_at = load.first_redis_answer_after(resumed)
    during = lat_summary(paused)
    report.add(2, "checks during the pause: p50 / p99 / max", during)
    report.add(2, "checks during the pause that waited for the timeout",
               "%d (the rest answered by the open breaker)" % len(waited))
    report.add(2, "answered by `on_store_error` during the pause",
               "%d of %d" % (sum(1 for x in paused if x[2] == 429), len(paused)))
    report.add(2, "`sluice_redis_timeouts_total`",
               "+" + num(metric(s, "sluice_redis_timeouts_total") - timeouts0))
    report.add(2, "`sluice_redis_errors_total` (failed at once)",
               "+" + num(metric(s, "sluice_redis_errors_total") - errors0))
    report.add(2, "/readyz 503 after SIGSTOP",
               ms(not_ready_poll.at - stopped) if not_ready_poll.at else "not seen")
    report.add(2, "from SIGCONT to the first check decided in Redis",
               ms(back_at - resumed) if back_at else "never")
    report.add(2, "from SIGCONT to /readyz 200",
               ms(ready_poll.at - resumed) if ready_poll.at else "not within 10 s")
    report.add(2, "connections dropped or stalled (> 5 s)", str(len(load.failures)))

    # Without load: are calls that timed out applied when Redis resumes?
    redis_harness.wait_until(lambda: ready(s), 10, what="/readyz 200 after the pause")
    client = HttpClient(s.port, timeout=5)
    try:
        key = "count-%d" % time.time_ns()
        for _ in range(2):
            client.check("count", key)
        before = redis_harness.key_state(s, "count", key)[0]["remaining"]
        redis.pause()
        answers = [client.check("count", key) for _ in range(args.pause_probes)]
        redis.resume()
        redis_harness.wait_until(lambda: ready(s), 10, what="/readyz 200 after the probe")
        after = redis_harness.key_state(s, "count", key)[0]["remaining"]
    finally:
        client.close()
    refused = sum(1 for a in answers if a[0] == 429)
    report.add(2, "%d checks on one key while paused, no load (`on_store_error: deny`): "
               "taken from the key's budget in Redis after SIGCONT" % args.pause_probes,
               "%d (remaining %d before, %d after); the checks were answered %s in %s" % (
                   before - after, before, after,
                   "429" if refused == len(answers) else "%d x 429" % refused,
                   ", ".join(ms(a[3]) for a in answers)))


def parse_duration(text):
    for suffix, scale in (("ms", 0.001), ("us", 1e-6), ("s", 1.0)):
        if text.endswith(suffix):
            return float(text[:-len(suffix)]) * scale
    return float(text)


# ---------------------------------------------------------------------------
# 4: a Cluster master killed
# ---------------------------------------------------------------------------

CLUSTER_POLICIES = """\
policies:
  # 10 an hour (one back every 6 minutes): `remaining` counts exactly.
  - name: count
    limits:
      - {algorithm: token_bucket, rate: 10/1h, burst: 10}
    on_store_error: deny
    on_deny: {retry_after_jitter: 0s}
  - name: load
    limits:
      - {algorithm: token_bucket, rate: 1000000/1s, burst: 1000000}
    on_store_error: deny
    on_deny: {retry_after_jitter: 0s}
"""


def crc16(data):
    """CRC16-XMODEM, the Cluster's slot function (slot = crc16 % 16384)."""
    crc = 0
    for byte in data:
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc


def load_key_slot(policy, key):
    """The slot of sluice's Redis key for (policy, key): its hash tag is
    "{<policy>:<key>}" (docs/distributed.md)."""
    return crc16(("%s:%s" % (policy, key)).encode()) % 16384


def repl_offset(server, field):
    for line in server.call("INFO", "replication").split("\r\n"):
        if line.startswith(field + ":"):
            return int(line.split(":")[1])
    return None


def scenario_cluster(args, cleanups, directory, report, shared):
    report.title(4, "a Redis Cluster master killed (SIGKILL)")
    log("4: starting a Redis Cluster (3 masters, 3 replicas)")
    cluster = RedisCluster(directory)
    cleanups.add(cluster.stop)
    cluster.start()
    config = server_block(threads=args.threads) + redis_store_block(
        cluster=cluster.seeds[:1], timeout=args.redis_timeout,
        connect_timeout="500ms") + CLUSTER_POLICIES
    s = start_sluice(cleanups, config, directory, "sluice-cluster.yaml")
    redis_harness.wait_until(lambda: ready(s), 10, what="/readyz 200 on the Cluster")
    client = HttpClient(s.port, timeout=5)
    cleanups.add(client.close)

    key = "count-%d" % time.time_ns()
    for _ in range(args.cluster_count):
        status, _, body, _ = client.check("count", key)
        if status != 200:
            raise RuntimeError("count check answered %d %r" % (status, body))
    before = body["remaining"]
    rkey = None
    for port, _ in cluster.masters():
        found = cluster.server_on(port).call("SCAN", 0, "MATCH", "*%s*" % key, "COUNT", 10000)
        if found[1]:
            rkey = found[1][0]
    if rkey is None:
        raise RuntimeError("no Redis key holds %s" % key)
    slot = cluster.keyslot(rkey)
    victim_port = cluster.master_of_slot(slot)
    replica_port = cluster.replica_of(victim_port)
    victim, replica = cluster.server_on(victim_port), cluster.server_on(replica_port)
    victim_slots = dict(cluster.masters())[victim_port]
    redis_harness.wait_until(
        lambda: repl_offset(victim, "master_repl_offset") ==
        repl_offset(replica, "slave_repl_offset"), 5, what="replica in sync")

    total = args.warmup + 1 + args.cluster_limit + 2
    load = PacedLoad(s.port, "load", args.cluster_rate, args.conns, total).start()
    cleanups.add(load.stop)
    time.sleep(args.warmup + 1)

    promoted = Poller(lambda: replica.call("ROLE")[0] == "master", 0.005, args.cluster_limit)
    unready = Poller(lambda: not_ready(s), 0.005, args.cluster_limit)
    killed = time.monotonic()
    victim.kill()
    promoted.start()
    unready.start()
    log("4: master %d killed (slot %d of the key; replica %d)" % (victim_port, slot,
                                                                  replica_port))
    back_at, after, probes = None, None, 0
    deadline = killed + args.cluster_limit
    while time.monotonic() < deadline:
        status, _, body, took = client.check("count", key)
        probes += 1
        if status == 200:
            back_at = time.monotonic()
            after = body["remaining"]
            break
        time.sleep(0.005)
    ready_poll = Poller(lambda: ready(s), 0.005, 10)
    ready_poll.start()
    ready_poll.join(11)
    time.sleep(1.0)
    load.stop()
    cleanups.items.remove((load.stop, ()))
    promoted.stop()
    unready.stop()

    outage = load.between(killed, back_at or time.monotonic())

    def refused(on_victim):
        part = [x for x in outage
                if any(a <= load_key_slot("load", x[4]) <= b for a, b in victim_slots) ==
                on_victim]
        n = sum(1 for x in part if x[2] == 429)
        return "%d of %d (%.0f%%)" % (n, len(part), 100.0 * n / max(1, len(part)))

    report.add(4, "Cluster", "3 masters + 3 replicas, `cluster-node-timeout 1000` ms, "
               "`store.redis.timeout: %s`" % args.redis_timeout)
    report.add(4, "replica promoted (its ROLE says master) after the kill",
               ms(promoted.at - killed) if promoted.at else "not within %.0f s" %
               args.cluster_limit)
    report.add(4, "the key's checks decided in Redis again after the kill",
               ("%s (%s after the promotion)" % (
                   ms(back_at - killed), ms(back_at - promoted.at) if promoted.at else "-"))
               if back_at else "not within %.0f s" % args.cluster_limit)
    report.add(4, "/readyz 503 after the kill; 200 again after",
               "%s; %s" % (ms(unready.at - killed) if unready.at else "not seen",
                           ms(ready_poll.at - killed) if ready_poll.at else "not within 10 s"))
    carried = after is not None and after == before - 1
    report.add(4, "the key's count carried over",
               "%s: remaining %s after %d checks, %s at the next one" % (
                   "yes" if carried else "**no**", before, args.cluster_count,
                   after if after is not None else "-"))
    report.add(4, "load (%d checks/s, keys on all masters) from the kill until then, "
               "answered by `on_store_error`: keys of the killed master / of the others"
               % args.cluster_rate, "%s / %s" % (refused(True), refused(False)))
    report.add(4, "load latency from the kill until back: p50 / p99 / max", lat_summary(outage))


# ---------------------------------------------------------------------------
# 5: unique-key flood against the memory store
# ---------------------------------------------------------------------------

FLOOD_LUA = """\
-- Unique keys: "u<thread>-<n>"; each thread stops after its share.
local counter = 0
function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
end
local n = 0
local per_thread = %(per_thread)d
request = function()
  n = n + 1
  if n > per_thread then wrk.thread:stop() end
  local body = '{"policy":"flood","key":"u' .. id .. '-' .. n .. '"}'
  return wrk.format("POST", "/v1/check", {["Content-Type"] = "application/json"}, body)
end
"""


def parse_wrk(text):
    out = {}
    m = re.search(r"(\d+) requests in", text)
    out["requests"] = int(m.group(1)) if m else None
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    out["non2xx"] = int(m.group(1)) if m else 0
    m = re.search(r"Socket errors: (.*)", text)
    out["socket_errors"] = m.group(1).strip() if m else "none"
    return out


def scenario_flood(args, cleanups, directory, report, shared):
    report.title(5, "a unique-key flood against the memory store")
    wrk = shutil.which("wrk")
    if not wrk:
        report.add(5, "skipped", "wrk is not installed")
        return
    config = server_block(threads=args.threads) + (
        "store: {memory: {max_keys: %d}}\n"
        "policies:\n"
        "  - name: flood\n"
        "    limits:\n"
        "      - {algorithm: token_bucket, rate: %s, burst: %d}\n") % (
        args.max_keys, args.flood_rate, args.flood_burst)
    s = start_sluice(cleanups, config, directory, "sluice-flood.yaml")
    pid = s.proc.pid
    time.sleep(0.3)
    rss0 = proc_status_kb(pid, "VmRSS")
    lua = os.path.join(directory, "flood.lua")
    threads = 2
    with open(lua, "w") as f:
        f.write(FLOOD_LUA % {"per_thread": (args.flood_keys + threads - 1) // threads})

    def decided(m):
        return metric_value(m, "sluice_decisions_total", policy="flood")

    log("5: %s unique keys, max_keys %s, wrk -t%d -c%d (at most %d s)" % (
        num(args.flood_keys), num(args.max_keys), threads, args.flood_conns,
        args.flood_seconds))
    # wrk runs until -d even when its threads stopped after their share:
    # this watches sluice's decision count and stops wrk (SIGINT, by PID)
    # once every key was decided, or when nothing moved for 2 s.
    cmd = [wrk, "-t%d" % threads, "-c%d" % args.flood_conns, "-d%ds" % args.flood_seconds,
           "-s", lua, "http://%s:%d" % (harness.HOST, s.port)]
    base = decided(metrics(s))
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    cleanups.add(stop_process, p)
    peak_rss, peak_keys = rss0, 0
    done_at = cpu_done = None
    last, last_change = base, t0
    while p.poll() is None:
        time.sleep(0.2)
        now = time.monotonic()
        rss = proc_status_kb(pid, "VmRSS")
        peak_rss = max(peak_rss, rss or 0)
        try:
            m = metrics(s, timeout=2)
        except OSError:
            continue
        peak_keys = max(peak_keys, metric_value(m, "sluice_keys"))
        count = decided(m)
        if count != last:
            last, last_change = count, now
        if count - base >= args.flood_keys or now - last_change > 2.0:
            done_at, cpu_done = last_change, cpu_seconds(pid)
            p.send_signal(signal.SIGINT)
            break
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    cleanups.items.remove((stop_process, (p,)))
    if done_at is None:
        done_at, cpu_done = time.monotonic(), cpu_seconds(pid)
    w = parse_wrk(out.decode(errors="replace"))
    if w["requests"] is None:
        raise RuntimeError("wrk failed (%d):\n%s%s" % (p.returncode, out.decode(),
                                                        err.decode()))
    hwm = proc_status_kb(pid, "VmHWM")
    flood_seconds = done_at - t0
    m = metrics(s)
    sent = decided(m) - base
    time.sleep(args.flood_settle)
    m = metrics(s)
    rss_after = proc_status_kb(pid, "VmRSS")

    report.add(5, "sent", "%s checks with unique keys (wrk -t%d -c%d), `max_keys: %s`, "
               "one `token_bucket %s` limit (burst %d): a key is not fresh for a while "
               "after its check" % (num(sent), threads, args.flood_conns, num(args.max_keys),
                                    args.flood_rate, args.flood_burst))
    report.add(5, "throughput during the flood",
               "%s checks/s over %.1f s (non-2xx: %d; socket errors: %s); sluice CPU %.0f%% "
               "of one core" % (num(sent / flood_seconds), flood_seconds, w["non2xx"],
                                w["socket_errors"], 100.0 * (cpu_done - cpu0) / flood_seconds))
    report.add(5, "sluice RSS: before / peak (VmHWM) / %.0f s after" % args.flood_settle,
               "%s / %s / %s" % (kib(rss0), kib(max(hwm or 0, peak_rss or 0)),
                                 kib(rss_after)))
    report.add(5, "`sluice_keys`: highest sampled (every 0.2 s) / after",
               "%s / %s" % (num(peak_keys), num(metric_value(m, "sluice_keys"))))
    report.add(5, "`sluice_fresh_evictions_total` / `sluice_forced_evictions_total`",
               "%s / %s" % (num(metric_value(m, "sluice_fresh_evictions_total")),
                            num(metric_value(m, "sluice_forced_evictions_total"))))


def stop_process(p):
    if p.poll() is None:
        p.kill()
    p.wait(10)


# ---------------------------------------------------------------------------
# 6: out of file descriptors
# ---------------------------------------------------------------------------

def open_held(port, count, limit):
    """Non-blocking connects to port; returns (sockets, how many completed
    their handshake within `limit` s)."""
    socks = []
    for _ in range(count):
        so = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        so.setblocking(False)
        so.connect_ex((harness.HOST, port))
        socks.append(so)
    sel = selectors.DefaultSelector()
    for so in socks:
        sel.register(so, selectors.EVENT_WRITE)
    connected, pending = 0, len(socks)
    deadline = time.monotonic() + limit
    while pending and time.monotonic() < deadline:
        for k, _ in sel.select(max(0.0, deadline - time.monotonic())):
            sel.unregister(k.fileobj)
            pending -= 1
            if k.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                connected += 1
    sel.close()
    return socks, connected


def try_check(port, timeout):
    """A check on a new connection -> status, or None if it was not
    answered within `timeout`."""
    try:
        c = HttpClient(port, timeout=timeout)
    except OSError:
        return None
    try:
        return c.check("fd", "k-%d" % time.time_ns())[0]
    except (OSError, ValueError):
        return None
    finally:
        c.close()


def scenario_fds(args, cleanups, directory, report, shared):
    report.title(6, "out of file descriptors")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = args.hold_conns + 64
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(want, 1024)), hard))
    config = server_block(threads=args.threads) + (
        "policies:\n"
        "  - name: fd\n"
        "    limits:\n"
        "      - {algorithm: token_bucket, rate: 1000000/1s, burst: 1000000}\n")
    s = start_sluice(cleanups, config, directory, "sluice-fds.yaml", sluice_class=LimitedSluice,
                     nofile=args.nofile)
    pid = s.proc.pid
    if try_check(s.port, 2) != 200:
        raise RuntimeError("sluice does not answer a check before the test")
    open_fds = len(os.listdir("/proc/%d/fd" % pid))
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(1.0)
    idle_cpu = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)

    log("6: opening %d connections to sluice (RLIMIT_NOFILE %d, %d fds open)" % (
        args.hold_conns, args.nofile, open_fds))
    socks, connected = open_held(s.port, args.hold_conns, 2.0)

    def close_all():
        for so in socks:
            so.close()
        socks.clear()

    cleanups.add(close_all)
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(0.5)
    sluice_fds = len(os.listdir("/proc/%d/fd" % pid))
    during = try_check(s.port, 1.0)
    try:
        admin = request(s.admin_port, "GET", "/healthz", timeout=1.0).status
    except OSError:
        admin = None
    time.sleep(max(0.0, t0 + args.hold_seconds - time.monotonic()))
    held_cpu = (cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)
    closed = time.monotonic()
    close_all()
    answered_at = None
    while time.monotonic() < closed + 15:
        if try_check(s.port, 0.5) == 200:
            answered_at = time.monotonic()
            break
        time.sleep(0.01)
    alive = s.proc.poll() is None
    try:
        m = metrics(s)
        names = {n for n, _, _ in m}
        accept_errors = (num(metric_value(m, "sluice_accept_errors_total"))
                         if "sluice_accept_errors_total" in names else "absent")
        refused = num(metric_value(m, "sluice_connections_refused_total"))
    except OSError as e:
        accept_errors = refused = "no answer from /metrics (%r)" % e

    report.add(6, "setup", "`RLIMIT_NOFILE` %d (%d fds open at rest); %d connections opened "
               "to the main listener, %d completed the TCP handshake, held %.0f s" % (
                   args.nofile, open_fds, args.hold_conns, connected, args.hold_seconds))
    report.add(6, "fds sluice held meanwhile", str(sluice_fds))
    report.add(6, "sluice CPU while they are held (at rest before)",
               "%.1f%% of one core (%.1f%%)" % (100 * held_cpu, 100 * idle_cpu))
    report.add(6, "a new check meanwhile (1 s timeout); admin /healthz",
               "%s; %s" % ("answered %d" % during if during else "not answered",
                           "answered %d" % admin if admin else "not answered"))
    report.add(6, "a new check answered again after the held ones closed",
               ms(answered_at - closed) if answered_at else "not within 15 s")
    report.add(6, "`sluice_accept_errors_total`", accept_errors)
    report.add(6, "`sluice_connections_refused_total`", refused)
    report.add(6, "sluice still running", "yes" if alive else "**no** (exit %r)" %
               s.proc.returncode)


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

def machine():
    def first(path, prefix):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith(prefix):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return "?"
    try:
        rv = subprocess.run([redis_harness.REDIS_SERVER, "--version"], capture_output=True,
                            timeout=10).stdout.decode().split()
        redis_version = next((w.split("=")[1] for w in rv if w.startswith("v=")), "?")
    except (OSError, TypeError, subprocess.SubprocessError):
        redis_version = "?"
    return {"nproc": os.cpu_count(), "cpu": first("/proc/cpuinfo", "model name"),
            "kernel": os.uname().release, "redis": redis_version}


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def ensure_tools():
    missing = [t for t in ("redis-server", "redis-cli", "wrk") if not shutil.which(t)]
    if not missing:
        return
    log("installing redis-server redis-tools wrk (scripts/deps.sh)")
    subprocess.run(["bash", "-c", "source scripts/deps.sh && "
                    "sluice_install_deps redis-server redis-tools wrk"],
                   cwd=ROOT, check=True, timeout=900)
    redis_harness.REDIS_SERVER = shutil.which("redis-server")
    redis_harness.REDIS_CLI = shutil.which("redis-cli")


def command_line(argv):
    """The command as run, without the binary's path and --update-readme."""
    out, skip = ["bench/failure/run.py"], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a == "--binary":
            skip = True
            continue
        if a.startswith("--binary=") or a == "--update-readme":
            continue
        out.append(shlex.quote(a))
    return " ".join(out)


README_BEGIN = "<!-- figures: bench/failure/run.py begin -->"
README_END = "<!-- figures: bench/failure/run.py end -->"


def update_readme(text):
    """Replaces what lies between the two markers in README.md."""
    path = os.path.join(ROOT, "README.md")
    with open(path) as f:
        readme = f.read()
    begin, end = readme.find(README_BEGIN), readme.find(README_END)
    if begin < 0 or end < begin:
        raise RuntimeError("README.md has no %s ... %s markers" % (README_BEGIN, README_END))
    readme = readme[:begin + len(README_BEGIN)] + "\n" + text + readme[end:]
    with open(path + ".tmp", "w") as f:
        f.write(readme)
    os.replace(path + ".tmp", path)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "release", "sluice"),
                    help="the sluice binary (default: build/release/sluice)")
    ap.add_argument("--only", default=",".join(SCENARIOS),
                    help="scenarios, comma-separated: %s" % ",".join(SCENARIOS))
    ap.add_argument("--threads", type=int, default=2, help="sluice server.threads (2)")
    ap.add_argument("--redis-timeout", default="50ms", help="store.redis.timeout (50ms)")
    ap.add_argument("--update-readme", action="store_true",
                    help="also write the output between the markers in README.md")
    g = ap.add_argument_group("kill, pause: the paced load")
    g.add_argument("--rate", type=int, default=400, help="checks per second (400)")
    g.add_argument("--conns", type=int, default=4, help="connections (4)")
    g.add_argument("--warmup", type=float, default=0.5, help="seconds not measured (0.5)")
    g.add_argument("--before", type=float, default=2.0, help="seconds before the fault (2)")
    g.add_argument("--dead", type=float, default=3.0, help="seconds Redis stays dead (3)")
    g.add_argument("--pause", type=float, default=2.0, help="seconds Redis is stopped (2)")
    g.add_argument("--pause-probes", type=int, default=5,
                   help="checks on one key while Redis is paused, without load (5)")
    g.add_argument("--recovery", type=float, default=2.0,
                   help="seconds of load after Redis is back (2)")
    g = ap.add_argument_group("cluster")
    g.add_argument("--cluster-count", type=int, default=5, choices=range(1, 10),
                   metavar="1..9", help="checks on the key before the kill (5)")
    g.add_argument("--cluster-rate", type=int, default=200, help="load checks per second (200)")
    g.add_argument("--cluster-limit", type=float, default=20.0,
                   help="longest wait for the failover, seconds (20)")
    g = ap.add_argument_group("flood")
    g.add_argument("--flood-keys", type=int, default=1000000, help="unique keys sent (1000000)")
    g.add_argument("--max-keys", type=int, default=100000, help="store.memory.max_keys (100000)")
    g.add_argument("--flood-rate", default="10/1m",
                   help="the limit's rate (10/1m: a key is not fresh for 6 s after a check)")
    g.add_argument("--flood-burst", type=int, default=10, help="the limit's burst (10)")
    g.add_argument("--flood-conns", type=int, default=32, help="wrk connections (32)")
    g.add_argument("--flood-seconds", type=int, default=90, help="wrk -d, the bound (90)")
    g.add_argument("--flood-settle", type=float, default=3.0,
                   help="seconds after the flood before 'after' (3)")
    g = ap.add_argument_group("fds")
    g.add_argument("--nofile", type=int, default=256, help="sluice's RLIMIT_NOFILE (256)")
    g.add_argument("--hold-conns", type=int, default=400, help="connections held (400)")
    g.add_argument("--hold-seconds", type=float, default=3.0, help="seconds held (3)")
    args = ap.parse_args(argv)

    chosen = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = set(chosen) - set(SCENARIOS)
    if unknown:
        ap.error("unknown scenario(s) %s; choose from %s" % (", ".join(sorted(unknown)),
                                                            ",".join(SCENARIOS)))
    harness.BINARY = os.path.abspath(args.binary)
    if not os.access(harness.BINARY, os.X_OK):
        ap.error("no sluice binary at %s (build it, or pass --binary)" % args.binary)
    ensure_tools()

    started = subprocess.run(["date", "-u", "+%Y-%m-%d %H:%M UTC"], capture_output=True,
                             text=True).stdout.strip()
    load_start = loadavg()
    info = machine()
    try:
        version = subprocess.run([harness.BINARY, "--version"], capture_output=True, text=True,
                                 timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        version = "?"
    log("%s, %s cores, load %s" % (version, info["nproc"], load_start))

    report = Report()
    cleanups = Cleanups()
    shared = {}
    failed = []

    def on_term(signum, frame):
        raise KeyboardInterrupt()

    signal.signal(signal.SIGTERM, on_term)
    tmp = tempfile.TemporaryDirectory(prefix="sluice-failure-")
    try:
        for name in SCENARIOS:
            if name not in chosen:
                continue
            log("scenario %s" % name)
            try:
                {"kill": scenario_kill, "pause": scenario_pause, "cluster": scenario_cluster,
                 "flood": scenario_flood, "fds": scenario_fds}[name](
                    args, cleanups, tmp.name, report, shared)
            except KeyboardInterrupt:
                raise
            except Exception as e:
                log("scenario %s failed: %r" % (name, e))
                failed.append("%s: %r" % (name, e))
                cleanups.run()
                shared.clear()
            if name == "pause" or (name == "kill" and "pause" not in chosen):
                cleanups.run()
                shared.clear()
            if name in ("cluster", "flood", "fds"):
                cleanups.run()
    except KeyboardInterrupt:
        log("interrupted; stopping what was started")
    finally:
        cleanups.run()
        tmp.cleanup()

    load_end = loadavg()
    lines = ["Measured %s with `%s`: sluice %s, %s cores (%s), kernel %s, Redis %s; load "
             "average (1, 5, 15 min) %s at the start, %s at the end." % (
                 started, command_line(argv), version.replace("sluice ", ""), info["nproc"],
                 info["cpu"], info["kernel"], info["redis"], load_start, load_end),
             "",
             "| scenario | measure | value |",
             "|---|---|---|"]
    for n in sorted(report.rows):
        for i, (measure, value) in enumerate(report.rows[n]):
            lines.append("| %s | %s | %s |" % ("%d. %s" % (n, report.titles[n]) if i == 0 else "",
                                               measure, value))
    if failed:
        lines.append("")
        lines.extend("- not measured: %s" % f for f in failed)
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.update_readme:
        if failed:
            log("README.md not updated: some scenarios were not measured")
        else:
            update_readme(text)
            log("README.md updated")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
