// Live decisions: one chart per policy of allowed, delayed, denied and
// shadow-denied per second over the last 5 minutes (GET /v1/series), and
// above it the numbers: the last whole second's (or the one under the
// cursor) and the sum over the window.
//
// Each card carries the numbers it plots last as data attributes
// (data-allowed, data-denied, ..., data-denied-total, data-points), for
// tests and for anyone reading the page with a script.

import {countAxis, countScale, fitWidth, kColors, timeAxis, uPlot} from './charts.js';
import {byId, fill, h, setText} from './dom.js';
import {fmtClock, fmtInt, sum} from './format.js';

const kFields = [
  {field: 'allowed', label: 'allowed', data: 'allowed'},
  {field: 'delayed', label: 'delayed', data: 'delayed'},
  {field: 'denied', label: 'denied', data: 'denied'},
  {field: 'shadow_denied', label: 'shadow-denied', data: 'shadowDenied'},
];
const kHeight = 150;
const kWindowS = 300;

class PolicyChart {
  constructor(name) {
    this.name = name;
    this.data = [[], [], [], [], []];
    this.endS = 0;
    this.chart = null;
    this.values = [];
    this.sums = [];
    const items = kFields.map((f) => {
      const value = h('span', {class: 'stat-value num'}, '0');
      const total = h('span', {class: 'num'}, '0');
      this.values.push(value);
      this.sums.push(total);
      return h('div', {class: 'stat stat-' + f.field},
        h('span', {class: 'stat-label'}, h('span', {class: 'swatch'}), f.label),
        h('span', {class: 'stat-now'}, value, h('span', {class: 'unit'}, '/s')),
        h('span', {class: 'stat-sum'}, total, ' in 5 min'));
    });
    this.when = h('span', {class: 'when num'}, '');
    this.badges = h('span', {class: 'badges'});
    this.plot = h('div', {class: 'plot'});
    this.card = h('article', {class: 'card chart-card', dataset: {policy: name}},
      h('header', {class: 'card-head'}, h('h3', {class: 'policy-name', title: name}, name), this.badges,
        this.when),
      h('div', {class: 'stats'}, items),
      this.plot);
  }

  setShadow(shadow) {
    this.shadow = shadow;
    this.renderBadges();
  }

  renderBadges() {
    const state = (this.shadow ? 's' : '') + (this.denying ? 'd' : '');
    if (state === this.badgeState) return;
    this.badgeState = state;
    fill(this.badges,
      this.shadow ? h('span', {class: 'badge badge-shadow', title: 'denials are counted, not enforced'}, 'shadow') : null,
      this.denying ? h('span', {class: 'badge badge-deny', title: 'denied in the last minute'}, 'denying') : null);
  }

  // Creates the chart once the card is in the page (uPlot measures it).
  ensureChart() {
    if (this.chart) return;
    const width = Math.max(200, this.plot.clientWidth || 360);
    this.chart = new uPlot({
      width,
      height: kHeight,
      legend: {show: false},
      cursor: {y: false, drag: {x: false, y: false, setScale: false}, points: {size: 6}},
      scales: {
        x: {time: true, range: () => [this.endS - kWindowS + 1, this.endS]},
        y: countScale(),
      },
      axes: [timeAxis(), countAxis()],
      series: [
        {},
        {label: 'allowed', stroke: kColors.allowed, width: 1.5, fill: 'rgba(46,125,50,0.07)'},
        {label: 'delayed', stroke: kColors.delayed, width: 1.5},
        {label: 'denied', stroke: kColors.denied, width: 1.5, fill: 'rgba(198,40,40,0.10)'},
        {label: 'shadow-denied', stroke: kColors.shadow_denied, width: 1.5, dash: [5, 3]},
      ],
      hooks: {setCursor: [() => this.renderLegend()]},
    }, this.data, this.plot);
    fitWidth(this.chart, this.plot, kHeight);
  }

  update(series, endMs, intervalMs) {
    const n = Math.min(...kFields.map((f) => (series[f.field] || []).length));
    const step = intervalMs / 1000;
    const endS = endMs / 1000;
    const x = new Array(n);
    for (let i = 0; i < n; i++) x[i] = endS - (n - 1 - i) * step;
    this.data = [x, ...kFields.map((f) => (series[f.field] || []).slice(-n))];
    this.endS = endS;
    this.ensureChart();
    this.chart.setData(this.data);

    const last = n - 1;
    const lastMinute = this.data[3].slice(-60);
    this.denying = sum(lastMinute) > 0;
    this.card.classList.toggle('denying', this.denying);
    this.renderBadges();
    const ds = this.card.dataset;
    kFields.forEach((f, i) => {
      ds[f.data] = String(n > 0 ? this.data[i + 1][last] : 0);
      ds[f.data + 'Total'] = String(sum(this.data[i + 1]));
      setText(this.sums[i], fmtInt(sum(this.data[i + 1])));
    });
    ds.points = String(n);
    ds.endMs = String(endMs);
    this.renderLegend();
  }

  // The values at the cursor, or the last whole second's.
  renderLegend() {
    const n = this.data[0].length;
    if (n === 0) {
      setText(this.when, 'no data yet');
      return;
    }
    const at = this.chart && this.chart.cursor.idx != null ? this.chart.cursor.idx : n - 1;
    setText(this.when, (at === n - 1 ? 'last second, ' : 'at ') + fmtClock(this.data[0][at] * 1000));
    kFields.forEach((f, i) => {
      const v = this.data[i + 1][at];
      setText(this.values[i], fmtInt(v));
      this.values[i].classList.toggle('zero', !v);
    });
  }
}

export class LiveCharts {
  constructor() {
    this.charts = new Map();  // policy name -> PolicyChart
    this.order = [];          // policy names in config order
    this.shadow = new Set();
  }

  // The policies in force, in config order, and which are shadow.
  setPolicies(policies) {
    this.order = policies.map((p) => p.name);
    this.shadow = new Set(policies.filter((p) => p.shadow).map((p) => p.name));
    for (const [name, chart] of this.charts) chart.setShadow(this.shadow.has(name));
  }

  update(json) {
    const policies = json.policies || {};
    const names = Object.keys(policies);
    const rank = (name) => {
      const i = this.order.indexOf(name);
      return i < 0 ? this.order.length : i;
    };
    names.sort((a, b) => rank(a) - rank(b) || (a < b ? -1 : a > b ? 1 : 0));
    const container = byId('live-charts');
    for (const [name, chart] of this.charts) {
      if (!(name in policies)) {
        chart.card.remove();
        if (chart.chart) chart.chart.destroy();
        this.charts.delete(name);
      }
    }
    names.forEach((name, i) => {
      let chart = this.charts.get(name);
      if (!chart) {
        chart = new PolicyChart(name);
        chart.setShadow(this.shadow.has(name));
        this.charts.set(name, chart);
      }
      if (container.children[i] !== chart.card) container.insertBefore(chart.card, container.children[i] || null);
      chart.update(policies[name], json.end_ms, json.interval_ms || 1000);
    });
    const empty = byId('live-empty');
    empty.hidden = names.length > 0;
    setText(byId('live-when'), names.length > 0 ? 'up to ' + fmtClock(json.end_ms) : '');
  }
}
