// The dashboard served at / on the admin listener: live decisions, the keys
// limited most, one key's state, what is in force, and the simulator. It
// reads the admin API only (same origin, GET but for POST /v1/sim) and
// polls: every second for the charts, every few seconds for the rest, not
// at all while the tab is hidden.

import 'uplot/dist/uPlot.min.css';
import './dashboard.css';

import {getJson} from './api.js';
import * as health from './health.js';
import {renderConfig, renderStatus, tickUptime} from './inforce.js';
import {LiveCharts} from './live.js';
import {Lookup} from './lookup.js';
import {Simulator} from './sim.js';
import {TopKeys} from './top.js';

const live = new LiveCharts();
const lookup = new Lookup();
const top = new TopKeys((policy, key) => lookup.pick(policy, key));
const sim = new Simulator();

// Runs fn now and then `ms` after each run ends (never two at once); a
// failure shows in the banner until a run succeeds. With {once: true}, stops
// after the first success.
function every(what, ms, fn, {once = false} = {}) {
  let timer = null;
  let running = false;
  let done = false;
  async function run() {
    clearTimeout(timer);
    timer = null;
    if (running) return;
    if (document.hidden) return;  // resumed by visibilitychange
    running = true;
    try {
      await fn();
      health.ok(what);
      if (once) done = true;
    } catch (e) {
      health.failed(what, e);
    } finally {
      running = false;
    }
    if (!done) timer = setTimeout(run, ms);
  }
  document.addEventListener('visibilitychange', () => {
    if (!document.hidden && !done) run();
  });
  run();
  return run;
}

let loadedAt = null;
const refreshConfig = every('GET /v1/config', 15000, async () => {
  const config = await getJson('/v1/config');
  const policies = config.policies || [];
  renderConfig(config);
  live.setPolicies(policies);
  top.setPolicies(policies);
  lookup.setPolicies(policies);
});

every('GET /v1/status', 5000, async () => {
  const status = await getJson('/v1/status');
  renderStatus(status);
  // A reload: read the policies again now, not in up to 15 s.
  const at = status.config && status.config.loaded_at_ms;
  if (loadedAt !== null && at !== loadedAt) refreshConfig();
  loadedAt = at;
});

every('GET /v1/series', 1000, async () => {
  live.update(await getJson('/v1/series?seconds=300'));
});

every('GET /v1/top', 5000, async () => {
  top.update(await getJson('/v1/top?n=10'));
});

// The scenarios once; again every 10 s until that works.
every('GET /v1/sim/scenarios', 10000, () => sim.load(), {once: true});

setInterval(tickUptime, 1000);
