// What the dashboard's uPlot charts share: axes, ranges and resizing.

import uPlot from 'uplot';

export const kColors = {
  allowed: '#2e7d32',
  delayed: '#b26a00',
  denied: '#c62828',
  shadow_denied: '#6a3d9a',
  offered: '#78909c',
  admitted: '#2e7d32',
  rejected: '#c62828',
};

const kCountIncrs = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1e3, 2e3, 2.5e3, 5e3, 1e4, 2e4,
  2.5e4, 5e4, 1e5, 2e5, 2.5e5, 5e5, 1e6, 2e6, 5e6, 1e7, 2e7, 5e7, 1e8, 1e9, 1e10];

function compact(n) {
  if (Math.abs(n) >= 1e9) return +(n / 1e9).toFixed(1) + 'G';
  if (Math.abs(n) >= 1e6) return +(n / 1e6).toFixed(1) + 'M';
  if (Math.abs(n) >= 1e4) return +(n / 1e3).toFixed(1) + 'k';
  return String(+n.toFixed(2));
}

const kAxisFont = '11px system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", "DejaVu Sans", sans-serif';

function axis(extra) {
  return {
    stroke: '#5f6b76',
    font: kAxisFont,
    grid: {stroke: '#eceff1', width: 1},
    ticks: {stroke: '#cfd8dc', width: 1, size: 4},
    ...extra,
  };
}

// A y axis of counts (requests per second): whole steps unless the counts
// are fractional, from 0.
export function countAxis() {
  return axis({size: 44, incrs: kCountIncrs, values: (u, splits) => splits.map(compact)});
}

export function countScale(fixedMax) {
  return {
    range: (u, min, max) => {
      const top = fixedMax ? fixedMax() : max;
      return [0, uPlot.rangeNum(0, Math.max(top || 0, 1), 0.1, true)[1]];
    },
  };
}

// Wall-clock time, 24-hour, seconds shown only when ticks are under a minute apart.
export function timeAxis() {
  const p = (n) => String(n).padStart(2, '0');
  return axis({
    size: 24,
    space: 56,
    incrs: [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600],
    values: (u, splits, axisIdx, space, incr) => splits.map((s) => {
      const d = new Date(s * 1000);
      const hm = p(d.getHours()) + ':' + p(d.getMinutes());
      return incr < 60 ? hm + ':' + p(d.getSeconds()) : hm;
    }),
  });
}

// Seconds from the start of a simulation: 0, 30s, 1m, 1m30s, ...
export function elapsedAxis() {
  return axis({
    size: 24,
    space: 60,
    incrs: [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400],
    values: (u, splits) => splits.map((s) => {
      if (s === 0) return '0';
      const m = Math.floor(s / 60);
      const r = s % 60;
      if (m === 0) return r + 's';
      if (m >= 60) return (m / 60 % 1 === 0 ? m / 60 : (m / 60).toFixed(1)) + 'h';
      return r ? m + 'm' + r + 's' : m + 'm';
    }),
  });
}

// Keeps a chart as wide as its container.
export function fitWidth(chart, container, height) {
  const observer = new ResizeObserver(() => {
    const width = Math.floor(container.clientWidth);
    if (width > 0 && width !== chart.width) chart.setSize({width, height});
  });
  observer.observe(container);
  return observer;
}

export {uPlot};
