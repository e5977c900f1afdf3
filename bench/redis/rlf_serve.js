// The rate-limiter-flexible peer of `sluice serve` (bench/redis/serve.sh):
// a Node HTTP server answering POST /v1/check ({"policy": ..., "key": ...},
// as sluice's decision API) with RateLimiterRedis.consume(key) over one
// ioredis connection, its fixed window at a rate nobody reaches: 200 when
// allowed, 429 when denied, 503 when Redis fails. One process, as Node
// services run; wrk drives it as it drives sluice. It prints its port once
// it listens, and the decisions it made when it gets SIGTERM.
//
//   node rlf_serve.js --redis-port 6379 --port 0
'use strict';
const http = require('http');
const Redis = require('ioredis');
const { RateLimiterRedis, RateLimiterRes } = require('rate-limiter-flexible');

function flags() {
  const out = { 'redis-port': 6379, port: 0 };
  const argv = process.argv.slice(2);
  for (let i = 0; i + 1 < argv.length; i += 2) {
    const name = argv[i].replace(/^--/, '');
    if (!(name in out)) throw new Error(`unknown flag ${argv[i]}`);
    out[name] = Number(argv[i + 1]);
  }
  return out;
}

async function main() {
  const f = flags();
  const redis = new Redis({ host: '127.0.0.1', port: f['redis-port'], enableOfflineQueue: false,
                            lazyConnect: true });
  await redis.connect();
  const limiter = new RateLimiterRedis({
    storeClient: redis, keyPrefix: 'rlf-serve', points: 1e6, duration: 1,
  });
  let decisions = 0;
  const answer = (res, code, body) => {
    res.writeHead(code, { 'Content-Type': 'application/json', 'Content-Length': body.length });
    res.end(body);
  };
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      let key;
      try {
        key = JSON.parse(Buffer.concat(chunks).toString()).key;
      } catch (e) {
        return answer(res, 400, '{"error":"bad body"}');
      }
      if (typeof key !== 'string') return answer(res, 400, '{"error":"no key"}');
      limiter.consume(key).then(
        (r) => { decisions++; answer(res, 200, `{"allowed":true,"remaining":${r.remainingPoints}}`); },
        (e) => {
          if (!(e instanceof RateLimiterRes)) return answer(res, 503, '{"error":"store"}');
          decisions++;
          answer(res, 429, '{"allowed":false}');
        });
    });
  });
  server.keepAliveTimeout = 60000;
  server.listen(f.port, '127.0.0.1', () => console.log(server.address().port));
  process.on('SIGTERM', () => {
    console.log(JSON.stringify({ decisions }));
    server.close();
    redis.disconnect();
    process.exit(0);
  });
}

main().catch((e) => { console.error(e); process.exit(2); });
