# Sourced by the benchmark scripts (bench/http/run.sh, bench/redis/run.sh,
# bench/redis/serve.sh), from the repository's root: loopback ports.

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

# Starts the redis-server a benchmark runs against: a free loopback port,
# persistence off (no fork for RDB or AOF in the middle of a run), its
# files in a new temporary folder. Sets PORT, REDIS_PID, WORK (the folder,
# for the benchmark's files too) and RCLI (redis-cli on it); at exit stops
# it, by PID, and removes WORK.
start_bench_redis() {
  WORK=$(mktemp -d)
  PORT=$(free_port)
  redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
    --dir "$WORK" --logfile "$WORK/redis.log" &
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
