// What is in force: the policies and their limits (GET /v1/config), the
// config file, when it was loaded and the last reload error, the listeners
// and the store (GET /v1/status); and the header's version and uptime.

import {byId, fill, h, setText} from './dom.js';
import {fmtAgo, fmtDateTime, fmtInt, fmtMs} from './format.js';

// "token_bucket 1/min burst 3", "concurrency 10 (lease 30s)", ...
export function describeLimit(l) {
  const parts = [l.algorithm];
  if (l.mode) parts.push(l.mode);
  if (l.rate !== undefined) parts.push(l.rate);
  else if (l.limit !== undefined) parts.push(String(l.limit) + ' at once');
  if (l.burst !== undefined) parts.push('burst ' + l.burst);
  if (l.max_delay !== undefined) parts.push('max_delay ' + l.max_delay);
  if (l.queue !== undefined) parts.push('queue ' + l.queue);
  if (l.lease_ttl !== undefined) parts.push('lease ' + l.lease_ttl);
  if (l.scope && l.scope !== 'local') parts.push('(' + l.scope + ')');
  return parts.join(' ');
}

function describeMatch(m) {
  if (!m) return 'every request';
  const parts = [];
  if (m.method) parts.push(m.method);
  if (m.host) parts.push('host ' + m.host);
  if (m.path) parts.push('path ' + m.path);
  if (m.path_prefix) parts.push('path ' + m.path_prefix + '*');
  if (m.headers) {
    for (const [k, v] of Object.entries(m.headers)) parts.push(k + ': ' + (typeof v === 'string' ? v : JSON.stringify(v)));
  }
  return parts.join(' · ') || 'every request';
}

export function renderConfig(config) {
  const policies = config.policies || [];
  setText(byId('config-source'), config.source || '(none)');
  const rows = policies.map((p) => h('tr', {dataset: {policy: p.name}},
    h('td', {}, h('span', {class: 'policy-ref'}, p.name),
      p.shadow ? [' ', h('span', {class: 'badge badge-shadow'}, 'shadow')] : null),
    h('td', {}, (p.key || []).join(' + ') || '–'),
    h('td', {}, (p.limits || []).map((l) => h('div', {class: 'limit-line'}, describeLimit(l)))),
    h('td', {}, describeMatch(p.match)),
    h('td', {class: 'num'}, p.on_deny && p.on_deny.status ? String(p.on_deny.status) : '')));
  fill('policies-body', rows.length ? rows
    : h('tr', {}, h('td', {colspan: 5, class: 'muted'}, 'No policies.')));
  setText(byId('policies-count'), policies.length + (policies.length === 1 ? ' policy' : ' policies') +
    ((config.routes || []).length ? ', ' + config.routes.length + ' routes' : ''));
}

export function renderStatus(status) {
  const now = Date.now();
  const config = status.config || {};
  if (config.source) setText(byId('config-source'), config.source);
  setText(byId('config-loaded'), config.loaded_at_ms
    ? fmtDateTime(config.loaded_at_ms) + ' (' + fmtAgo(config.loaded_at_ms, now) + ')' : '–');
  // Reload counts, where the server reports them (else /metrics has them).
  const reloads = config.reloads;
  byId('config-reloads').hidden = byId('config-reloads-label').hidden = !reloads;
  if (reloads) {
    setText(byId('config-reloads'), fmtInt(reloads.ok || 0) + ' ok, ' + fmtInt(reloads.failed || 0) + ' failed');
  }
  const error = config.last_reload_error;
  const box = byId('reload-error');
  if (error) {
    // Still in force: the error is newer than the config loaded last.
    const current = !config.loaded_at_ms || error.at_ms >= config.loaded_at_ms;
    box.className = current ? 'error-box' : 'warn-box';
    fill(box,
      h('strong', {}, current ? 'The last reload failed' : 'An earlier reload failed'),
      ' at ' + fmtDateTime(error.at_ms) + ' (' + fmtAgo(error.at_ms, now) + ')' +
        (current ? '. The config loaded before it stays in force.' : '; a later one succeeded.'),
      h('pre', {class: 'error-text'}, error.message));
    box.hidden = false;
  } else {
    box.hidden = true;
  }
  byId('inforce').classList.toggle('has-error', Boolean(error));

  // Where each listener is, and which speak TLS (where the server says it).
  const listeners = status.listeners;
  byId('listeners').hidden = byId('listeners-label').hidden = !Array.isArray(listeners);
  if (Array.isArray(listeners)) {
    fill('listeners', listeners.map((l, i) => [i ? ' · ' : null, String(l.name) + ' ',
      h('code', {}, String(l.listen)),
      l.tls === 'on' || l.tls === 'mutual'
        ? [' ', h('span', {class: 'badge badge-ok'}, l.tls === 'mutual' ? 'mutual TLS' : 'TLS')] : null]));
  }

  const store = status.store || {};
  const memory = store.memory;
  if (memory) {
    setText(byId('mem-keys'), fmtInt(memory.keys) + ' of ' + fmtInt(memory.max_keys));
    const share = memory.max_keys > 0 ? Math.min(1, memory.keys / memory.max_keys) : 0;
    const bar = byId('mem-bar');
    bar.style.width = (share * 100).toFixed(1) + '%';
    bar.classList.toggle('high', share >= 15 / 16);
    setText(byId('mem-fresh'), fmtInt(memory.fresh_evictions));
    setText(byId('mem-forced'), fmtInt(memory.forced_evictions));
    byId('mem-forced').classList.toggle('bad', memory.forced_evictions > 0);
    // What a full store does (store.on_full), where the server says it.
    const full = byId('mem-full');
    full.hidden = byId('mem-full-label').hidden = memory.on_full === undefined;
    if (memory.on_full !== undefined) {
      const counts = [['remembered', memory.remembered], ['recalled', memory.recalled],
        ['new keys denied', memory.denied_new]].filter(([, n]) => n !== undefined);
      fill(full, h('code', {}, String(memory.on_full)),
        counts.length ? h('span', {class: 'num'}, ' · ' + counts.map(([name, n]) => fmtInt(n) + ' ' + name).join(', ')) : null);
      full.classList.toggle('bad', memory.denied_new > 0);
    }
  }
  const redis = store.redis;
  const cell = byId('redis-state');
  if (!redis) {
    fill(cell, h('span', {class: 'muted'}, 'not configured'));
  } else {
    const trouble = [['errors', redis.errors], ['timeouts', redis.timeouts], ['reconnects', redis.reconnects]]
      .filter(([, n]) => n !== undefined);
    fill(cell, h('span', {class: redis.up ? 'badge badge-ok' : 'badge badge-deny'}, redis.up ? 'up' : 'down'),
      ' ' + fmtInt(redis.nodes_up) + ' of ' + fmtInt(redis.nodes) + ' masters connected',
      redis.server ? h('span', {}, ' · ', h('code', {}, String(redis.server))) : null,
      redis.tls ? ' · TLS' : null,
      trouble.length ? h('span', {class: 'muted'}, ' · ' + trouble.map(([name, n]) => fmtInt(n) + ' ' + name).join(', ')) : null);
  }
  renderHeader(status);
}

let startedAt = 0;

export function renderHeader(status) {
  if (status.version) setText(byId('version'), 'v' + String(status.version).replace(/^v/, ''));
  if (status.started_at_ms) startedAt = status.started_at_ms;
  tickUptime();
  const error = status.config && status.config.last_reload_error;
  const loaded = status.config && status.config.loaded_at_ms;
  byId('reload-alert').hidden = !(error && (!loaded || error.at_ms >= loaded));
}

export function tickUptime() {
  if (startedAt) setText(byId('uptime'), 'up ' + fmtMs(Math.max(0, Date.now() - startedAt)));
}
