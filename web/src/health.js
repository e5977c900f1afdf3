// Whether the page is live: each poll reports here, and the red banner names
// every poll that fails now, with the server's words, until it succeeds again.

import {byId, fill, h, setText} from './dom.js';
import {fmtAgo, fmtClock} from './format.js';

const failing = new Map();  // what -> message
let lastOk = 0;

export function ok(what) {
  lastOk = Date.now();
  if (failing.delete(what)) render();
  else renderState();
}

export function failed(what, error) {
  failing.set(what, error && error.message ? error.message : String(error));
  render();
}

function render() {
  const banner = byId('banner');
  if (failing.size === 0) {
    banner.hidden = true;
    banner.replaceChildren();
  } else {
    fill(banner,
      h('strong', {}, 'Not live: '),
      [...failing].map(([what, message]) => h('span', {class: 'banner-item'}, h('code', {}, what), ' ', message)),
      h('span', {class: 'banner-note'}, lastOk
        ? 'Last good answer ' + fmtAgo(lastOk) + '; retrying.' : 'Retrying.'));
    banner.hidden = false;
  }
  renderState();
}

// The header's dot: green and the time of the last answer, or red.
export function renderState() {
  const state = byId('live-state');
  const bad = failing.size > 0;
  state.classList.toggle('bad', bad);
  state.classList.toggle('good', !bad && lastOk > 0);
  setText(state, bad ? 'not live' : lastOk ? 'live · ' + fmtClock(lastOk) : 'connecting…');
}
