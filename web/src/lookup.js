// "Why was I limited?": one key's state in one policy (GET
// /v1/keys/{policy}/{key}): each limit's remaining quota and reset, and what
// the next request would be told. Reading takes nothing from the key.

import {getJson, segment} from './api.js';
import {byId, fill, h} from './dom.js';
import {displayKey, fmtClock, fmtInt, fmtMs, isNever} from './format.js';

const kFollowMs = 2000;

export class Lookup {
  constructor() {
    this.form = byId('lookup-form');
    this.policy = byId('lookup-policy');
    this.key = byId('lookup-key');
    this.follow = byId('lookup-follow');
    this.result = byId('lookup-result');
    this.current = null;  // {policy, key} being shown
    this.timer = null;
    this.form.addEventListener('submit', (e) => {
      e.preventDefault();
      this.run(this.policy.value, this.key.value);
    });
    this.follow.addEventListener('change', () => this.schedule());
  }

  // The policy choices, from /v1/config; the selection stays when it still exists.
  setPolicies(policies) {
    const chosen = this.policy.value;
    const names = policies.map((p) => p.name);
    const same = names.length === this.policy.options.length &&
      names.every((n, i) => this.policy.options[i].value === n);
    if (same) return;
    fill(this.policy, names.map((n) => h('option', {value: n}, n)));
    if (names.includes(chosen)) this.policy.value = chosen;
  }

  // From a click in the top keys table.
  pick(policy, key) {
    if (![...this.policy.options].some((o) => o.value === policy)) {
      this.policy.append(h('option', {value: policy}, policy));
    }
    this.policy.value = policy;
    this.key.value = key;
    this.form.scrollIntoView({behavior: 'smooth', block: 'center'});
    this.run(policy, key);
  }

  async run(policy, key) {
    clearTimeout(this.timer);
    this.timer = null;
    if (!policy) return this.showError('No policy chosen.');
    if (key === '') return this.showError('Type a key: the client address or whatever the policy counts by.');
    if (key === '.' || key === '..') {
      return this.showError('The keys "." and ".." cannot be looked up: a URL path cannot carry them.');
    }
    this.current = {policy, key};
    const path = '/v1/keys/' + segment(policy) + '/' + segment(key);
    this.result.classList.add('loading');
    try {
      const answer = await getJson(path);
      if (!this.same(policy, key)) return;
      this.render(answer, path);
    } catch (e) {
      if (!this.same(policy, key)) return;
      this.showError(e.message);
    } finally {
      this.result.classList.remove('loading');
    }
    this.schedule();
  }

  same(policy, key) {
    return this.current && this.current.policy === policy && this.current.key === key;
  }

  schedule() {
    clearTimeout(this.timer);
    this.timer = null;
    if (this.follow.checked && this.current) {
      const {policy, key} = this.current;
      this.timer = setTimeout(() => {
        if (document.hidden) this.schedule();
        else this.run(policy, key);
      }, kFollowMs);
    }
  }

  showError(message) {
    this.result.dataset.verdict = 'error';
    fill(this.result, h('div', {class: 'error-box'}, message));
  }

  render(answer, path) {
    const limits = answer.limits || [];
    const denied = limits.filter((l) => !l.next_request_allowed);
    // A denied request waits for the slowest limit (the limiter asks them
    // all and reports the longest wait); null: never.
    const never = denied.some((l) => isNever(l.next_request_retry_after_ms));
    const retry = never ? null : Math.max(0, ...denied.map((l) => l.next_request_retry_after_ms || 0));
    const delay = Math.max(0, ...limits.map((l) => l.next_request_delay_ms || 0));
    const remaining = limits.length ? Math.min(...limits.map((l) => l.remaining)) : null;
    let verdict;
    if (denied.length > 0) {
      verdict = h('div', {class: 'verdict verdict-denied'},
        h('strong', {}, 'Next request: denied'),
        h('span', {}, never ? 'its cost is above what this policy can ever admit'
          : 'retry after ' + fmtMs(retry)),
        h('span', {class: 'muted'}, 'by ' + denied.map((l) => l.algorithm + ' ' + l.rate).join(', ')));
    } else if (delay > 0) {
      verdict = h('div', {class: 'verdict verdict-delayed'},
        h('strong', {}, 'Next request: allowed after a delay'),
        h('span', {}, 'held ' + fmtMs(delay) + ' (shaping)'),
        h('span', {class: 'muted'}, fmtInt(remaining) + ' remaining'));
    } else {
      verdict = h('div', {class: 'verdict verdict-allowed'},
        h('strong', {}, 'Next request: allowed'),
        h('span', {}, fmtInt(remaining) + ' remaining'));
    }
    const rows = limits.map((l) => h('tr', {
      class: l.next_request_allowed ? '' : 'row-denied',
      dataset: {remaining: l.remaining, allowed: l.next_request_allowed},
    },
    h('td', {}, l.algorithm), h('td', {}, l.rate),
    h('td', {class: 'num'}, fmtInt(l.limit)),
    h('td', {class: 'num remaining'}, fmtInt(l.remaining)),
    h('td', {class: 'num'}, fmtMs(l.reset_after_ms)),
    h('td', {class: l.next_request_allowed ? 'ok' : 'bad'}, l.next_request_allowed ? 'allowed' : 'denied'),
    h('td', {class: 'num'}, l.next_request_allowed ? '–' : fmtMs(l.next_request_retry_after_ms)),
    h('td', {class: 'num'}, l.next_request_delay_ms ? fmtMs(l.next_request_delay_ms) : '–')));
    this.result.dataset.verdict = denied.length > 0 ? 'denied' : 'allowed';
    this.result.dataset.remaining = String(remaining);
    fill(this.result,
      h('p', {class: 'lookup-head'}, h('span', {class: 'policy-ref'}, answer.policy), ' · ',
        h('code', {class: 'key-text'}, displayKey(answer.key))),
      verdict,
      h('table', {class: 'grid-table lookup-table'},
        h('thead', {}, h('tr', {},
          h('th', {}, 'algorithm'), h('th', {}, 'rate'), h('th', {class: 'num'}, 'limit'),
          h('th', {class: 'num'}, 'remaining'), h('th', {class: 'num'}, 'resets in'),
          h('th', {}, 'next request'), h('th', {class: 'num'}, 'retry after'),
          h('th', {class: 'num'}, 'delay'))),
        h('tbody', {}, rows)),
      h('p', {class: 'muted small'}, 'as of ' + fmtClock(Date.now()) + ' · GET ', h('code', {}, path)));
  }
}
