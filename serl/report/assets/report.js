// serl report: draws the curves (with uPlot, inlined into the page by serl/report/html.py) and the
// trajectory browser from the JSON in #serl-data. No network.
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("serl-data").textContent);
  var PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in (attrs || {})) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function fmt(v) {
    if (v === null || v === undefined) return "–";
    var a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e4)) return v.toExponential(2);
    return String(Math.round(v * 1000) / 1000);
  }

  // ------------------------------------------------------------------ header
  var runsDiv = document.getElementById("runs");
  DATA.runs.forEach(function (r) {
    var c = r.config || {};
    var d = el("div", {"class": "run-info"});
    d.appendChild(el("b", {}, r.name));
    d.appendChild(document.createTextNode("  " + [c.env, c.adv_estimator, c.serl ? "SERL (" + c.sampling_mode + ")" : "no SERL",
      "G=" + c.group_size, "model " + c.model].join(" · ")));
    runsDiv.appendChild(d);
  });

  // ------------------------------------------------------------------ curves
  // Drawn by uPlot (vendor/uPlot.iife.min.js, inlined above this script): hover shows the values
  // in the legend, drag selects iterations to zoom into, double-click zooms back out.
  var AXIS_FONT = "11px system-ui, -apple-system, 'Segoe UI', sans-serif";
  var DASHES = [[], [6, 3], [2, 2], [8, 3, 2, 3], [4, 4]];
  var SPREADS = {minmax: "mean line, min–max band", std: "mean line, ± 1 std band (sample std)", none: "each run's own line"};
  var WHOLE_INCRS = [];  // iterations are whole: ticks at 1, 2, 5, 10, 20, 25, 50, ... only
  for (var e10 = 1; e10 <= 1e9; e10 *= 10) [1, 2, 2.5, 5].forEach(function (m) { if (m * e10 % 1 === 0) WHOLE_INCRS.push(m * e10); });
  var measure = document.createElement("canvas").getContext("2d");
  window.serlCharts = [];  // [{title, plot (the uPlot), meta [{role, key, run} per series]}]: for tests and the console

  function rgba(hex, a) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + a + ")";
  }
  function exp10(v) { return Math.floor(Math.log10(Math.abs(v)) + 1e-9); }
  // uPlot's tick steps are 1, 2, 2.5 or 5 × 10^e; the labels of one axis share one format, with the
  // decimals that write each multiple of the step exactly (a near-constant curve gets long labels,
  // never equal ones); plain decimals unless the axis's largest value is under 1e-4 or at least 1e6
  function halfStep(incr) { return Math.abs(incr / Math.pow(10, exp10(incr)) - 2.5) < 1e-6 ? 1 : 0; }
  function tickLabels(splits, incr) {
    var big = 0;
    splits.forEach(function (v) { if (v !== null) big = Math.max(big, Math.abs(v)); });
    var d = Math.max(0, halfStep(incr) - exp10(incr));
    var plain = big === 0 || (big >= 1e-4 && big < 1e6 && d <= 12);
    var digits = big === 0 ? 0 : Math.min(14, Math.max(0, exp10(big) - exp10(incr) + halfStep(incr)));
    return splits.map(function (v) {
      if (v === null || v === undefined) return "";
      if (Math.abs(v) < incr * 1e-6) return "0";
      return plain ? v.toFixed(d) : v.toExponential(digits);
    });
  }
  function valueLabel(v) {  // a hovered value: eight significant digits
    if (v === null || v === undefined) return "–";
    var a = Math.abs(v);
    if (a !== 0 && (a < 1e-4 || a >= 1e8)) return v.toExponential(7).replace(/\.?0+e/, "e");
    return String(Number(v.toPrecision(8)));
  }
  // the y axis is as wide as its longest tick label (uPlot's default is a fixed 50 px, which cuts long labels)
  function axisSize(u, values, axisIdx, cycleNum) {
    var axis = u.axes[axisIdx];
    measure.font = AXIS_FONT;
    var w = 0;
    (values || []).forEach(function (s) { w = Math.max(w, measure.measureText(String(s)).width); });
    var size = Math.ceil(w + axis.ticks.size + axis.gap + 4);
    // uPlot asks again while the size changes the ticks: only grow, so it settles and no label of
    // the final ticks is cut (returning the first size froze it before e.g. "5" became "10.0")
    return cycleNum > 1 ? Math.max(size, axis._size) : size;
  }
  function clampedRange(lo, hi) {  // an automatic range kept inside [lo, hi]
    return function (u, min, max) {
      if (min === null || max === null || !isFinite(min) || !isFinite(max)) return [lo, hi];
      var r = uPlot.rangeNum(min, max, 0.1, true), a = Math.max(lo, r[0]), b = Math.min(hi, r[1]);
      if (b - a < 1e-9) { a = Math.max(lo, a - 0.05); b = Math.min(hi, b + 0.05); }
      return [a, b];
    };
  }

  // the series of one chart: each run's line; for a key that several runs share (unless mode is
  // "none"), also the band (min–max, or mean ± std) and the mean line
  function chartSeries(c, mode) {
    var multi = DATA.runs.length > 1, groups = {}, keys = [];
    if (mode !== "none") c.groups.forEach(function (g) { groups[g.key] = g; });
    c.lines.forEach(function (l) { if (keys.indexOf(l.key) < 0) keys.push(l.key); });
    var out = {series: [{label: "iteration", value: function (u, v) { return v === null || v === undefined ? "–" : String(v); }}],
               data: [c.x], bands: [], meta: [{role: "x"}]};
    function add(opts, y, meta) {
      opts.spanGaps = true;
      if (!opts.value) opts.value = function (u, v) { return valueLabel(v); };
      out.series.push(opts); out.data.push(y); out.meta.push(meta);
      return out.series.length - 1;
    }
    c.lines.forEach(function (l, k) {
      var g = groups[l.key], run = Math.max(0, DATA.runs.map(function (r) { return r.name; }).indexOf(l.run));
      var color = PALETTE[(mode === "none" ? k : keys.indexOf(l.key)) % PALETTE.length];
      var opts = {label: (multi ? l.run + ": " : "") + l.key, stroke: g ? rgba(color, 0.4) : color, width: g ? 1 : 1.8,
                  dash: DASHES[run % DASHES.length]};
      if (g) opts.points = {show: false};  // the runs behind a band: thin, no dots
      add(opts, l.y, {role: "run", key: l.key, run: l.run});
    });
    keys.forEach(function (key, k) {
      var g = groups[key];
      if (!g) return;
      var color = PALETTE[k % PALETTE.length], n = g.runs.length, std = mode === "std";
      var lo = std ? g.mean.map(function (m, i) { return g.std[i] === null ? null : m - g.std[i]; }) : g.min;
      var hi = std ? g.mean.map(function (m, i) { return g.std[i] === null ? null : m + g.std[i]; }) : g.max;
      var edge = {stroke: rgba(color, 0.35), width: 1, points: {show: false}};
      var hiIdx = add(Object.assign({label: key + ": " + (std ? "mean + std" : "max") + " of " + n + " runs"}, edge), hi,
                      {role: std ? "mean+std" : "max", key: key});
      var loIdx = add(Object.assign({label: key + ": " + (std ? "mean − std" : "min") + " of " + n + " runs"}, edge), lo,
                      {role: std ? "mean-std" : "min", key: key});
      out.bands.push({series: [hiIdx, loIdx], fill: rgba(color, 0.15)});
      add({label: key + ": mean of " + n + " runs", stroke: color, width: 2.2, value: function (u, v, si, i) {
        return valueLabel(v) + (i !== null && i !== undefined && g.n[i] !== null && g.n[i] < n ? " (" + g.n[i] + " of " + n + " runs)" : "");
      }}, g.mean, {role: "mean", key: key});
    });
    return out;
  }

  function drawChart(c, mode) {
    var box = el("div", {"class": "chart", "data-title": c.title});
    box.appendChild(el("h3", {}, c.title));
    var s = chartSeries(c, mode), yr = c.y_range;
    var y = {};
    if (yr) y.range = yr.fixed ? function () { return [yr.min, yr.max]; } : clampedRange(yr.min, yr.max);
    var plot = new uPlot({
      width: 380, height: 230,
      scales: {x: {time: false}, y: y},
      axes: [
        {label: "iteration", labelSize: 14, labelGap: 0, labelFont: AXIS_FONT, font: AXIS_FONT, size: 26, incrs: WHOLE_INCRS, space: 45,
         values: function (u, splits) { return splits.map(function (v) { return v === null ? "" : String(v); }); },
         grid: {stroke: "#eef", width: 1}, ticks: {stroke: "#ccd", width: 1}},
        {font: AXIS_FONT, size: axisSize, space: 28, grid: {stroke: "#eef", width: 1}, ticks: {stroke: "#ccd", width: 1},
         values: function (u, splits, axisIdx, space, incr) { return tickLabels(splits, incr); }},
      ],
      series: s.series, bands: s.bands,
      cursor: {drag: {x: true, y: false}, focus: {prox: 16}},
      focus: {alpha: 0.4},
    }, s.data, box);
    window.serlCharts.push({title: c.title, plot: plot, meta: s.meta});
    return box;
  }
  var charts = document.getElementById("charts");
  var controls = document.getElementById("chart-controls");
  function drawCharts(mode) {
    window.serlCharts.forEach(function (c) { c.plot.destroy(); });
    window.serlCharts = [];
    charts.textContent = "";
    if (!DATA.panels.length) charts.appendChild(el("p", {"class": "muted"}, "No metrics recorded yet (metrics.jsonl is empty or missing)."));
    DATA.panels.forEach(function (p) { charts.appendChild(drawChart(p, mode)); });
  }
  if (DATA.panels.some(function (p) { return p.groups.length; })) {
    var wrap = el("label", {}, "runs that share a metric: ");
    var spreadSel = el("select", {id: "spread"});
    Object.keys(SPREADS).forEach(function (k) { spreadSel.appendChild(el("option", {value: k}, SPREADS[k])); });
    spreadSel.value = DATA.spread;
    spreadSel.addEventListener("change", function () { drawCharts(spreadSel.value); });
    wrap.appendChild(spreadSel);
    controls.appendChild(wrap);
  }
  if (DATA.panels.length) controls.appendChild(el("span", {"class": "muted"},
    "hover: values in the legend · drag: zoom into iterations · double-click: zoom out · click a legend entry: hide / show it"));
  drawCharts(DATA.spread);

  // ------------------------------------------------------------------ evaluations
  var evDiv = document.getElementById("eval-tables");
  var nEval = 0;
  DATA.runs.forEach(function (r) {
    (r.evals || []).forEach(function (ev) {
      nEval++;
      var m = ev.metrics;
      evDiv.appendChild(el("h3", {}, r.name + " / " + ev.name + ": success " + fmt(m.success_rate) + " on " +
        m.num_tasks + " tasks (" + (m.mode || "") + ")"));
      var tb = el("table", {"class": "eval-tasks"});
      var hr = el("tr");
      ["task type", "task", "won", "reward", "steps", "valid actions"].forEach(function (h) { hr.appendChild(el("th", {}, h)); });
      tb.appendChild(hr);
      ev.tasks.forEach(function (t) {
        var tr = el("tr");
        [t.task_type, t.task_text || t.task_id, t.won ? "yes" : "no", fmt(t.episode_reward), t.length,
         fmt(t.valid_action_ratio)].forEach(function (v) { tr.appendChild(el("td", {}, v)); });
        tb.appendChild(tr);
      });
      evDiv.appendChild(tb);
    });
  });
  if (!nEval) evDiv.appendChild(el("p", {"class": "muted"}, "No serl eval results in the run folder (serl eval --run RUN_DIR writes them)."));

  // ------------------------------------------------------------------ trajectories
  var trajs = [];
  DATA.runs.forEach(function (r) { (r.trajectories || []).forEach(function (t) { t.run = r.name; trajs.push(t); }); });
  var scale = 1e-6;  // the largest |W - 1| on the page: full colour
  trajs.forEach(function (t) { t.steps.forEach(function (s) {
    var w = s.serl && s.serl.weights; if (w) w.forEach(function (x) { scale = Math.max(scale, Math.abs(x - 1)); });
  }); });

  function tokenColor(w) {
    var a = Math.min(1, Math.abs(w - 1) / scale) * 0.75 + 0.08;
    return w >= 1 ? "rgba(34,160,70," + a.toFixed(3) + ")" : "rgba(214,39,40," + a.toFixed(3) + ")";
  }
  function replyNode(s) {
    var pre = el("pre", {"class": "reply"});
    var text = s.response || "";
    if (!s.tokens) { pre.textContent = text; return pre; }
    var w = s.serl && s.serl.weights, gap = s.serl && s.serl.lp_gap, plain = "", ins = "";
    function flush() { if (plain) { pre.appendChild(document.createTextNode(plain)); plain = ""; } }
    // tokens the rollout inserted (a math row's tool outputs and chat glue: loss mask 0) are
    // shaded as one run each, so a tool call's output reads as such and is seen not to train
    function flushIns() {
      if (ins) { pre.appendChild(el("span", {"class": "tok ins", "title": "inserted by the rollout (tool output): not trained"}, ins)); ins = ""; }
    }
    s.tokens.forEach(function (sp, i) {
      var piece = text.slice(sp[0], sp[1]);
      if (s.loss_mask && s.loss_mask[i] === 0) { flush(); ins += piece; return; }
      flushIns();
      var act = s.action_mask && s.action_mask[i];
      if (!act) { plain += piece; return; }
      flush();
      var span = el("span", {"class": "tok act", "data-i": i}, piece);
      if (w) {
        span.className = "tok act w " + (w[i] > 1 ? "w-up" : (w[i] < 1 ? "w-down" : "w-one"));
        span.setAttribute("data-w", w[i]);
        span.setAttribute("data-gap", gap[i]);
        span.setAttribute("title", "W = " + w[i].toFixed(4) + "   teacher − student log-prob = " + (gap[i] >= 0 ? "+" : "") + gap[i].toFixed(4) + " nats");
        span.style.background = tokenColor(w[i]);
      }
      pre.appendChild(span);
    });
    flushIns();
    plain += text.slice(s.tokens.length ? s.tokens[s.tokens.length - 1][1] : 0);
    flush();
    return pre;
  }
  function stepNode(s) {
    var d = el("div", {"class": "step", "data-step": s.step_id});
    var head = el("div", {"class": "step-head"});
    head.appendChild(el("b", {}, "step " + s.step_id));
    var bits = ["reward " + fmt(s.reward)];
    if (s.advantage !== null && s.advantage !== undefined) bits.push("advantage " + fmt(s.advantage));
    if (s.trained === false) bits.push("masked (not trained)");
    if (!s.action_valid) bits.push("invalid action");
    if (s.serl) bits.push(s.serl.has_context ? "SERL λ " + fmt(s.serl.lambda) + ", context: " + s.serl.sources.join(", ") +
                          (s.serl.teacher_scored === false ? " (teacher not run: the row trains nothing, W = 1)" : "") : "SERL: no context");
    head.appendChild(document.createTextNode("  " + bits.join(" · ")));
    d.appendChild(head);
    d.appendChild(el("div", {"class": "lbl"}, "observation"));
    d.appendChild(el("pre", {"class": "obs"}, s.observation));
    d.appendChild(el("div", {"class": "lbl"}, "reply (action tokens underlined" + (s.serl && s.serl.weights ? ", coloured by W" : "") +
                              (s.loss_mask ? "; tool outputs shaded, not trained" : "") + ")"));
    d.appendChild(replyNode(s));
    if (s.serl && s.serl.context) {
      var c = el("details", {"class": "ctx"});
      c.appendChild(el("summary", {}, "privileged context the teacher saw"));
      c.appendChild(el("pre", {}, s.serl.context));
      d.appendChild(c);
    } else if (s.feedback) {
      d.appendChild(el("div", {"class": "lbl"}, "feedback"));
      d.appendChild(el("pre", {"class": "fb"}, s.feedback));
    }
    return d;
  }
  function trajNode(t) {
    var d = el("details", {"class": "traj", id: "traj-" + t.traj_uid, "data-type": t.task_type,
      "data-won": t.won ? "1" : "0", "data-ctx": t.has_context ? "1" : "0", "data-iteration": t.iteration, "data-run": t.run});
    var s = el("summary");
    s.appendChild(document.createTextNode((DATA.runs.length > 1 ? t.run + " · " : "") +
      (t.source === "trace" ? "iteration " + t.iteration : "last rollout") + " · " + t.task_type + " · " + (t.task_text || "")));
    s.appendChild(el("span", {"class": "badge " + (t.won ? "won" : "lost")}, t.won ? "success" : "failure"));
    s.appendChild(el("span", {"class": "badge"}, "reward " + fmt(t.episode_reward) + " · " + t.steps.length + " step(s)"));
    if (t.has_context) s.appendChild(el("span", {"class": "badge ctxb"}, "SERL context"));
    d.appendChild(s);
    d.appendChild(el("div", {"class": "task"}, "Task: " + (t.task_text || t.task_id)));
    t.steps.forEach(function (st) { d.appendChild(stepNode(st)); });
    return d;
  }

  // filters
  var filtersDiv = document.getElementById("filters");
  function select(name, label, options) {
    var wrap = el("label", {}, label + " ");
    var sel = el("select", {id: "filter-" + name});
    options.forEach(function (o) { sel.appendChild(el("option", {value: o[0]}, o[1])); });
    wrap.appendChild(sel);
    filtersDiv.appendChild(wrap);
    sel.addEventListener("change", applyFilters);
    return sel;
  }
  var types = []; trajs.forEach(function (t) { if (types.indexOf(t.task_type) < 0) types.push(t.task_type); }); types.sort();
  var its = []; trajs.forEach(function (t) { if (its.indexOf(t.iteration) < 0) its.push(t.iteration); });
  var fType = select("type", "task type", [["", "all"]].concat(types.map(function (x) { return [x, x]; })));
  var fWon = select("won", "outcome", [["", "all"], ["1", "success"], ["0", "failure"]]);
  var fCtx = select("ctx", "SERL context", [["", "all"], ["1", "present"], ["0", "absent"]]);
  var fIt = select("iteration", "iteration", [["", "all"]].concat(its.map(function (x) { return [String(x), String(x)]; })));
  var count = el("span", {"class": "muted", id: "traj-count"});
  filtersDiv.appendChild(count);

  var legend = document.getElementById("legend");
  if (trajs.some(function (t) { return t.steps.some(function (s) { return s.serl && s.serl.weights; }); })) {
    legend.appendChild(document.createTextNode("Action tokens coloured by SERL's weight W: "));
    legend.appendChild(el("span", {"class": "tok", style: "background:" + tokenColor(1 - scale)}, "W < 1"));
    legend.appendChild(document.createTextNode(" "));
    legend.appendChild(el("span", {"class": "tok", style: "background:" + tokenColor(1 + scale)}, "W > 1"));
    legend.appendChild(document.createTextNode("  (full colour: |W − 1| = " + fmt(scale) + ", the largest on this page; hover a token for W and the teacher − student log-prob gap)"));
  } else if (trajs.length) {
    legend.appendChild(document.createTextNode("No SERL weights in these trajectories (SERL off, or a run without a trace)."));
  }

  var list = document.getElementById("traj-list");
  if (!trajs.length) list.appendChild(el("p", {"class": "muted"}, "No trajectories recorded (trainer.trace_freq=0, or the run has not finished an iteration)."));
  var nodes = trajs.map(function (t) { var n = trajNode(t); list.appendChild(n); return n; });

  function applyFilters() {
    var shown = 0;
    nodes.forEach(function (n) {
      var ok = (!fType.value || n.getAttribute("data-type") === fType.value) &&
        (!fWon.value || n.getAttribute("data-won") === fWon.value) &&
        (!fCtx.value || n.getAttribute("data-ctx") === fCtx.value) &&
        (!fIt.value || n.getAttribute("data-iteration") === fIt.value);
      n.style.display = ok ? "" : "none";
      if (ok) shown++;
    });
    count.textContent = shown + " of " + nodes.length + " trajectories";
  }
  applyFilters();
  // open the trajectory named in the URL (#traj-<uid>), else the first one with SERL weights, else the first
  var target = location.hash ? document.getElementById(location.hash.slice(1)) : null;
  if (!target) {
    var k = trajs.findIndex(function (t) { return t.steps.some(function (s) { return s.serl && s.serl.weights && s.serl.weights.some(function (w) { return w !== 1; }); }); });
    target = nodes[k >= 0 ? k : 0];
  }
  if (target) target.open = true;
})();
