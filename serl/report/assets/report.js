// serl report: draws the curves (inline SVG) and the trajectory browser from the JSON in #serl-data.
// No network, no libraries.
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("serl-data").textContent);
  var PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];
  var SVGNS = "http://www.w3.org/2000/svg";

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in (attrs || {})) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function svg(tag, attrs) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in (attrs || {})) e.setAttribute(k, attrs[k]);
    return e;
  }
  function fmt(v) {
    if (v === null || v === undefined) return "–";
    var a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e4)) return v.toExponential(2);
    return String(Math.round(v * 1000) / 1000);
  }

  function tick(v, range) {  // enough digits to tell the ticks of a narrow range apart
    var digits = Math.max(0, Math.ceil(-Math.log10(range / 4)) + 1);
    if (Math.abs(v) >= 1e4) return v.toExponential(2);
    var t = v.toFixed(Math.min(digits, 8));
    return t.length > 7 ? String(Number(v.toPrecision(6))) : t;
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
  function drawChart(panel) {
    var W = 380, H = 210, L = 52, R = 8, T = 8, B = 24;
    var box = el("div", {"class": "chart", "data-title": panel.title});
    box.appendChild(el("h3", {}, panel.title));
    var xs = [], ys = [];
    panel.series.forEach(function (s) { s.points.forEach(function (p) { xs.push(p[0]); ys.push(p[1]); }); });
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = Math.min.apply(null, ys), y1 = Math.max.apply(null, ys);
    if (x1 === x0) { x0 -= 1; x1 += 1; }
    if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
    var pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    function px(x) { return L + (x - x0) / (x1 - x0) * (W - L - R); }
    function py(y) { return T + (1 - (y - y0) / (y1 - y0)) * (H - T - B); }
    var g = svg("svg", {width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img"});
    for (var i = 0; i <= 4; i++) {
      var yv = y0 + (y1 - y0) * i / 4;
      g.appendChild(svg("line", {"class": "grid", x1: L, x2: W - R, y1: py(yv), y2: py(yv)}));
      var t = svg("text", {x: L - 4, y: py(yv) + 3, "text-anchor": "end"}); t.textContent = tick(yv, y1 - y0); g.appendChild(t);
    }
    g.appendChild(svg("line", {"class": "axis", x1: L, x2: L, y1: T, y2: H - B}));
    g.appendChild(svg("line", {"class": "axis", x1: L, x2: W - R, y1: H - B, y2: H - B}));
    [x0, Math.round((x0 + x1) / 2), x1].filter(function (v, j, a) { return a.indexOf(v) === j; }).forEach(function (xv) {
      var t = svg("text", {x: px(xv), y: H - B + 14, "text-anchor": "middle"}); t.textContent = fmt(xv); g.appendChild(t);
    });
    var xl = svg("text", {x: W - R, y: H - 2, "text-anchor": "end"}); xl.textContent = "iteration"; g.appendChild(xl);
    var legend = el("div");
    panel.series.forEach(function (s, k) {
      var color = PALETTE[k % PALETTE.length];
      var d = s.points.map(function (p, j) { return (j ? "L" : "M") + px(p[0]).toFixed(1) + " " + py(p[1]).toFixed(1); }).join(" ");
      var label = (DATA.runs.length > 1 ? s.run + ": " : "") + s.key;
      var path = svg("path", {"class": "line", d: d, stroke: color, "data-key": s.key, "data-run": s.run,
        "data-points": s.points.length});
      if (DATA.runs.length > 1 && DATA.runs[0].name !== s.run) path.setAttribute("stroke-dasharray", "5 3");
      g.appendChild(path);
      if (s.points.length <= 60) s.points.forEach(function (p) {
        var c = svg("circle", {cx: px(p[0]), cy: py(p[1]), r: 2.4, fill: color});
        var tt = svg("title"); tt.textContent = label + " @" + p[0] + " = " + fmt(p[1]); c.appendChild(tt);
        g.appendChild(c);
      });
      var key = el("span", {"class": "key"});
      key.appendChild(el("span", {"class": "swatch", style: "background:" + color}));
      key.appendChild(document.createTextNode(label));
      legend.appendChild(key);
    });
    box.appendChild(g);
    box.appendChild(legend);
    return box;
  }
  var charts = document.getElementById("charts");
  if (!DATA.panels.length) charts.appendChild(el("p", {"class": "muted"}, "No metrics recorded yet (metrics.jsonl is empty or missing)."));
  DATA.panels.forEach(function (p) { charts.appendChild(drawChart(p)); });

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
    var w = s.serl && s.serl.weights, gap = s.serl && s.serl.lp_gap, plain = "";
    function flush() { if (plain) { pre.appendChild(document.createTextNode(plain)); plain = ""; } }
    s.tokens.forEach(function (sp, i) {
      var piece = text.slice(sp[0], sp[1]);
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
    d.appendChild(el("div", {"class": "lbl"}, "reply (action tokens underlined" + (s.serl && s.serl.weights ? ", coloured by W" : "") + ")"));
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
