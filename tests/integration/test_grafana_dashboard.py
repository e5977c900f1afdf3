"""The Grafana dashboard, examples/grafana/sluice.json, against the metrics of
a real `sluice serve`.

A dashboard is only as good as its queries, and a query over a metric that
does not exist draws an empty panel without any error. So this test reads
every PromQL expression of the dashboard (panel targets and template variable
queries), takes out the metric names, and checks each one on /metrics of a
running sluice whose config turns on every feature the dashboard shows: a
Redis store (the Redis and lease metrics), a leased limit, a gateway route to
a dead upstream (upstream errors), a gRPC listener with Envoy rules (RLS) and
a quota service (RLQS, with one real stream and one refused), and a low
server.max_connections (refused connections). It also checks the labels the
queries filter and group by, and that the JSON is a sane dashboard: unique
panel ids, every panel on the `${datasource}` variable, a grid position.

A metric counts as existing when a sample line or its `# HELP`/`# TYPE` line
names it. A histogram's `_bucket`, `_sum` and `_count` series count as
existing when the histogram is declared; the histogram's bare name is not a
series Prometheus stores, so a query using it is reported.

The PromQL reader below is small but careful: it tokenizes (strings, numbers
and durations, Grafana variables, identifiers, operators), skips function
names, aggregation operators and keywords (`by`, `sum`, `rate`,
`histogram_quantile`, ...), reads label names inside `{...}` and in grouping
clauses (`by (le)`) as labels, and skips range and subquery brackets.

Python standard library only; Redis and sluice on free loopback ports,
stopped by PID.
"""

import http.client
import json
import os
import re
import socket
import struct
import threading
import time
import unittest

from harness import HOST, DeadPort, parse_metrics, request, server_block
from redis_harness import RedisFleetTestCase, redis_store_block

SOURCE_DIR = os.environ.get("SLUICE_SOURCE_DIR") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..")
DASHBOARD = os.path.join(SOURCE_DIR, "examples", "grafana", "sluice.json")

# The outcomes of sluice_decisions_total (docs/api.md) and of
# sluice_rlqs_reported_requests_total. A query filtering on another value is
# a typo; /metrics showing another value is an outcome the dashboard has not
# been reviewed for.
OUTCOMES = {"allowed", "delayed", "denied", "shadow_denied", "missing_key"}

# Labels Prometheus adds to every series it scrapes.
TARGET_LABELS = {"instance", "job"}

# How long the live test waits for every metric to appear (some are created
# by a background thread: the quota service's claims and gauges).
METRICS_WAIT_S = 5.0


# ---------------------------------------------------------------------------
# PromQL
# ---------------------------------------------------------------------------

AGGREGATIONS = {
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
    "bottomk", "topk", "quantile", "limitk", "limit_ratio",
}
FUNCTIONS = {
    "abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh",
    "avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh",
    "count_over_time", "day_of_month", "day_of_week", "day_of_year", "days_in_month", "deg",
    "delta", "deriv", "double_exponential_smoothing", "exp", "floor", "histogram_avg",
    "histogram_count", "histogram_fraction", "histogram_quantile", "histogram_stddev",
    "histogram_stdvar", "histogram_sum", "holt_winters", "hour", "idelta", "increase", "info",
    "irate", "label_join", "label_replace", "last_over_time", "ln", "log10", "log2",
    "mad_over_time", "max_over_time", "min_over_time", "minute", "month", "pi",
    "predict_linear", "present_over_time", "quantile_over_time", "rad", "rate", "resets",
    "round", "scalar", "sgn", "sin", "sinh", "sort", "sort_by_label", "sort_by_label_desc",
    "sort_desc", "sqrt", "stddev_over_time", "stdvar_over_time", "sum_over_time", "tan", "tanh",
    "time", "timestamp", "vector", "year",
}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = {"bool", "offset", "and", "or", "unless", "atan2", "start", "end", "inf", "nan"}

_TOKEN_RE = re.compile(r"""
    (?P<ws>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<var>\$\{[^}]*\}|\$[A-Za-z_]\w*|\[\[[A-Za-z_]\w*(?::\w+)?\]\])
  | (?P<number>(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?:[a-zA-Z]+\d*)*)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|!=|==|<=|>=|[-+*/%^<>=@,(){}\[\]])
""", re.X)

_PAIRS = {"(": ")", "{": "}", "[": "]"}


def tokenize(expr):
    """-> [(kind, text)] without blanks and comments; ValueError on a
    character PromQL does not have, or unbalanced brackets."""
    tokens, stack, pos = [], [], 0
    while pos < len(expr):
        m = _TOKEN_RE.match(expr, pos)
        if not m:
            raise ValueError("cannot read %r at offset %d of %r" % (expr[pos], pos, expr))
        pos = m.end()
        kind = m.lastgroup
        text = m.group(kind)
        if kind in ("ws", "comment"):
            continue
        if kind == "op" and text in _PAIRS:
            stack.append(_PAIRS[text])
        elif kind == "op" and text in _PAIRS.values():
            if not stack or stack.pop() != text:
                raise ValueError("unbalanced %r at offset %d of %r" % (text, pos - 1, expr))
        tokens.append((kind, text))
    if stack:
        raise ValueError("unclosed bracket in %r (expected %r)" % (expr, stack[-1]))
    return tokens


def _unquote(s):
    if s.startswith("`"):
        return s[1:-1]
    return re.sub(r"\\(.)", lambda e: {"n": "\n", "t": "\t"}.get(e.group(1), e.group(1)), s[1:-1])


class Selector:
    def __init__(self, name, matchers):
        self.name = name            # the metric name
        self.matchers = matchers    # [(label, op, value)]

    def matcher(self, label):
        return [(op, v) for l, op, v in self.matchers if l == label]


class Query:
    """What one PromQL expression uses."""

    def __init__(self, expr):
        self.expr = expr
        self.selectors = []         # [Selector]
        self.grouping = []          # label names in by/without/on/ignoring/group_x (...)
        self.by = []                # those of `by (...)`: what an aggregation keeps
        self.without = []           # those of `without (...)`: what it drops
        self.joined = []            # those of `group_left/right (...)`: what a join adds
        self.functions = set()      # function and aggregation names called
        self.unknown_functions = set()
        self.ranges = []            # the text inside [...] (ranges, subqueries)
        self._read(tokenize(expr))

    @property
    def metrics(self):
        return [s.name for s in self.selectors]

    def result_labels(self, labels):
        """The labels the result can carry, given the labels of its input
        series: an aggregation keeps its `by` labels only (all but its
        `without` labels), a join adds its group_left/right labels."""
        if self.by:
            kept = set(self.by)
        elif self.functions & AGGREGATIONS:
            kept = set(labels) - set(self.without) if self.without else set()
        else:
            kept = set(labels)
        return kept | set(self.joined)

    def _read(self, t):
        i = 0
        while i < len(t):
            kind, text = t[i]
            nxt = t[i + 1][1] if i + 1 < len(t) else None
            if kind == "ident":
                if text.lower() in GROUPING:
                    if nxt == "(":
                        labels, i = self._labels(t, i + 2)
                        self.grouping += labels
                        {"by": self.by, "without": self.without, "group_left": self.joined,
                         "group_right": self.joined}.get(text.lower(), []).extend(labels)
                        continue
                elif text in AGGREGATIONS or text in FUNCTIONS:
                    self.functions.add(text)
                elif text.lower() in KEYWORDS:
                    pass
                elif nxt == "(":
                    self.unknown_functions.add(text)
                elif nxt == "{":
                    matchers, i = self._matchers(t, i + 2)
                    self.selectors.append(Selector(text, matchers))
                    continue
                else:
                    self.selectors.append(Selector(text, []))
            elif kind == "op" and text == "{":  # {__name__="x", ...}
                matchers, i = self._matchers(t, i + 1)
                names = [v for l, op, v in matchers if l == "__name__" and op == "="]
                if not names:
                    raise ValueError("a selector without a metric name in %r" % self.expr)
                self.selectors.append(Selector(names[0], matchers))
                continue
            elif kind == "op" and text == "[":
                depth, j = 1, i + 1
                while depth:
                    depth += {"[": 1, "]": -1}.get(t[j][1], 0)
                    j += 1
                self.ranges.append("".join(x for _, x in t[i + 1:j - 1]))
                i = j
                continue
            i += 1

    def _labels(self, t, i):
        """Label names up to the closing parenthesis -> (names, index after it)."""
        labels = []
        while t[i][1] != ")":
            if t[i][0] == "ident":
                labels.append(t[i][1])
            elif t[i][1] != ",":
                raise ValueError("unexpected %r in a label list of %r" % (t[i][1], self.expr))
            i += 1
        return labels, i + 1

    def _matchers(self, t, i):
        """label op "value" pairs up to the closing brace -> (matchers, index after it)."""
        matchers = []
        while t[i][1] != "}":
            if t[i][1] == ",":
                i += 1
                continue
            if (t[i][0] != "ident" or t[i + 1][1] not in ("=", "!=", "=~", "!~")
                    or t[i + 2][0] != "string"):
                raise ValueError("bad label matcher at %r in %r" % (t[i][1], self.expr))
            matchers.append((t[i][1], t[i + 1][1], _unquote(t[i + 2][1])))
            i += 3
        return matchers, i + 1


def variable_query(query):
    """A Prometheus template variable query -> (Query or None, label or None).
    label_values(metric{...}, label), label_values(label),
    query_result(expr), label_names(), metrics(regex)."""
    q = query.strip()
    m = re.fullmatch(r"label_values\((.*),\s*([A-Za-z_]\w*)\s*\)", q, re.S)
    if m:
        return Query(m.group(1)), m.group(2)
    m = re.fullmatch(r"label_values\(\s*([A-Za-z_]\w*)\s*\)", q)
    if m:
        return None, m.group(1)
    m = re.fullmatch(r"query_result\((.*)\)", q, re.S)
    if m:
        return Query(m.group(1)), None
    if re.fullmatch(r"(label_names\(\s*\)|metrics\(.*\))", q, re.S):
        return None, None
    raise ValueError("unsupported variable query %r" % query)


# ---------------------------------------------------------------------------
# The exposition: what /metrics declares and shows
# ---------------------------------------------------------------------------

class Exposition:
    def __init__(self, text):
        self.text = text
        self.samples = parse_metrics(text)
        self.labels = {}            # sample name -> {label: {values}}
        for name, labels, _ in self.samples:
            per = self.labels.setdefault(name, {})
            for k, v in labels.items():
                per.setdefault(k, set()).add(v)
        self.types = {}             # family -> type, from # TYPE
        self.declared = set()       # names on # HELP and # TYPE lines
        for line in text.split("\n"):
            m = re.match(r"# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*)(?: (.*))?$", line)
            if m:
                self.declared.add(m.group(2))
                if m.group(1) == "TYPE":
                    self.types[m.group(2)] = (m.group(3) or "").strip()

    def problem(self, name):
        """None when `name` is a series sluice exposes, else why not."""
        if name in self.labels:
            return None
        kind = self.types.get(name)
        if kind in ("histogram", "summary"):
            return ("a %s: query %s_bucket, %s_sum or %s_count" % (kind, name, name, name)
                    if kind == "histogram" else "a summary: query it with a quantile label")
        if name in self.declared:
            return None
        m = re.fullmatch(r"(.+)_(bucket|sum|count)", name)
        if m and self.types.get(m.group(1)) == "histogram":
            return None
        if m and m.group(2) != "bucket" and self.types.get(m.group(1)) == "summary":
            return None
        return "not in /metrics"

    def label_names(self, name):
        """Label names the series of `name` carry."""
        names = set(self.labels.get(name, {}))
        m = re.fullmatch(r"(.+)_bucket", name)
        if m and self.types.get(m.group(1)) == "histogram":
            names.add("le")
        return names


# ---------------------------------------------------------------------------
# The dashboard
# ---------------------------------------------------------------------------

def load_dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


def all_panels(dashboard):
    """Every panel, those nested in collapsed rows included, in order."""
    out = []
    for p in dashboard.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []) if p.get("type") == "row" else [])
    return out


def query_panels(dashboard):
    return [p for p in all_panels(dashboard) if p.get("type") != "row"]


def variables(dashboard):
    return dashboard.get("templating", {}).get("list", [])


def variable_text(v):
    q = v.get("query")
    return q.get("query", "") if isinstance(q, dict) else (q or "")


def uses(dashboard):
    """Every query of the dashboard: [(where, Query, legend or None)]."""
    out = []
    for p in query_panels(dashboard):
        for t in p.get("targets", []):
            where = "panel %r (id %s) target %s" % (p.get("title"), p.get("id"), t.get("refId"))
            out.append((where, Query(t.get("expr", "")), t.get("legendFormat")))
    for v in variables(dashboard):
        if v.get("type") == "query":
            query, _ = variable_query(variable_text(v))
            if query is not None:
                out.append(("variable $%s" % v.get("name"), query, None))
    return out


def references_datasource_variable(ds):
    """A panel's or target's datasource is the ${datasource} variable."""
    if isinstance(ds, str):
        return ds in ("${datasource}", "$datasource")
    return (isinstance(ds, dict) and ds.get("uid") in ("${datasource}", "$datasource")
            and ds.get("type") in (None, "prometheus"))


def missing_metrics(dashboard, exposition):
    """[(where, metric, why)] for every metric a query names that sluice does
    not expose."""
    out = []
    for where, query, _ in uses(dashboard):
        for name in query.metrics:
            why = exposition.problem(name)
            if why:
                out.append((where, name, why))
    return out


def report(rows):
    return "\n".join("  %s: %s" % (where, what) for where, what in rows)


# ---------------------------------------------------------------------------
# Tests that need no server
# ---------------------------------------------------------------------------

class PromqlReaderTest(unittest.TestCase):
    def test_metric_names_and_not_functions_keywords_or_labels(self):
        q = Query('histogram_quantile(0.99, sum by (le, instance) (rate('
                  'sluice_decision_duration_seconds_bucket{instance=~"$instance"}'
                  '[$__rate_interval])))')
        self.assertEqual(q.metrics, ["sluice_decision_duration_seconds_bucket"])
        self.assertEqual(q.grouping, ["le", "instance"])
        self.assertEqual(q.ranges, ["$__rate_interval"])
        self.assertEqual(q.functions, {"histogram_quantile", "sum", "rate"})

    def test_binary_expressions_offsets_and_bare_names(self):
        q = Query('sum(rate(a_total{x="1,2}"}[5m] offset 1h)) / on (policy) group_left '
                  'sum without (le) (b) > bool 0 and c:recorded:rate5m unless d{y!~"z"}')
        self.assertEqual(q.metrics, ["a_total", "b", "c:recorded:rate5m", "d"])
        self.assertEqual(q.grouping, ["policy", "le"])
        self.assertEqual((q.by, q.without, q.joined), ([], ["le"], []))
        self.assertEqual(q.result_labels({"le", "policy"}), {"policy"})
        self.assertEqual(Query("sum(x)").result_labels({"a"}), set())
        self.assertEqual(Query("rate(x[1m])").result_labels({"a"}), {"a"})

    def test_matchers_and_name_selector(self):
        q = Query('{__name__="m", policy=~"$policy", outcome!="denied"}')
        self.assertEqual(q.metrics, ["m"])
        self.assertEqual(q.selectors[0].matcher("policy"), [("=~", "$policy")])

    def test_unknown_function_and_bad_syntax(self):
        self.assertEqual(Query("rat(x[1m])").unknown_functions, {"rat"})
        for bad in ("sum(rate(x[1m])", "x{a=1}", "x}", "x ? y"):
            with self.assertRaises(ValueError, msg=bad):
                Query(bad)

    def test_variable_queries(self):
        q, label = variable_query('label_values(sluice_decisions_total{instance=~"$i"}, policy)')
        self.assertEqual((q.metrics, label), (["sluice_decisions_total"], "policy"))
        self.assertEqual(variable_query("label_values(instance)"), (None, "instance"))
        q, label = variable_query("query_result(topk(5, x))")
        self.assertEqual((q.metrics, label), (["x"], None))

    def test_histogram_series_and_names_that_are_not_there(self):
        e = Exposition("# HELP h_seconds x\n# TYPE h_seconds histogram\n"
                       "# TYPE c_total counter\nc_total{a=\"1\"} 2\n")
        self.assertIsNone(e.problem("h_seconds_bucket"))
        self.assertIsNone(e.problem("h_seconds_count"))
        self.assertIsNone(e.problem("c_total"))
        self.assertIn("histogram", e.problem("h_seconds"))
        self.assertEqual(e.problem("c"), "not in /metrics")
        self.assertEqual(e.problem("nope_total"), "not in /metrics")


class DashboardStructureTest(unittest.TestCase):
    def setUp(self):
        self.dashboard = load_dashboard()

    def test_importable_top_level(self):
        d = self.dashboard
        self.assertIsInstance(d.get("title"), str)
        self.assertTrue(d.get("title"))
        self.assertRegex(d.get("uid", ""), r"^[A-Za-z0-9_-]{1,40}$")
        self.assertIsInstance(d.get("schemaVersion"), int)
        self.assertGreaterEqual(d["schemaVersion"], 36)
        self.assertIsNone(d.get("id"), "an exported id would clash on import")
        self.assertIsInstance(d.get("panels"), list)
        self.assertTrue(d["panels"])

    def test_template_variables(self):
        by_name = {v.get("name"): v for v in variables(self.dashboard)}
        ds = by_name.get("datasource")
        self.assertIsNotNone(ds, "no datasource variable")
        self.assertEqual((ds.get("type"), ds.get("query")), ("datasource", "prometheus"))
        for name, label in (("policy", "policy"), ("instance", "instance")):
            v = by_name.get(name)
            self.assertIsNotNone(v, "no %s variable" % name)
            self.assertEqual(v.get("type"), "query")
            self.assertTrue(references_datasource_variable(v.get("datasource")), v)
            query, got = variable_query(variable_text(v))
            self.assertEqual(got, label, variable_text(v))
            if name == "policy":
                self.assertEqual(query.metrics, ["sluice_decisions_total"])

    def test_panel_ids_unique_and_grid_positions(self):
        ids = [p.get("id") for p in all_panels(self.dashboard)]
        self.assertTrue(all(isinstance(i, int) for i in ids), ids)
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        self.assertEqual(duplicates, [], "panel ids used twice")
        cells = {}
        for p in all_panels(self.dashboard):
            g = p.get("gridPos")
            self.assertIsInstance(g, dict, "panel %r has no gridPos" % p.get("title"))
            for k in ("h", "w", "x", "y"):
                self.assertIsInstance(g.get(k), int, "panel %r gridPos.%s" % (p.get("title"), k))
            self.assertTrue(g["h"] >= 1 and g["w"] >= 1 and g["x"] >= 0 and g["y"] >= 0, g)
            self.assertLessEqual(g["x"] + g["w"], 24, "panel %r is wider than the grid"
                                 % p.get("title"))
        # Panels of the top level (rows expanded) do not overlap.
        for p in self.dashboard["panels"]:
            g = p["gridPos"]
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    other = cells.setdefault((x, y), p.get("title"))
                    self.assertEqual(other, p.get("title"),
                                     "panels %r and %r overlap" % (other, p.get("title")))

    def test_every_panel_queries_the_datasource_variable(self):
        panels = query_panels(self.dashboard)
        self.assertGreater(len(panels), 10)
        for p in panels:
            title = p.get("title")
            self.assertTrue(title, p.get("id"))
            self.assertTrue(references_datasource_variable(p.get("datasource")),
                            "panel %r: datasource %r" % (title, p.get("datasource")))
            targets = p.get("targets")
            self.assertTrue(targets, "panel %r has no query" % title)
            refs = [t.get("refId") for t in targets]
            self.assertEqual(len(set(refs)), len(refs), "panel %r: refIds %r" % (title, refs))
            for t in targets:
                self.assertTrue((t.get("expr") or "").strip(), "panel %r: empty expr" % title)
                if "datasource" in t:
                    self.assertTrue(references_datasource_variable(t["datasource"]),
                                    "panel %r target %s" % (title, t.get("refId")))

    def test_queries_parse_and_filter_by_the_variables(self):
        problems = []
        for where, q, _ in uses(self.dashboard):
            if not q.selectors:
                problems.append((where, "names no metric"))
            if q.unknown_functions:
                problems.append((where, "unknown functions %s" % sorted(q.unknown_functions)))
            for r in q.ranges:
                if r not in ("$__rate_interval", "$__range"):
                    problems.append((where, "range [%s]: use [$__rate_interval]" % r))
            if where.startswith("panel"):
                for s in q.selectors:
                    if not any("$instance" in v for _, v in s.matcher("instance")):
                        problems.append((where, "%s is not filtered by $instance" % s.name))
            for s in q.selectors:
                for op, value in s.matcher("outcome"):
                    unknown = set(value.split("|")) - OUTCOMES
                    if unknown:
                        problems.append((where, "outcome values %s" % sorted(unknown)))
        if problems:
            self.fail("\n" + report(problems))

    def test_the_operators_panels_are_there(self):
        metrics = {m for _, q, _ in uses(self.dashboard) for m in q.metrics}
        needed = {
            "sluice_decisions_total", "sluice_decision_duration_seconds_bucket",
            "sluice_requests_in_flight", "sluice_connections", "sluice_http_responses_total",
            "sluice_upstream_errors_total", "sluice_store_errors_total", "sluice_keys",
            "sluice_forced_evictions_total", "sluice_fresh_evictions_total", "sluice_redis_up",
            "sluice_redis_nodes_up", "sluice_redis_calls_total", "sluice_redis_decisions_total",
            "sluice_redis_errors_total", "sluice_redis_timeouts_total",
            "sluice_redis_reconnects_total", "sluice_redis_denials_answered_total",
            "sluice_lease_held_units", "sluice_config_reloads_total", "sluice_rls_requests_total",
            "sluice_rlqs_streams", "sluice_rlqs_reported_requests_total",
        }
        self.assertEqual(needed - metrics, set(), "panels an operator needs are gone")
        text = json.dumps(self.dashboard)
        self.assertIn("delayed", text, "the delayed outcome has no place on the dashboard")


# ---------------------------------------------------------------------------
# A minimal gRPC client for the quota service (RLQS): HTTP/2 without TLS,
# HPACK literals only, protobuf encoded by hand
# ---------------------------------------------------------------------------

RLQS_PATH = "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
H2_DATA, H2_HEADERS, H2_SETTINGS, H2_PING = 0x0, 0x1, 0x4, 0x6
H2_ACK, H2_END_HEADERS = 0x1, 0x4


def _h2_frame(kind, flags, stream, payload):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + \
        struct.pack(">I", stream) + payload


def _hpack_int(value, prefix_bits):
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out, value = [limit], value - limit
    while value >= 128:
        out.append((value & 127) | 128)
        value >>= 7
    return bytes(out + [value])


def _hpack_literal(name, value):
    """A literal header field without indexing, new name, no Huffman."""
    out = b"\x00"
    for s in (name.encode(), value.encode()):
        out += _hpack_int(len(s), 7) + s
    return out


def _pb_varint(n):
    out = bytearray()
    while n >= 128:
        out.append((n & 127) | 128)
        n >>= 7
    out.append(n)
    return bytes(out)


def _pb_bytes(field, data):
    data = data.encode() if isinstance(data, str) else data
    return _pb_varint(field << 3 | 2) + _pb_varint(len(data)) + data


def _pb_uint(field, n):
    return _pb_varint(field << 3) + _pb_varint(n)


def rlqs_report(domain, bucket, allowed, denied, seconds=1):
    """RateLimitQuotaUsageReports with one bucket's usage."""
    bucket_id = b"".join(_pb_bytes(1, _pb_bytes(1, k) + _pb_bytes(2, v))
                         for k, v in sorted(bucket.items()))
    usage = (_pb_bytes(1, bucket_id) + _pb_bytes(2, _pb_uint(1, seconds))
             + _pb_uint(3, allowed) + _pb_uint(4, denied))
    return _pb_bytes(1, domain) + _pb_bytes(2, usage)


class QuotaClient:
    """One HTTP/2 connection to grpc.listen. Opens quota streams and sends
    reports on them; a reader thread answers the server's SETTINGS and PING
    and drops what else it sends (assignments, trailers)."""

    def __init__(self, port):
        self.port = port
        self.sock = socket.create_connection((HOST, port), timeout=5)
        self.lock = threading.Lock()
        self.next_stream = 1
        self._send(H2_PREFACE + _h2_frame(H2_SETTINGS, 0, 0, b""))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _send(self, data):
        with self.lock:
            self.sock.sendall(data)

    def _read(self):
        buf = b""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return
                buf += chunk
                while len(buf) >= 9:
                    length = struct.unpack(">I", b"\x00" + buf[:3])[0]
                    if len(buf) < 9 + length:
                        break
                    kind, flags = buf[3], buf[4]
                    payload, buf = buf[9:9 + length], buf[9 + length:]
                    if kind == H2_SETTINGS and not flags & H2_ACK:
                        self._send(_h2_frame(H2_SETTINGS, H2_ACK, 0, b""))
                    elif kind == H2_PING and not flags & H2_ACK:
                        self._send(_h2_frame(H2_PING, H2_ACK, 0, payload))
        except OSError:
            return

    def open_stream(self, report):
        """Opens a StreamRateLimitQuotas call and sends one report on it."""
        stream = self.next_stream
        self.next_stream += 2
        headers = b"".join(_hpack_literal(k, v) for k, v in (
            (":method", "POST"), (":scheme", "http"), (":path", RLQS_PATH),
            (":authority", "%s:%d" % (HOST, self.port)),
            ("content-type", "application/grpc"), ("te", "trailers")))
        message = b"\x00" + struct.pack(">I", len(report)) + report
        self._send(_h2_frame(H2_HEADERS, H2_END_HEADERS, stream, headers)
                   + _h2_frame(H2_DATA, 0, stream, message))

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        self.reader.join(5)


# ---------------------------------------------------------------------------
# The live check
# ---------------------------------------------------------------------------

MAX_CONNECTIONS = 2     # server.max_connections: a third connection is refused

CONFIG = server_block(threads=2, max_connections=MAX_CONNECTIONS) + """\
  decision: {{listen: 127.0.0.1:0}}
{store}
grpc: {{listen: 127.0.0.1:0}}
routes:
  - name: gone
    upstream: {dead}
envoy:
  - domain: edge
    descriptors:
      - key: client
        rate_limit: {{unit: minute, requests_per_unit: 5}}
rlqs:
  domains:
    - domain: web
      buckets:
        - match: {{name: api}}
          rate: 100/s
policies:
  - name: api
    limits: [{{algorithm: token_bucket, rate: 1/h, burst: 3}}]
  - name: leased
    limits: [{{algorithm: fixed_window, rate: 1000/h, lease: {{size: 10, ttl: 1h}}}}]
  - name: shadowed
    shadow: true
    limits: [{{algorithm: token_bucket, rate: 1/h, burst: 1, scope: local}}]
"""


class DashboardMetricsTest(RedisFleetTestCase):
    """One sluice with every feature the dashboard shows, a little traffic,
    then /metrics read once for all the tests below."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.dashboard = load_dashboard()
        redis = cls.start_class_redis()
        dead = DeadPort()
        cls.addClassCleanup(dead.close)
        config = CONFIG.format(store=redis_store_block(url=redis.url, timeout="1s").rstrip(),
                               dead=dead.url)
        cls.sluice = cls.start_class_fleet(config, 1)[0]
        cls.traffic()
        cls.exposition = cls.wait_for_metrics()

    @classmethod
    def traffic(cls):
        s = cls.sluice
        # Decisions: allowed, denied, shadow_denied; a leased limit's slice.
        conn = http.client.HTTPConnection(HOST, s.decision_port, timeout=5)
        cls.addClassCleanup(conn.close)
        for policy, key, n in (("api", "k", 5), ("leased", "k", 3), ("shadowed", "k", 2)):
            for _ in range(n):
                r = request(s.decision_port, "POST", "/v1/check", conn=conn,
                            body={"policy": policy, "key": key},
                            headers={"Content-Type": "application/json"})
                if r.status not in (200, 429):
                    raise AssertionError("/v1/check answered %r" % r)
        # The gateway: an upstream error (502) on each of two kept-alive
        # connections, so that a third is refused (server.max_connections).
        held = []
        for _ in range(MAX_CONNECTIONS):
            c = http.client.HTTPConnection(HOST, s.port, timeout=5)
            cls.addClassCleanup(c.close)
            r = request(s.port, "GET", "/gone", conn=c)
            if r.status != 502:
                raise AssertionError("the dead route answered %r" % r)
            held.append(c)
        with socket.create_connection((HOST, s.port), timeout=5) as extra:
            try:
                extra.sendall(b"GET /gone HTTP/1.1\r\nHost: x\r\n\r\n")
                extra.recv(1)
            except OSError:
                pass
        # The quota service: one stream reporting a configured bucket (its
        # assignment, the rule's gauges, a claim in Redis), one refused for
        # a domain that is not configured.
        quota = QuotaClient(s.grpc_port)
        cls.addClassCleanup(quota.close)
        quota.open_stream(rlqs_report("web", {"name": "api"}, allowed=5, denied=1))
        quota.open_stream(rlqs_report("nowhere", {"name": "api"}, allowed=1, denied=0))

    @classmethod
    def fetch(cls):
        r = request(cls.sluice.admin_port, "GET", "/metrics")
        if r.status != 200:
            raise AssertionError("GET /metrics answered %r" % r)
        return Exposition(r.body.decode())

    @classmethod
    def wait_for_metrics(cls):
        """/metrics once every metric the dashboard names is there, or at
        the deadline (the tests then say what is missing)."""
        deadline = time.monotonic() + METRICS_WAIT_S
        while True:
            e = cls.fetch()
            if not missing_metrics(cls.dashboard, e) or time.monotonic() > deadline:
                return e
            time.sleep(0.05)

    def test_every_metric_the_dashboard_queries_is_exposed(self):
        missing = missing_metrics(self.dashboard, self.exposition)
        if missing:
            self.fail("metrics the dashboard queries that sluice does not expose:\n" + report(
                [(w, "%s (%s)" % (n, why)) for w, n, why in missing]))

    def test_gauges_are_typed_as_gauges(self):
        # Series that go down (streams closing, assignments shrinking) are
        # gauges: a counter's reset would make rate() invent traffic.
        for name in ("sluice_rlqs_streams", "sluice_rlqs_envoys", "sluice_rlqs_assigned_per_second",
                     "sluice_requests_in_flight", "sluice_connections", "sluice_keys",
                     "sluice_lease_held_units", "sluice_redis_up"):
            self.assertEqual(self.exposition.types.get(name), "gauge", name)

    def test_the_check_reports_a_metric_that_is_not_there(self):
        # The same check over a made-up panel: it must fail, or the test above proves nothing.
        fake = {"panels": [{"type": "timeseries", "title": "fake", "id": 1, "targets": [
            {"refId": "A", "expr": 'sum(rate(sluice_decisions_totl{instance=~"$instance"}'
                                   '[$__rate_interval])) / sluice_decision_duration_seconds'}]}]}
        got = [(n, why) for _, n, why in missing_metrics(fake, self.exposition)]
        self.assertEqual([n for n, _ in got],
                         ["sluice_decisions_totl", "sluice_decision_duration_seconds"], got)

    def test_labels_the_queries_use_are_on_their_metrics(self):
        e = self.exposition
        problems = []
        for where, q, legend in uses(self.dashboard):
            known = set(TARGET_LABELS)
            for name in q.metrics:
                known |= e.label_names(name)
            for s in q.selectors:
                for label, _, _ in s.matchers:
                    if label not in TARGET_LABELS | {"__name__"} | e.label_names(s.name):
                        problems.append((where, "%s has no label %r (it has %s)" % (
                            s.name, label, sorted(e.label_names(s.name)))))
                if "policy" in e.label_names(s.name) and where.startswith("panel") and \
                        not any("$policy" in v for _, v in s.matcher("policy")):
                    problems.append((where, "%s is not filtered by $policy" % s.name))
            for label in q.grouping:
                if label not in known:
                    problems.append((where, "groups by %r, a label none of %s has" % (
                        label, q.metrics)))
            for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", legend or ""):
                if label not in q.result_labels(known):
                    problems.append((where, "legend {{%s}}: not a label of the result" % label))
        if problems:
            self.fail("\n" + report(problems))

    def test_outcomes_in_metrics_are_the_ones_the_dashboard_knows(self):
        seen = set()
        for name in ("sluice_decisions_total", "sluice_rlqs_reported_requests_total"):
            seen |= self.exposition.labels.get(name, {}).get("outcome", set())
        self.assertIn("denied", seen)
        self.assertEqual(seen - OUTCOMES, set(),
                         "new outcome values: review the dashboard's outcome panels and colours")

    def test_traffic_reached_the_features(self):
        # The features were exercised, not only declared (the test's own setup works).
        e = self.exposition

        def value(name, **labels):
            return sum(v for n, l, v in e.samples
                       if n == name and all(l.get(k) == x for k, x in labels.items()))
        self.assertGreaterEqual(value("sluice_decisions_total", policy="api", outcome="denied"), 1)
        self.assertGreaterEqual(value("sluice_upstream_errors_total", route="gone"), 1)
        self.assertGreaterEqual(value("sluice_connections_refused_total"), 1)
        self.assertGreaterEqual(value("sluice_lease_slices_total"), 1)
        self.assertEqual(value("sluice_redis_up"), 1)
        self.assertGreaterEqual(value("sluice_rlqs_reported_requests_total", domain="web"), 6)
        self.assertGreaterEqual(value("sluice_rlqs_streams_refused_total"), 1)


if __name__ == "__main__":
    unittest.main()
