// The rate-limiter-flexible peer of sluice_bench_redis (bench/redis/run.sh):
// RateLimiterRedis over one ioredis connection, fixed window (its only
// algorithm), `--inflight` consume() calls kept in flight for `--seconds`
// over `--keys` keys "user-<12 digits>" picked uniformly. Prints one JSON
// line shaped like sluice_bench_redis's, calls read from Redis' INFO
// commandstats (EVALSHA + EVAL calls per decision). With `--rate R` (R > 0)
// the calls start no faster than R a second in all (the lanes take turns
// at a schedule of one every 1/R s; a lane whose turn has not come waits):
// the peer at the rate another run reached, so that Redis is as busy.
//
//   node rlf_bench.js --port 6379 --inflight 64 --seconds 3 --keys 1 --mode pass [--rate 0]
'use strict';
const Redis = require('ioredis');
const { RateLimiterRedis, RateLimiterRes } = require('rate-limiter-flexible');

function flags() {
  const out = { port: 6379, inflight: 1, seconds: 3, keys: 1, mode: 'pass', rate: 0 };
  const argv = process.argv.slice(2);
  for (let i = 0; i + 1 < argv.length; i += 2) {
    const name = argv[i].replace(/^--/, '');
    if (!(name in out)) throw new Error(`unknown flag ${argv[i]}`);
    out[name] = name === 'mode' ? argv[i + 1] : Number(argv[i + 1]);
  }
  if (out.mode !== 'pass' && out.mode !== 'deny') throw new Error('--mode is pass or deny');
  return out;
}

function keyName(n) {
  return 'user-' + String(n).padStart(12, '0');
}

async function commandCalls(redis) {
  const text = await redis.info('commandstats');
  const calls = {};
  for (const m of text.matchAll(/cmdstat_([^:]+):calls=(\d+),usec=(\d+)/g)) {
    calls[m[1]] = Number(m[2]);
    calls[m[1] + ' usec'] = Number(m[3]);
  }
  return calls;
}

async function main() {
  const f = flags();
  const redis = new Redis({ host: '127.0.0.1', port: f.port, enableOfflineQueue: false,
                            lazyConnect: true });
  await redis.connect();
  // pass: a rate nobody reaches here (as sluice's 1000000/s);
  // deny: one per minute, so every decision after a key's first is denied.
  const limiter = new RateLimiterRedis({
    storeClient: redis,
    keyPrefix: 'rlf-bench',
    points: f.mode === 'pass' ? 1e6 : 1,
    duration: f.mode === 'pass' ? 1 : 60,
  });
  const keys = [];
  for (let i = 0; i < f.keys; i++) keys.push(keyName(i));
  // One call first, so that the script is loaded (ioredis sends EVALSHA,
  // then EVAL once on NOSCRIPT) before the counters are read.
  await limiter.consume(keys[0]).catch(() => {});

  const before = await commandCalls(redis);
  const latency = [];
  let done = 0, allowed = 0, errors = 0;
  let stop = false;
  let rng = 0x2545F491;
  const pick = () => {
    if (keys.length === 1) return keys[0];
    rng ^= rng << 13; rng ^= rng >>> 17; rng ^= rng << 5;  // xorshift32
    return keys[(rng >>> 0) % keys.length];
  };
  const start = process.hrtime.bigint();
  let last = start;
  let started = 0;  // calls started: the next one's turn, with --rate
  await new Promise((resolve) => {
    let running = f.inflight;
    const lane = () => {
      if (stop) {
        if (--running === 0) resolve();
        return;
      }
      if (f.rate > 0) {
        const due = start + BigInt(Math.floor(started * 1e9 / f.rate));
        const now = process.hrtime.bigint();
        if (now < due) {
          setTimeout(lane, Number(due - now) / 1e6);
          return;
        }
      }
      started++;
      const t0 = process.hrtime.bigint();
      const finish = (ok, isAllowed) => {
        const t1 = process.hrtime.bigint();
        latency.push(Number(t1 - t0));
        done++;
        if (!ok) errors++;
        else if (isAllowed) allowed++;
        last = t1;
        lane();
      };
      limiter.consume(pick()).then(
        () => finish(true, true),
        (e) => finish(e instanceof RateLimiterRes, false));
    };
    for (let i = 0; i < f.inflight; i++) lane();
    setTimeout(() => { stop = true; }, f.seconds * 1000);
  });
  const after = await commandCalls(redis);
  redis.disconnect();

  const seconds = Number(last - start) / 1e9;
  latency.sort((a, b) => a - b);
  const pct = (p) => latency.length ? latency[Math.min(latency.length - 1,
                                                         Math.floor(p * latency.length))] : 0;
  const delta = (name) => (after[name] || 0) - (before[name] || 0);
  let inner = 0;
  for (const name of Object.keys(after)) {
    if (!name.endsWith(' usec') && !['evalsha', 'eval', 'info'].includes(name)) {
      inner += delta(name);
    }
  }
  const n = Math.max(done, 1);
  console.log(JSON.stringify({
    side: 'rlf', algorithm: 'fixed_window', mode: f.mode, depth: f.inflight, keys: f.keys,
    seconds: Number(seconds.toFixed(3)), decisions: done,
    decisions_per_s: Math.round(done / seconds),
    p50_us: Number((pct(0.5) / 1e3).toFixed(1)), p99_us: Number((pct(0.99) / 1e3).toFixed(1)),
    allowed_fraction: Number((allowed / n).toFixed(4)), errors,
    calls_per_decision: Number(((delta('evalsha') + delta('eval')) / n).toFixed(3)),
    script_commands_per_decision: Number((inner / n).toFixed(3)),
    // Time inside Redis' EVALSHA per decision: the script's own cost.
    redis_us_per_decision: Number((delta('evalsha usec') / n).toFixed(2)),
  }));
  process.exitCode = errors === 0 ? 0 : 1;
}

main().catch((e) => { console.error(e); process.exit(2); });
