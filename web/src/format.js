// Numbers, durations and keys as an operator reads them.

const kInt = new Intl.NumberFormat('en-US', {maximumFractionDigits: 0});

export function fmtInt(n) {
  return n === null || n === undefined || Number.isNaN(n) ? '–' : kInt.format(n);
}

// An infinite wait, as the API writes it: null, or a number of milliseconds
// beyond any real wait (a thousand years).
export function isNever(ms) {
  return ms === null || ms === undefined || ms >= 3.2e13;
}

// 850 ms, 12.3 s, 4 min 05 s, 3 h 12 min, 2 d 4 h; null is "never" (a cost
// above what the limit can ever admit has no retry time).
export function fmtMs(ms) {
  if (isNever(ms)) return 'never';
  if (ms < 1000) return Math.round(ms) + ' ms';
  const s = ms / 1000;
  if (s < 60) return (s < 10 ? s.toFixed(1) : Math.round(s)) + ' s';
  const total = Math.round(s);
  const d = Math.floor(total / 86400);
  const hr = Math.floor((total % 86400) / 3600);
  const min = Math.floor((total % 3600) / 60);
  const sec = total % 60;
  if (d > 0) return d + ' d ' + hr + ' h';
  if (hr > 0) return hr + ' h ' + String(min).padStart(2, '0') + ' min';
  return min + ' min ' + String(sec).padStart(2, '0') + ' s';
}

export function fmtClock(unixMs) {
  const d = new Date(unixMs);
  const p = (n) => String(n).padStart(2, '0');
  return p(d.getHours()) + ':' + p(d.getMinutes()) + ':' + p(d.getSeconds());
}

// 2026-12-02 03:12:45 (local time).
export function fmtDateTime(unixMs) {
  const d = new Date(unixMs);
  const p = (n) => String(n).padStart(2, '0');
  return d.getFullYear() + '-' + p(d.getMonth() + 1) + '-' + p(d.getDate()) + ' ' + fmtClock(unixMs);
}

export function fmtAgo(unixMs, nowMs = Date.now()) {
  return fmtMs(Math.max(0, nowMs - unixMs)) + ' ago';
}

// Characters that would hide or disguise a key on screen: controls, and
// the invisible and direction-changing ones (a key with U+202E reads
// backwards). Shown as \u{...} instead; the key itself is kept as sent.
const kHidden = /[\u0000-\u001f\u007f-\u009f\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\ufff9-\ufffb]/gu;

export function displayKey(key) {
  if (key === '') return '(empty)';
  return key.replace(kHidden, (c) => '\\u{' + c.codePointAt(0).toString(16) + '}');
}

export function sum(values) {
  let s = 0;
  for (const v of values) s += v;
  return s;
}
