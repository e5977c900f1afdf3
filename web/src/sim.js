// The simulator in the page: a built-in scenario (GET /v1/sim/scenarios) or
// the user's own YAML, run on the server's virtual clock (POST /v1/sim),
// drawn as one chart per limiter run (offered, admitted, rejected per
// second, on one shared scale) beside a table of each run's key metrics.
// The table's checkboxes choose which runs are drawn.

import {getJson, postJson} from './api.js';
import {countAxis, countScale, elapsedAxis, fitWidth, kColors, uPlot} from './charts.js';
import {byId, fill, h, setText} from './dom.js';
import {fmtInt, fmtMs, sum} from './format.js';

const kHeight = 170;

export class Simulator {
  constructor() {
    this.select = byId('sim-scenario');
    this.yaml = byId('sim-yaml');
    this.seed = byId('sim-seed');
    this.run = byId('sim-run');
    this.reset = byId('sim-reset');
    this.state = byId('sim-state');
    this.error = byId('sim-error');
    this.summary = byId('sim-summary');
    this.scenarios = [];
    this.charts = [];
    this.edited = false;
    this.select.addEventListener('change', () => this.choose(this.select.value));
    this.yaml.addEventListener('input', () => this.markEdited(true));
    this.reset.addEventListener('click', () => this.choose(this.select.value));
    byId('sim-form').addEventListener('submit', (e) => {
      e.preventDefault();
      this.start();
    });
  }

  async load() {
    const json = await getJson('/v1/sim/scenarios');
    this.scenarios = json.scenarios || [];
    fill(this.select, this.scenarios.map((s) => h('option', {value: s.name}, s.name)));
    if (this.scenarios.length) this.choose(this.scenarios[0].name);
    this.run.disabled = false;
  }

  choose(name) {
    const s = this.scenarios.find((x) => x.name === name);
    if (!s) return;
    this.select.value = name;
    this.yaml.value = s.yaml || '';
    setText(this.summary, s.summary || '');
    this.markEdited(false);
  }

  markEdited(edited) {
    this.edited = edited;
    byId('sim-edited').hidden = !edited;
    this.reset.disabled = !edited;
  }

  async start() {
    // An untouched built-in scenario goes by name; anything else as YAML.
    const body = this.edited || !this.select.value ? {yaml: this.yaml.value} : {scenario: this.select.value};
    const seed = this.seed.value.trim();
    if (seed !== '') body.seed = Number(seed);
    this.run.disabled = true;
    this.error.hidden = true;
    const result = byId('sim-result');
    const started = performance.now();
    setText(this.state, 'running…');
    try {
      const answer = await postJson('/v1/sim', body);
      setText(this.state, 'ran in ' + fmtMs(performance.now() - started));
      result.classList.remove('stale');
      this.render(answer);
    } catch (e) {
      setText(this.state, '');
      fill(this.error, h('strong', {}, 'The scenario did not run. '), h('pre', {class: 'error-text'}, e.message),
        result.childElementCount ? h('span', {class: 'small'}, 'Below: the previous run.') : null);
      this.error.hidden = false;
      result.classList.add('stale');
    } finally {
      this.run.disabled = false;
    }
  }

  render(result) {
    for (const c of this.charts) c.chart.destroy();
    this.charts = [];
    const runs = result.runs || [];
    // One y scale for every run, so that their heights compare.
    let top = 0;
    const prepared = runs.map((run) => {
      const s = run.series || {};
      const bucketMs = s.bucket_ms || 1000;
      const perSecond = 1000 / bucketMs;
      const n = Math.min((s.offered || []).length, (s.admitted || []).length, (s.rejected || []).length);
      const x = Array.from({length: n}, (_, i) => i * bucketMs / 1000);
      const cols = ['offered', 'admitted', 'rejected'].map((k) => (s[k] || []).slice(0, n).map((v) => v * perSecond));
      for (const c of cols) for (const v of c) top = Math.max(top, v);
      return {run, data: [x, ...cols]};
    });
    const sync = uPlot.sync('sim-' + Date.now());
    const cards = prepared.map(({run, data}, i) => this.card(run, data, i, () => top, sync));
    const m = (r) => r.metrics || {};
    const rows = runs.map((run, i) => {
      const box = h('input', {type: 'checkbox', checked: true, 'aria-label': 'draw ' + run.name,
        onchange: (e) => {
          cards[i].hidden = !e.target.checked;
        }});
      const mt = m(run);
      const ratio = mt.period_ratio;
      return h('tr', {dataset: {run: run.name}},
        h('td', {}, box),
        h('td', {class: 'run-name'}, run.name),
        h('td', {class: 'muted'}, run.limits || ''),
        h('td', {class: 'num'}, fmtInt(mt.admitted)),
        h('td', {class: 'num'}, fmtInt(mt.rejected)),
        h('td', {class: 'num'}, fmtInt(mt.retries)),
        h('td', {class: 'num' + (ratio > 1 ? ' bad' : '')},
          fmtInt(mt.max_admitted_period) + ' of ' + (mt.contract || '?') +
          (typeof ratio === 'number' ? ' (' + ratio.toFixed(2) + '×)' : '')),
        h('td', {class: 'num'}, fmtMs(mt.delay_p99_ms)),
        h('td', {class: 'num'}, fmtInt(mt.peak_in_flight)),
        h('td', {class: 'num'}, mt.served_by_ms !== undefined ? fmtMs(mt.served_by_ms) : '–'));
    });
    const desc = [result.description,
      'seed ' + result.seed,
      fmtMs(result.duration_ms) + ' simulated',
      result.instances > 1 ? result.instances + ' instances' : '1 instance',
      result.downstream && result.downstream.capacity ? 'downstream ' + result.downstream.capacity : null,
    ].filter(Boolean).join(' · ');
    const out = fill('sim-result',
      h('h3', {class: 'sim-title'}, result.scenario || 'scenario'),
      h('p', {class: 'muted'}, desc),
      h('div', {class: 'table-wrap'}, h('table', {class: 'grid-table sim-table'},
        h('thead', {}, h('tr', {},
          h('th', {title: 'draw this run'}, 'show'), h('th', {}, 'run'), h('th', {}, 'limits'),
          h('th', {class: 'num'}, 'admitted'), h('th', {class: 'num'}, 'rejected'),
          h('th', {class: 'num'}, 'retries'),
          h('th', {class: 'num', title: 'the worst key’s most admitted in one contract period, against the contract'}, 'max in period vs contract'),
          h('th', {class: 'num'}, 'delay p99'), h('th', {class: 'num'}, 'peak in flight'),
          h('th', {class: 'num'}, 'served by'))),
        h('tbody', {}, rows))),
      h('div', {class: 'sim-legend'},
        ['offered', 'admitted', 'rejected'].map((k) => h('span', {class: 'lg-inline lg-' + k}, h('span', {class: 'swatch'}), k)),
        h('span', {class: 'muted'}, 'per second, every chart on the same scale; drag across a chart to zoom in, double-click to zoom out')),
      h('div', {class: 'grid sim-charts'}, cards));
    out.dataset.runs = String(runs.length);
    for (const c of this.charts) c.attach();
  }

  // One chart zoomed: the others follow.
  zoomAll(source) {
    if (this.zooming) return;
    this.zooming = true;
    const {min, max} = source.scales.x;
    for (const c of this.charts) {
      if (c.chart && c.chart !== source) c.chart.setScale('x', {min, max});
    }
    this.zooming = false;
  }

  card(run, data, index, top, sync) {
    const mt = run.metrics || {};
    const plot = h('div', {class: 'plot'});
    const card = h('article', {class: 'card sim-card', dataset: {
      run: run.name, points: data[0].length,
      offeredTotal: sum(data[1]), admittedTotal: sum(data[2]), rejectedTotal: sum(data[3]),
    }},
    h('header', {class: 'card-head'}, h('h3', {title: run.name}, run.name)),
    h('p', {class: 'muted small'}, 'admitted ' + fmtInt(mt.admitted) + ', rejected ' + fmtInt(mt.rejected) +
      (mt.delayed ? ', delayed ' + fmtInt(mt.delayed) : '')),
    plot);
    const entry = {
      chart: null,
      attach: () => {
        entry.chart = new uPlot({
          width: Math.max(200, plot.clientWidth || 360),
          height: kHeight,
          legend: {show: false},
          // Drag to zoom in on a span of time, in every run's chart at once;
          // a double click zooms out.
          cursor: {y: false, sync: {key: sync.key}, drag: {x: true, y: false}, points: {size: 5}},
          scales: {x: {time: false}, y: countScale(top)},
          hooks: {setScale: [(u, key) => key === 'x' && this.zoomAll(u)]},
          axes: [elapsedAxis(), countAxis()],
          series: [
            {},
            {label: 'offered', stroke: kColors.offered, width: 1, dash: [3, 2]},
            {label: 'admitted', stroke: kColors.admitted, width: 1.5, fill: 'rgba(46,125,50,0.08)'},
            {label: 'rejected', stroke: kColors.rejected, width: 1.5},
          ],
        }, data, plot);
        fitWidth(entry.chart, plot, kHeight);
      },
    };
    this.charts.push(entry);
    return card;
  }
}
