# Sourced by the benchmark scripts (bench/http/*.sh, bench/redis/*.sh,
# bench/grpc/*.sh), from the repository's root: the release binary, loopback
# ports, the benchmark's redis-server, the Node peer, the gRPC benchmarks'
# rules and request bodies, a work folder cleaned at exit.

# A TCP port on 127.0.0.1 that nothing listens on now.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Waits up to 5 s for something to listen on 127.0.0.1:$1.
wait_port() {
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "nothing listens on port $1" >&2; return 1
}

# The path of a release binary: $1 when given (another build's, to compare
# two versions), else build/release/$3, built (target $2, release preset)
# when missing.
release_binary() {
  local path=${1:-$PWD/build/release/$3}
  if [[ ! -x "$path" ]]; then
    timeout 900 cmake --preset release >/dev/null
    timeout 900 cmake --build build/release --target "$2" >/dev/null
  fi
  echo "$path"
}

# A work folder for the script (WORK), and at exit the server it started
# (its PID in SERVER_PID, when set) stopped, by PID, and the folder removed.
work_dir_with_cleanup() {
  WORK=$(mktemp -d)
  SERVER_PID=""
  trap 'if [[ -n "$SERVER_PID" ]]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi; rm -rf "$WORK"' EXIT
}

# A redis-server on a free loopback port (PORT) under valgrind's callgrind,
# counting only inside `fcallCommand` (sluice's function, the commands it
# calls, their replies), persistence off; its counts in
# $WORK/callgrind.out.<pid>[.<dump>], its PID in SERVER_PID (stopped at exit
# by work_dir_with_cleanup, whose WORK it needs). Returns once it answers.
start_callgrind_redis() {
  PORT=$(free_port)
  rm -f "$WORK"/callgrind.out.*
  valgrind --tool=callgrind --toggle-collect=fcallCommand \
    --callgrind-out-file="$WORK/callgrind.out.%p" \
    redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$WORK" \
    2>"$WORK/valgrind.log" >"$WORK/redis.log" &
  SERVER_PID=$!
  for _ in $(seq 300); do
    timeout 5 redis-cli -p "$PORT" PING >/dev/null 2>&1 && break
    sleep 0.1
  done
}

# Starts the redis-server a benchmark runs against: a free loopback port,
# persistence off (no fork for RDB or AOF in the middle of a run), its
# files in a new temporary folder. Sets PORT, REDIS_PID, WORK (the folder,
# for the benchmark's files too) and RCLI (redis-cli on it); at exit stops
# it, by PID, and removes WORK. Arguments are added to redis-server's.
start_bench_redis() {
  WORK=${WORK:-$(mktemp -d)}
  PORT=$(free_port)
  redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
    --dir "$WORK" --logfile "$WORK/redis.log" "$@" &
  REDIS_PID=$!
  trap stop_bench_redis EXIT
  RCLI=(timeout 10 redis-cli -p "$PORT")
  for _ in $(seq 100); do
    redis-cli -p "$PORT" PING >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "redis-server did not start on port $PORT" >&2; return 1
}

stop_bench_redis() {
  if [[ -n "${REDIS_PID:-}" ]]; then
    kill "$REDIS_PID" 2>/dev/null || true
    wait "$REDIS_PID" 2>/dev/null || true
  fi
  rm -rf "${WORK:-}"
}

# The Node peer of the Redis benchmarks (rate-limiter-flexible over ioredis),
# at the versions bench/redis/package.json pins, in bench/redis/node_modules
# (ignored by git); node and npm from Debian when missing. Sets PEER_VERSIONS
# ("<rate-limiter-flexible> <ioredis>").
install_rlf_peer() {
  local dir=bench/redis have
  command -v node >/dev/null && command -v npm >/dev/null || sluice_install_deps nodejs npm
  PEER_VERSIONS=$(node -e 'const p=require(process.argv[1]).dependencies; console.log(p["rate-limiter-flexible"], p.ioredis)' "$PWD/$dir/package.json")
  have=$(cd "$dir" && node -e 'console.log(require("rate-limiter-flexible/package.json").version, require("ioredis/package.json").version)' 2>/dev/null || true)
  if [[ "$PEER_VERSIONS" != "$have" ]]; then
    timeout 300 npm install --prefix "$dir" --no-package-lock --no-audit --no-fund --silent
  fi
}

# The Envoy rules of the gRPC benchmarks (bench/grpc/run.sh, vs_http.sh), as
# YAML: domain `bench`, descriptor `pass` (a rate nobody reaches) and `deny`
# (1 a minute).
bench_envoy_rules() {
  cat <<'CONF'
envoy:
  - domain: bench
    descriptors:
      - key: pass
        rate_limit: {unit: second, requests_per_unit: 1000000000}
      - key: deny
        rate_limit: {unit: minute, requests_per_unit: 1}
CONF
}

# Writes the gRPC bodies of the two ShouldRateLimit calls the Envoy rules of
# bench_envoy_rules decide, to $1/pass.bin and $1/deny.bin: a
# length-prefixed RateLimitRequest (rls.proto: domain = 1, descriptors = 2;
# a descriptor's entries = 1; an entry's key = 1, value = 2), one
# descriptor {pass|deny: k0} in domain `bench`.
rls_request_bodies() {
  python3 - "$1" <<'PY'
import sys
def field(n, b): return bytes([(n << 3) | 2, len(b)]) + b
for case in ("pass", "deny"):
    entry = field(1, case.encode()) + field(2, b"k0")
    msg = field(1, b"bench") + field(2, field(1, entry))
    open(f"{sys.argv[1]}/{case}.bin", "wb").write(b"\0" + len(msg).to_bytes(4, "big") + msg)
PY
}

# Starts the upstream the gateway benchmarks forward to: NGINX (the binary
# $1), one worker, answering every request 200 "ok" on 127.0.0.1:$3, its
# files in folder $2. Sets UPSTREAM_PID (the caller stops it, by PID, and
# waits for the port).
start_upstream_nginx() {  # $4: the listen directive's tail (e.g. "ssl; ssl_certificate ...")
  local nginx=$1 dir=$2 port=$3 listen_tail=${4:-}
  mkdir -p "$dir"
  cat > "$dir/nginx.conf" <<CONF
worker_processes 1;
daemon off; pid $dir/nginx.pid; error_log $dir/error.log warn;
events { worker_connections 4096; }
http { access_log off;
  server { listen 127.0.0.1:$port $listen_tail; keepalive_requests 100000000;
           location / { return 200 "ok\n"; } } }
CONF
  "$nginx" -c "$dir/nginx.conf" -p "$dir" &
  UPSTREAM_PID=$!
}
