// Top limited keys: per policy, the keys denied most over the server's
// window (GET /v1/top). The counts come from a bounded summary: a key's true
// count lies between `denied - error` and `denied`. Keys are whatever
// clients sent: shown as text, invisible characters made visible, and a
// click puts the key as sent into the lookup form.
//
// Tables and rows are updated in place (a row per key is kept while the key
// is listed), so a refresh never swaps the element under the mouse.

import {byId, fill, h, setText} from './dom.js';
import {displayKey, fmtInt} from './format.js';

class PolicyTable {
  constructor(policy, onPick) {
    this.policy = policy;
    this.onPick = onPick;
    this.rows = new Map();  // key -> {tr, rank, count, bar, error}
    this.body = h('tbody');
    this.card = h('article', {class: 'card top-card', dataset: {policy}},
      h('header', {class: 'card-head'}, h('h3', {class: 'policy-name', title: policy}, policy)),
      h('table', {class: 'grid-table top-table'},
        h('thead', {}, h('tr', {},
          h('th', {class: 'num'}, '#'), h('th', {}, 'key'), h('th', {class: 'num'}, 'denied'),
          h('th', {class: 'num', title: 'the true count is between denied − error and denied'}, 'error'))),
        this.body));
  }

  row(key) {
    let r = this.rows.get(key);
    if (!r) {
      r = {rank: h('td', {class: 'num rank'}), count: h('span', {class: 'count'}), bar: h('span', {class: 'bar'}),
        error: h('td', {class: 'num muted', title: 'the true count is between denied − error and denied'})};
      r.tr = h('tr', {dataset: {key}},
        r.rank,
        h('td', {class: 'key-cell'},
          h('button', {type: 'button', class: 'key-link', title: 'Look up ' + displayKey(key),
            onclick: () => this.onPick(this.policy, key)}, displayKey(key))),
        h('td', {class: 'num denied-cell'}, h('span', {class: 'bar-track'}, r.bar), r.count),
        r.error);
      this.rows.set(key, r);
    }
    return r;
  }

  update(entries) {
    const max = Math.max(1, ...entries.map((e) => e.denied));
    const listed = new Set();
    entries.forEach((e, i) => {
      const r = this.row(e.key);
      listed.add(e.key);
      setText(r.rank, i + 1);
      setText(r.count, fmtInt(e.denied));
      setText(r.error, e.error ? '±' + fmtInt(e.error) : '');
      r.bar.style.width = (100 * e.denied / max).toFixed(1) + '%';
      r.tr.dataset.denied = String(e.denied);
      r.tr.dataset.error = String(e.error || 0);
      if (this.body.children[i] !== r.tr) this.body.insertBefore(r.tr, this.body.children[i] || null);
    });
    for (const [key, r] of this.rows) {
      if (!listed.has(key)) {
        r.tr.remove();
        this.rows.delete(key);
      }
    }
  }
}

export class TopKeys {
  constructor(onPick) {
    this.onPick = onPick;
    this.order = [];
    this.tables = new Map();  // policy -> PolicyTable
  }

  setPolicies(policies) {
    this.order = policies.map((p) => p.name);
  }

  update(json) {
    const policies = json.policies || {};
    const rank = (name) => {
      const i = this.order.indexOf(name);
      return i < 0 ? this.order.length : i;
    };
    const names = Object.keys(policies).sort((a, b) => rank(a) - rank(b) || (a < b ? -1 : 1));
    const withKeys = names.filter((n) => (policies[n] || []).length > 0);
    const quiet = names.filter((n) => (policies[n] || []).length === 0);
    const minutes = Math.round((json.window_s || 300) / 60);
    setText(byId('top-window'), 'last ' + minutes + ' min');

    const container = byId('top-tables');
    for (const [name, table] of this.tables) {
      if (!withKeys.includes(name)) {
        table.card.remove();
        this.tables.delete(name);
      }
    }
    withKeys.forEach((name, i) => {
      let table = this.tables.get(name);
      if (!table) {
        table = new PolicyTable(name, this.onPick);
        this.tables.set(name, table);
      }
      table.update(policies[name]);
      if (container.children[i] !== table.card) container.insertBefore(table.card, container.children[i] || null);
    });
    fill('top-quiet',
      withKeys.length === 0
        ? 'No key was denied in the last ' + minutes + ' min.'
        : quiet.length > 0 ? ['No denials: ', quiet.map((n, i) => [i ? ', ' : '', h('span', {class: 'policy-ref'}, n)])] : null);
  }
}
