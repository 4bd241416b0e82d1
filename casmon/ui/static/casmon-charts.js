// casmon ui: charts of logged metrics, drawn by uPlot (uPlot.iife.min.js beside this file, vendored).
// What to draw comes from the page's JSON data block, #casmon-chart-data (read
// as data, never run); the points come from /api/run/NAME/metrics (the server, downsampled there to a min/max
// envelope) or from the block itself (a report file, which has no server). No inline script and no style
// attribute anywhere: uPlot sizes its elements through the CSSOM, which the Content-Security-Policy allows.
"use strict";
(function () {
  var PALETTE = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#1b7c83", "#e16f24", "#6e7781",
    "#bf3989", "#4c2889"];
  // Buckets asked of the server per series: one a pixel of the panel (each keeps its min and max, so every
  // spike the full series would draw is drawn), within these bounds.
  var MIN_POINTS = 100, MAX_POINTS = 4000;

  function bucketsFor(area) {
    var w = Math.ceil((area && area.clientWidth) || 600);
    return Math.max(MIN_POINTS, Math.min(MAX_POINTS, Math.ceil(w / 50) * 50));  // a few sizes: the server keeps them
  }

  // The server packs each list as base64 little-endian float64 ("enc": "f64"): a tenth of the time JSON numbers
  // take at both ends. NaN and infinities come as NaN: gaps (null) in a line, as in the JSON form.
  function unpackList(b64, gaps) {
    var bin = atob(b64), n = bin.length >> 3, bytes = new Uint8Array(bin.length), out = new Array(n);
    for (var i = 0; i < bin.length; i++) { bytes[i] = bin.charCodeAt(i); }
    var view = new DataView(bytes.buffer);
    for (var j = 0; j < n; j++) {
      var v = view.getFloat64(8 * j, true);
      out[j] = gaps && v !== v ? null : v;
    }
    return out;
  }

  function unpack(s) {
    if (!s || s.enc !== "f64") { return s; }
    ["step", "time", "value", "min", "max"].forEach(function (k) {
      if (typeof s[k] === "string") { s[k] = unpackList(s[k], k !== "step"); }
    });
    delete s.enc;
    return s;
  }

  // The i-th of n colours: the palette for up to ten lines; more, and n hues evenly spaced round the colour
  // wheel (two lightnesses in turn), so no two lines of one chart share a colour.
  function colour(i, n) {
    if ((n || 0) <= PALETTE.length) { return PALETTE[i % PALETTE.length]; }
    return hslHex((i * 360 / n + 210) % 360, 0.7, i % 2 ? 0.34 : 0.48);
  }

  function hslHex(h, s, l) {
    var f = function (k) {
      var t = (k + h / 30) % 12;
      var v = l - s * Math.min(l, 1 - l) * Math.max(-1, Math.min(t - 3, 9 - t, 1));
      return ("0" + Math.round(v * 255).toString(16)).slice(-2);
    };
    return "#" + f(0) + f(8) + f(4);
  }

  // A log scale's ticks: the powers of ten in view (each labelled alike: 0.0001 or 1e-5 on every tick of
  // an axis), with 2 and 5 between them only when the view is within one decade (zoomed in).
  function logSplits(u, axisIdx, min, max) {
    if (!(min > 0) || !(max > 0)) { return []; }
    var lo = Math.floor(Math.log10(min) + 1e-9), hi = Math.ceil(Math.log10(max) - 1e-9), out = [];
    var steps = hi - lo < 2 ? [1, 2, 5] : [1];
    var every = Math.max(1, Math.ceil((hi - lo) / 8));  // at most about eight labelled decades
    for (var e = lo; e <= hi; e++) {
      if ((e - lo) % every) { continue; }
      steps.forEach(function (m) {
        var v = m * Math.pow(10, e);
        if (v >= min * (1 - 1e-9) && v <= max * (1 + 1e-9)) { out.push(Number(v.toPrecision(12))); }
      });
    }
    return out;
  }

  function logValues(u, vals) {
    var exps = vals.filter(function (v) { return v > 0; }).map(function (v) { return Math.floor(Math.log10(v) + 1e-9); });
    var wide = exps.some(function (e) { return e < -4 || e > 5; });
    return vals.map(function (v) {
      if (!(v > 0)) { return ""; }
      var e = Math.floor(Math.log10(v) + 1e-9), m = Math.round(v / Math.pow(10, e));
      if (wide) { return m + "e" + e; }
      return e < 0 ? v.toFixed(-e) : String(Math.round(v));
    });
  }

  function logAxis(axis) {
    axis.splits = logSplits;
    axis.values = logValues;
    axis.filter = function (u, splits) { return splits; };  // every tick labelled (uPlot's own blanks some)
    return axis;
  }

  function rgba(hex, a) {
    var n = parseInt(hex.slice(1), 16);
    return "rgba(" + (n >> 16) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + a + ")";
  }

  function fmt(v, digits) {
    var p = digits || 4;
    if (v === null || v === undefined || !isFinite(v)) { return "–"; }
    if (v === 0) { return "0"; }
    var a = Math.abs(v);
    if (a >= 1e5 || a < 1e-3) { return v.toPrecision(p - 1).replace(/\.?0+e/, "e"); }
    return String(Number(v.toPrecision(p)));
  }

  // An axis's tick labels with the digits it takes to tell them apart: over a narrow range (scores that differ
  // in the sixth digit) four would label every tick alike.
  function tickLabels(vals) {
    var out = vals.map(function (v) { return fmt(v); });
    for (var p = 5; p <= 15 && new Set(out).size < out.length; p++) {
      out = vals.map(function (v) { return fmt(v, p); });
    }
    return out;
  }

  // o[k] where o holds k itself: a metric, parameter or value named "constructor" or "__proto__" is no Object's own.
  function own(o, k) { return o && Object.prototype.hasOwnProperty.call(o, k) ? o[k] : undefined; }

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) { e.textContent = text; }
    return e;
  }

  // -- series: from the data block, or from the server (kept per run and metric until the run changes) --
  var cache = Object.create(null);

  function seriesKey(tail, metric) { return tail + "\u0000" + metric; }

  // -- transformations: x axis, smoothing, log scale, groups --
  function xsOf(s, mode, run) {
    if (mode === "step" || mode === "index" || !s.time) { return s.step; }
    if (mode === "elapsed") {
      var t0 = typeof run.start === "number" ? run.start : (s.time.length ? s.time[0] : 0);
      return s.time.map(function (t) { return t - t0; });
    }
    return s.time;
  }

  // Exponential moving average, debiased as TensorBoard's is (the first points are not pulled to zero).
  function ema(ys, w) {
    if (!w) { return ys; }
    var acc = 0, k = 0;
    return ys.map(function (v) {
      if (v === null || v === undefined || !isFinite(v)) { return v; }
      acc = acc * w + (1 - w) * v;
      k += 1;
      return acc / (1 - Math.pow(w, k));
    });
  }

  function positive(ys) { return ys.map(function (v) { return v > 0 ? v : null; }); }

  // Sorted by x (uPlot wants x ascending); equal x keep their order.
  function ordered(xs, cols) {
    for (var i = 1; i < xs.length; i++) {
      if (xs[i] < xs[i - 1]) {
        var idx = xs.map(function (_x, j) { return j; }).sort(function (a, b) { return xs[a] - xs[b] || a - b; });
        return [idx.map(function (j) { return xs[j]; })].concat(cols.map(function (c) {
          return c ? idx.map(function (j) { return c[j]; }) : c;
        }));
      }
    }
    return [xs].concat(cols);
  }

  // Lines for uPlot: one per run, or (grouped by a parameter) one per group with its mean and a min-max band.
  function linesOf(spec, byTail, state) {
    var lines = [];
    spec.runs.forEach(function (run, i) {
      var s = byTail[run.tail];
      if (!s || !s.value || !s.value.length) { return; }
      var xs = xsOf(s, state.x, run);
      var enveloped = s.min && s.n > s.value.length;
      var o = ordered(xs, [s.value, enveloped ? s.min : null, enveloped ? s.max : null]);
      lines.push({label: run.name, colour: colour(i, spec.runs.length), x: o[0], y: o[1], lo: o[2], hi: o[3], run: run,
        n: s.n, marks: marksOf(s, xs)});
    });
    if (!state.group) { return lines; }
    var groups = Object.create(null), order = [];
    lines.forEach(function (l) {
      var v = own(l.run.params, state.group);
      var key = v === undefined ? "(none)" : String(v);
      if (!groups[key]) { groups[key] = []; order.push(key); }
      groups[key].push(l);
    });
    // Legends in order: numbers by value, text as text, runs without the parameter last.
    var numeric = order.every(function (k) { return k === "(none)" || (k !== "" && isFinite(Number(k))); });
    order.sort(function (a, b) {
      if (a === "(none)" || b === "(none)") { return (a === "(none)") - (b === "(none)"); }
      return numeric ? Number(a) - Number(b) : (a < b ? -1 : a > b ? 1 : 0);
    });
    return order.map(function (key, gi) {
      var members = groups[key];
      var joined = uPlot.join(members.map(function (l) { return [l.x, l.y]; }));
      var xs = joined[0], mean = [], lo = [], hi = [];
      var filled = members.map(function (_l, mi) { return interpolate(xs, joined[mi + 1]); });
      for (var j = 0; j < xs.length; j++) {
        var sum = 0, n = 0, mn = Infinity, mx = -Infinity;
        filled.forEach(function (ys) {
          var v = ys[j];
          if (v !== null && v !== undefined && isFinite(v)) { sum += v; n += 1; mn = Math.min(mn, v); mx = Math.max(mx, v); }
        });
        mean.push(n ? sum / n : null);
        lo.push(n ? mn : null);
        hi.push(n ? mx : null);
      }
      return {label: state.group + "=" + key + " (" + members.length + (members.length === 1 ? " run)" : " runs)"),
        colour: colour(gi, order.length), x: xs, y: mean, lo: lo, hi: hi, group: true};
    });
  }

  // NaN and infinities are gaps in a line (no axis holds them): the server names the points (or buckets)
  // that hold them, and each is marked on the chart: +inf a triangle at the top, -inf one at the bottom, NaN
  // a cross below the top.
  var MARK_KINDS = ["NaN", "Infinity", "-Infinity"];
  var MARK_SIGNS = {"NaN": "\u2715 NaN", "Infinity": "\u25b2 +inf", "-Infinity": "\u25bc -inf"};

  function marksOf(s, xs) {
    var out = [];
    MARK_KINDS.forEach(function (kind) {
      ((s.marks || {})[kind] || []).forEach(function (i) { if (xs[i] !== undefined && xs[i] !== null) { out.push({x: xs[i], kind: kind}); } });
    });
    return out;
  }

  function marksText(name, marks) {
    var counts = Object.create(null);
    marks.forEach(function (m) { counts[m.kind] = (counts[m.kind] || 0) + 1; });
    var parts = MARK_KINDS.filter(function (k) { return counts[k]; }).map(function (k) {
      return MARK_SIGNS[k] + " \u00d7" + counts[k].toLocaleString();
    });
    return parts.length ? name + ": " + parts.join(", ") : "";
  }

  function marksHook(marked) {
    return function (u) {
      var ctx = u.ctx, r = window.devicePixelRatio || 1, top = u.bbox.top, bottom = u.bbox.top + u.bbox.height;
      ctx.save();
      marked.forEach(function (m) {
        if (!u.series[m.series].show) { return; }
        ctx.fillStyle = m.colour;
        ctx.strokeStyle = m.colour;
        ctx.lineWidth = 2 * r;
        m.marks.forEach(function (k) {
          var px = u.valToPos(k.x, "x", true), h = 7 * r;
          if (!(px >= u.bbox.left - 1 && px <= u.bbox.left + u.bbox.width + 1)) { return; }
          ctx.beginPath();
          if (k.kind === "Infinity") {
            ctx.moveTo(px, top); ctx.lineTo(px - h, top + 1.6 * h); ctx.lineTo(px + h, top + 1.6 * h); ctx.closePath(); ctx.fill();
          } else if (k.kind === "-Infinity") {
            ctx.moveTo(px, bottom); ctx.lineTo(px - h, bottom - 1.6 * h); ctx.lineTo(px + h, bottom - 1.6 * h); ctx.closePath(); ctx.fill();
          } else {
            var y = top + 2.6 * h;
            ctx.moveTo(px - h, y - h); ctx.lineTo(px + h, y + h); ctx.moveTo(px + h, y - h); ctx.lineTo(px - h, y + h); ctx.stroke();
          }
        });
      });
      ctx.restore();
    };
  }

  // A run's values at every x of a union: linear between its own points, nothing outside its range.
  function interpolate(xs, ys) {
    var out = ys.slice(), last = -1;
    for (var j = 0; j < ys.length; j++) {
      if (ys[j] === null || ys[j] === undefined) { continue; }
      if (last >= 0 && j - last > 1) {
        for (var k = last + 1; k < j; k++) {
          var f = (xs[k] - xs[last]) / ((xs[j] - xs[last]) || 1);
          out[k] = ys[last] + f * (ys[j] - ys[last]);
        }
      }
      last = j;
    }
    return out;
  }

  // Bands (a downsampled run's min-max envelope, a group's spread) drawn under the lines, clipped to the plot.
  function bandsHook(bands) {
    return function (u) {
      var ctx = u.ctx;
      ctx.save();
      ctx.beginPath();
      ctx.rect(u.bbox.left, u.bbox.top, u.bbox.width, u.bbox.height);
      ctx.clip();
      bands.forEach(function (b) {
        if (!u.series[b.series].show) { return; }
        var xs = u.data[0], lo = u.data[b.lo], hi = u.data[b.hi], up = [], down = [];
        for (var j = 0; j < xs.length; j++) {
          var a = lo[j], z = hi[j];
          if (a === null || a === undefined || z === null || z === undefined) { continue; }
          var px = u.valToPos(xs[j], "x", true);
          up.push([px, u.valToPos(z, "y", true)]);
          down.push([px, u.valToPos(a, "y", true)]);
        }
        if (up.length < 2) { return; }
        ctx.beginPath();
        ctx.moveTo(up[0][0], up[0][1]);
        up.forEach(function (p) { ctx.lineTo(p[0], p[1]); });
        for (var k = down.length - 1; k >= 0; k--) { ctx.lineTo(down[k][0], down[k][1]); }
        ctx.closePath();
        ctx.fillStyle = rgba(b.colour, 0.16);
        ctx.fill();
        // The edges drawn too: a bucket holding one spike among thousands of points is narrower than a pixel,
        // so its fill alone is invisible; its edge goes up to the spike and back, at full height.
        ctx.lineWidth = window.devicePixelRatio || 1;
        ctx.strokeStyle = rgba(b.colour, 0.55);
        [up, down].forEach(function (edge) {
          ctx.beginPath();
          ctx.moveTo(edge[0][0], edge[0][1]);
          edge.forEach(function (p) { ctx.lineTo(p[0], p[1]); });
          ctx.stroke();
        });
      });
      ctx.restore();
    };
  }

  function noPath() { return null; }

  var X_LABELS = {step: "step", elapsed: "seconds since the run started", time: "time", index: "index"};

  // Clears a chart area; a plot it held is destroyed (it leaves its cursor-sync group too).
  function clearArea(area) {
    if (area.uplot) { area.uplot.destroy(); area.uplot = null; }
    area.textContent = "";
  }

  // ``extra``: a dashboard panel's options (its height, the synced cursor, more hooks), over the defaults.
  function plotCurves(area, lines, state, title, extra) {
    clearArea(area);
    extra = extra || {};
    if (!lines.length) { area.appendChild(el("p", {"class": "muted"}, "no points to draw")); return null; }
    var tables = lines.map(function (l) {
      var ys = ema(l.y, state.smooth), lo = l.lo, hi = l.hi;
      if (state.log) { ys = positive(ys); lo = lo && positive(lo); hi = hi && positive(hi); }
      return lo && hi ? [l.x, ys, lo, hi] : [l.x, ys];
    });
    var joined = uPlot.join(tables), data = [joined[0]], series = [{label: X_LABELS[state.x] || "x",
      value: function (u, v) { return state.x === "time" && v !== null ? new Date(v * 1000).toLocaleString() : fmt(v); }}];
    var bands = [], marked = [], col = 1;
    lines.forEach(function (l, i) {
      data.push(joined[col]);
      // A line needs two points: a series with one finite value is drawn as a dot, or it would not show at all.
      var lone = l.y.filter(function (v) { return v !== null && isFinite(v); }).length < 2;
      series.push({label: l.label, stroke: l.colour, width: l.group ? 2 : 1.5, spanGaps: true,
        points: lone ? {show: true, size: 8, fill: l.colour} : {show: false},
        value: function (u, v) { return fmt(v); }});
      var own = data.length - 1;
      if (l.marks && l.marks.length) { marked.push({series: own, marks: l.marks, colour: l.colour}); }
      col += 1;
      if (tables[i].length === 4) {
        data.push(joined[col], joined[col + 1]);
        bands.push({series: own, lo: data.length - 2, hi: data.length - 1, colour: l.colour});
        // No path of their own (bandsHook draws the band): uPlot would build two unseen lines per run.
        series.push({label: l.label + " min", band: true, stroke: "transparent", width: 0, points: {show: false},
          paths: noPath, value: function (u, v) { return fmt(v); }},
          {label: l.label + " max", band: true, stroke: "transparent", width: 0, points: {show: false},
            paths: noPath, value: function (u, v) { return fmt(v); }});
        col += 2;
      }
    });
    var width = Math.max(240, Math.floor(area.clientWidth || 600));
    var opts = {
      title: extra.title === false ? undefined : title, width: width, height: extra.height || 260,
      scales: {x: {time: state.x === "time"}, y: state.log ? {distr: 3, log: 10} : {}},
      axes: [{label: X_LABELS[state.x] || "x", labelSize: 18, size: 40},
        yAxis({label: extra.title === false ? "" : title, labelSize: extra.title === false ? 0 : 18, size: 60}, state.log)],
      series: series,
      legend: {live: true},
      cursor: Object.assign({drag: {x: true, y: false, setScale: true}}, extra.cursor || {}),
      hooks: Object.assign({draw: [bandsHook(bands), marksHook(marked)]}, extra.hooks || {})
    };
    var u = new uPlot(opts, data, area);
    hideBandLegend(u);
    var said = lines.map(function (l) { return l.marks ? marksText(l.label, l.marks) : ""; }).filter(Boolean);
    if (said.length) { area.appendChild(el("p", {"class": "muted chart-marks"}, said.join("; "))); }
    area.uplot = u;
    return u;
  }

  function yAxis(axis, log) {
    if (log) { return logAxis(axis); }
    axis.values = function (u, vals) { return tickLabels(vals); };
    // as wide as its longest label (the digits a narrow range takes), never narrower than asked
    var base = axis.size || 50;
    axis.size = function (u, values) {
      var longest = Math.max.apply(null, (values || []).map(function (l) { return String(l).length; }).concat([0]));
      return Math.max(base, Math.ceil(longest * 7.5 + 24));
    };
    return axis;
  }

  // A band's edges are series of their own (uPlot draws what it has data for): their legend rows are
  // hidden (a class, not a style attribute); the band is drawn by bandsHook.
  function hideBandLegend(u) {
    var rows = u.root.querySelectorAll(".u-legend .u-series");
    u.series.forEach(function (s, i) {
      if (s.band && rows[i]) { rows[i].classList.add("band-row"); }
    });
  }

  function plotScatter(area, spec, state) {
    clearArea(area);
    var param = state.sx, metric = state.sy, stat = state.stat;
    var pts = [];
    spec.runs.forEach(function (run, i) {
      var x = own(run.params, param);
      var y = yValue(spec, run, metric, stat);
      if (x !== undefined && x !== null && typeof y === "number" && isFinite(y)) { pts.push({run: run, i: i, x: x, y: y}); }
    });
    if (!pts.length) { area.appendChild(el("p", {"class": "muted"}, "no run has both " + param + " and " + metric)); return null; }
    var numeric = pts.every(function (p) { return typeof p.x === "number"; });
    var cats = [];
    if (!numeric) {
      pts.forEach(function (p) { var k = String(p.x); if (cats.indexOf(k) < 0) { cats.push(k); } });
      cats.sort();
      pts.forEach(function (p) { p.xv = cats.indexOf(String(p.x)); });
    } else {
      pts.forEach(function (p) { p.xv = p.x; });
    }
    pts.sort(function (a, b) { return a.xv - b.xv || a.i - b.i; });
    var xs = pts.map(function (p) { return p.xv; });
    var data = [xs], series = [{label: param, value: function (u, v) { return numeric ? fmt(v) : (cats[v] || "–"); }}];
    // A log x (lr from 0.001 to 1): numbers above zero only; a run at zero or below is left out and named.
    var logx = !!state.logx && numeric;
    var dropped = logx ? pts.filter(function (p) { return !(p.x > 0); }) : [];
    if (logx) { pts = pts.filter(function (p) { return p.x > 0; }); xs = pts.map(function (p) { return p.xv; }); data = [xs]; }
    if (!pts.length) { area.appendChild(el("p", {"class": "muted"}, "no run has " + param + " above zero")); return null; }
    pts.forEach(function (p, j) {
      var ys = xs.map(function () { return null; });
      ys[j] = state.log && p.y <= 0 ? null : p.y;
      data.push(ys);
      var c = colour(p.i, spec.runs.length);
      series.push({label: p.run.name, stroke: c, fill: c, paths: function () { return null; },
        points: {show: true, size: 10, fill: c}, value: function (u, v) { return fmt(v); }});
    });
    var width = Math.max(240, Math.floor(area.clientWidth || 600));
    var xaxis = {label: param, labelSize: 18, size: 40};
    if (!numeric) {
      xaxis.splits = function () { return cats.map(function (_c, i) { return i; }); };
      xaxis.values = function (u, vals) { return vals.map(function (v) { return cats[v] === undefined ? "" : cats[v]; }); };
    } else if (logx) {
      logAxis(xaxis);
    }
    var pad = numeric ? 0 : 0.5;
    var opts = {
      title: metric + " (" + stat + ") by " + param, width: width, height: 300,
      scales: {x: logx ? {time: false, distr: 3, log: 10, range: function (u, mn, mx) {
        var lo = Math.pow(10, Math.floor(Math.log10(mn))), hi = Math.pow(10, Math.ceil(Math.log10(mx)));
        return hi > lo ? [lo, hi] : [lo / 10, hi * 10];
      }} : {time: false, range: function (u, mn, mx) {
        if (!numeric) { return [-pad, cats.length - 1 + pad]; }
        var d = (mx - mn) || Math.abs(mx) || 1;
        return [mn - d * 0.05, mx + d * 0.05];
      }}, y: state.log ? {distr: 3, log: 10} : {}},
      axes: [xaxis, yAxis({label: metric, labelSize: 18, size: 72}, state.log)],
      series: series, legend: {live: true}, cursor: {drag: {x: true, y: false, setScale: true}}
    };
    var u = new uPlot(opts, data, area);
    area.uplot = u;
    if (dropped.length) {
      area.appendChild(el("p", {"class": "muted"}, "left out on a log scale (" + param + " not above zero): " +
        dropped.map(function (p) { return p.run.name; }).join(", ")));
    }
    return u;
  }

  function yValue(spec, run, metric, stat) {
    if (metric.indexOf("info:") === 0) { return own(run.info, metric.slice(5)); }
    return own(own(run.summary, metric), stat);
  }

  // -- controls --
  function select(label, name, options, value) {
    var wrap = el("label", {"class": "control"}, label + " ");
    var s = el("select", {name: name, "data-control": name});
    options.forEach(function (o) {
      var opt = el("option", {value: o[0]}, o[1]);
      if (o[0] === value) { opt.selected = true; }
      s.appendChild(opt);
    });
    wrap.appendChild(s);
    return wrap;
  }

  function checkbox(label, name, value) {
    var wrap = el("label", {"class": "control"});
    var c = el("input", {type: "checkbox", name: name, "data-control": name});
    c.checked = !!value;
    wrap.appendChild(c);
    wrap.appendChild(document.createTextNode(" " + label));
    return wrap;
  }

  function slider(label, name, value) {
    var wrap = el("label", {"class": "control"}, label + " ");
    var r = el("input", {type: "range", min: "0", max: "0.99", step: "0.01", name: name, "data-control": name});
    r.value = String(value);
    var out = el("output", {"data-for": name}, String(value));
    wrap.appendChild(r);
    wrap.appendChild(out);
    return wrap;
  }

  function metricOptions(spec) {
    return spec.metrics.map(function (m) { return [m, m.indexOf("info:") === 0 ? "info " + m.slice(5) : m]; });
  }

  function readControls(box, state) {
    box.querySelectorAll("[data-control]").forEach(function (c) {
      var k = c.getAttribute("data-control");
      if (c.type === "checkbox") { state[k] = c.checked; } else if (c.type === "range") { state[k] = parseFloat(c.value); } else { state[k] = c.value; }
    });
    var out = box.querySelector("output[data-for=smooth]");
    if (out) { out.textContent = String(state.smooth); }
  }

  function xOptions(spec) {
    var opts = [["step", "step"]];
    if (spec.times !== false) { opts.push(["elapsed", "time since start"], ["time", "wall-clock time"]); }
    return opts;
  }

  // -- the dashboard: every metric in a panel of its own, grouped by prefix (train/, val/, ..., the
  // ungrouped, sys/), groups collapsible; cursors and x zoom follow each other across panels; smoothing (and, on the
  // compare page, grouping by a parameter) for all, a log scale per panel. A panel draws when it comes near
  // the window (IntersectionObserver): a run of 200 metrics fetches and draws only what is seen, the panels
  // coming into view together in one request per run (/api/run/NAME/metrics?name=...).
  var SYNC = "casmon-dashboard";
  var GROUP_NAMES = {"": "other metrics", info: "info curves"};

  function dashboard(panel, spec) {
    var state = {x: "step", smooth: 0, group: ""};
    var zoom = null;  // the x range every panel shows, or null: each its own data's
    var applying = false;  // a zoom being applied to the panels: their setScale hooks stay quiet
    var panels = Object.create(null), order = [];  // no prototype: a metric may be named __proto__
    var controls = el("div", {"class": "chart-controls dash-controls"});
    controls.appendChild(select("x", "x", xOptions(spec), "step"));
    controls.appendChild(slider("smoothing", "smooth", 0));
    if (spec.mode === "compare" && spec.groupable.length) {
      controls.appendChild(select("group by", "group", [["", "(each run)"]].concat(spec.groupable.map(function (p) { return [p, p]; })), ""));
    }
    var reset = el("button", {type: "button", "class": "dash-reset", "data-control-reset": "zoom", disabled: "disabled"}, "reset zoom");
    controls.appendChild(reset);
    var note = el("span", {"class": "muted chart-note"}, "Drag across a panel to zoom all of them, double-click to zoom out.");
    controls.appendChild(note);
    panel.appendChild(controls);
    var groupsBox = el("div", {"class": "dash-groups"});
    panel.appendChild(groupsBox);
    var grids = Object.create(null);

    function groupOf(m) {
      if (m.indexOf("info:") === 0) { return "info"; }
      var k = m.indexOf("/");
      return k > 0 && k < m.length - 1 ? m.slice(0, k) : "";
    }

    function gridFor(g, count) {
      if (grids[g]) { return grids[g]; }
      var sec = el("details", {"class": "dash-group", "data-group": g, open: "open"});
      var sum = el("summary", {}, GROUP_NAMES[g] !== undefined ? GROUP_NAMES[g] : g + "/");
      sum.appendChild(el("span", {"class": "muted dash-count"}, " " + count));
      sec.appendChild(sum);
      var grid = el("div", {"class": "chart-grid"});
      sec.appendChild(grid);
      groupsBox.appendChild(sec);
      grids[g] = grid;
      return grid;
    }

    function countGroup(g) {
      var sec = null;
      groupsBox.querySelectorAll("details.dash-group").forEach(function (d) { if (d.getAttribute("data-group") === g) { sec = d; } });
      if (sec) { sec.querySelector(".dash-count").textContent = " " + sec.querySelectorAll("figure.chart-box").length; }
    }

    function addPanel(m, count) {
      var g = groupOf(m);
      var fig = el("figure", {"class": "chart-box", "data-metric": m});
      var head = el("figcaption", {"class": "panel-head"});
      head.appendChild(el("span", {"class": "panel-title", title: m}, m.indexOf("info:") === 0 ? m.slice(5) : m));
      var log = el("label", {"class": "control panel-log"});
      var box = el("input", {type: "checkbox", "data-panel-log": "1"});
      log.appendChild(box);
      log.appendChild(document.createTextNode(" log"));
      head.appendChild(log);
      var area = el("div", {"class": "chart-area"});
      area.appendChild(el("p", {"class": "muted panel-wait"}, "…"));
      fig.appendChild(head);
      fig.appendChild(area);
      gridFor(g, count).appendChild(fig);
      var p = {metric: m, fig: fig, area: area, log: false, drawn: false, visible: false, stale: true, loading: false,
        detailed: false};
      box.addEventListener("change", function () { p.log = box.checked; if (p.drawn) { draw(p); } });
      panels[m] = p;
      order.push(m);
      if (observer) { observer.observe(fig); } else { p.visible = true; want(p); }
      return p;
    }

    // -- loading: the panels wanted are fetched together, one request per run, at most 100 metrics each --
    var queue = [], flushing = null;
    function want(p) {
      if (p.loading) { return; }
      p.loading = true;
      queue.push(p);
      if (!flushing) { flushing = Promise.resolve().then(flush); }
    }

    function hasMetric(run, m) { return !!own(run.summary, m); }

    function flush() {
      var batch = queue;
      queue = [];
      flushing = null;
      var fetches = [];
      if (spec.api) { fetches = fetchAll(batch, "", cache); }
      var done = function (err) {
        batch.forEach(function (p) {
          p.loading = false;
          if (err) { clearArea(p.area); p.area.appendChild(el("p", {"class": "casmon-error"}, String(err.message || err))); return; }
          p.stale = false;
          draw(p);
        });
      };
      return Promise.all(fetches).then(function () { done(null); }, done);
    }

    // The series of panels ``ps`` into ``into``; ``extra``: more of the query (a zoom's range). One request per
    // run on a run's page; a compare page asks for RUNS_TOGETHER runs at once (100 runs: 10 requests, not 100).
    var RUNS_TOGETHER = 10;

    function fetchAll(ps, extra, into) {
      var fetches = [], n = bucketsFor(ps.length && ps[0].area), batch = [];
      var query = "&n=" + n + "&enc=f64" + extra;
      var keep = function (got) {
        Object.keys(got.series || {}).forEach(function (m) { into[seriesKey(got.run, m)] = unpack(got.series[m]); });
      };
      // A request that fails (a run deleted meanwhile, the server gone) is said in the panels of the runs it
      // asked for; the other requests' runs still draw.
      var failed = function (b, why) {
        b[1].forEach(function (m) {
          into[seriesKey(b[0].tail, m)] = {run: b[0].tail, name: m, error: why, n: 0, step: [], time: [], value: []};
        });
      };
      var ask = function (url, take, runs) {
        fetches.push(fetch(url, {credentials: "same-origin", cache: "no-store"}).then(function (r) {
          return r.json().then(function (got) {
            if (!r.ok) { throw new Error(got.error || ("the server answered " + r.status)); }
            take(got, runs);
          });
        }).catch(function (err) {
          runs.forEach(function (b) { failed(b, String(err.message || err)); });
        }));
      };
      var together = function () {
        if (!batch.length) { return; }
        var names = Object.create(null);  // no prototype: a metric may be named __proto__
        batch.forEach(function (b) { b[1].forEach(function (m) { names[m] = true; }); });
        ask("/api/runs/metrics?" + batch.map(function (b) { return "run=" + encodeURIComponent(b[0].tail); }).join("&") +
            "&" + Object.keys(names).map(function (m) { return "name=" + encodeURIComponent(m); }).join("&") + query,
            function (got, runs) {
              (got.runs || []).forEach(function (one, i) {
                if (one.error && runs[i] && runs[i][0].tail === one.run) { failed(runs[i], one.error); } else { keep(one); }
              });
            }, batch);
        batch = [];
      };
      spec.runs.forEach(function (run) {
        var names = ps.filter(function (p) { return p.metric.indexOf("info:") !== 0 && hasMetric(run, p.metric); })
          .map(function (p) { return p.metric; });
        if (spec.runs.length > 1 && names.length && names.length <= 100) {
          batch.push([run, names]);
          if (batch.length >= RUNS_TOGETHER) { together(); }
          return;
        }
        for (var at = 0; at < names.length; at += 100) {
          var q = names.slice(at, at + 100).map(function (m) { return "name=" + encodeURIComponent(m); }).join("&");
          ask(spec.api + encodeURIComponent(run.tail) + "/metrics?" + q + query, keep, [[run, names.slice(at, at + 100)]]);
        }
      });
      together();
      return fetches;
    }

    // -- zoomed in (x by step), the panels in view fetch the steps in view again: one bucket a pixel of the view,
    // every point where they fit (an overview's bucket holds many). Zoomed out, they draw the overview again.
    var detail = null, detailGen = 0, asked = "";

    function refine() {
      var want = zoom && state.x === "step" && spec.api ? Math.floor(zoom[0]) + ".." + Math.ceil(zoom[1]) : "";
      if (want === asked) { return; }  // a panel drawn again says its zoom again: those points are here or coming
      asked = want;
      var gen = ++detailGen, was = detail;
      detail = null;
      var logged = order.map(function (m) { return panels[m]; }).filter(function (p) { return p.metric.indexOf("info:") !== 0; });
      if (was) { logged.forEach(function (p) { if (p.detailed) { p.detailed = false; if (p.drawn && !p.loading) { draw(p); } } }); }
      if (!want) { return; }
      var shown = logged.filter(function (p) { return p.drawn && p.visible && bucketed(p.metric); });
      var lo = Math.floor(zoom[0]), hi = Math.ceil(zoom[1]), into = Object.create(null);
      if (!shown.length) { return; }
      Promise.all(fetchAll(shown, "&from=" + stepText(lo) + "&to=" + stepText(hi), into)).then(function () {
        if (gen !== detailGen) { return; }  // zoomed again meanwhile: that zoom's points are on their way
        detail = into;
        shown.forEach(function (p) { p.detailed = true; draw(p); });
      }, function () {});  // the overview stays drawn: its buckets hold the same points
    }

    // A step as the server takes it: an int64 (a chart's float at int64's ends, 2^63, is past them).
    function stepText(v) {
      if (v >= 9223372036854775807) { return "9223372036854775807"; }
      if (v <= -9223372036854775808) { return "-9223372036854775808"; }
      return String(v);
    }

    // Some run's series of metric m came in buckets (its every point is not here yet).
    function bucketed(m) {
      return spec.runs.some(function (run) {
        var s = cache[seriesKey(run.tail, m)];
        return s && s.value && s.n > s.value.length;
      });
    }

    function seriesOf(m) {
      var out = Object.create(null);
      spec.runs.forEach(function (run) {
        var inline = own(own(spec.series, m), run.tail);
        var k = seriesKey(run.tail, m), kept = detail && detail[k] && !detail[k].error ? detail[k] : cache[k];
        if (inline) { out[run.tail] = inline; } else if (kept) { out[run.tail] = kept; }
      });
      return out;
    }

    function fullRange(u) {
      var xs = u.data[0];
      return xs && xs.length ? [xs[0], xs[xs.length - 1]] : null;
    }

    function applyZoom(u) {
      var r = zoom || fullRange(u);
      if (!r || r[0] === r[1]) { return; }
      applying = true;
      try { u.setScale("x", {min: r[0], max: r[1]}); } finally { applying = false; }
    }

    // One panel's zoom (a drag, a double click) becomes every panel's.
    function zoomed(u, key) {
      if (key !== "x" || applying || !u.casmonReady) { return; }
      var full = fullRange(u), mn = u.scales.x.min, mx = u.scales.x.max;
      var eps = full ? Math.abs(full[1] - full[0]) * 1e-9 : 0;
      zoom = full && mn <= full[0] + eps && mx >= full[1] - eps ? null : [mn, mx];
      reset.disabled = !zoom;
      order.forEach(function (m) {
        var o = panels[m].area.uplot;
        if (o && o !== u) { applyZoom(o); }
      });
      refine();
    }

    function draw(p) {
      var m = p.metric, info = m.indexOf("info:") === 0;
      var st = {x: info ? "index" : state.x, log: p.log, smooth: state.smooth, group: state.group};
      var got = seriesOf(m), lines = linesOf(spec, got, st);
      var errors = Object.keys(got).filter(function (t) { return got[t].error; }).map(function (t) { return got[t].error; })
        .filter(function (e, i, all) { return all.indexOf(e) === i; });  // a failed request: one line, not one a run
      var u = plotCurves(p.area, lines, st, info ? m.slice(5) : m, {
        title: false, height: 200,
        cursor: {sync: {key: SYNC, setSeries: false}},
        hooks: {setScale: [zoomed]}
      });
      p.drawn = true;
      if (errors.length) { p.area.appendChild(el("p", {"class": "casmon-error"}, errors.join("; "))); }
      if (!u) { return; }
      u.casmonReady = true;
      if (zoom) { applyZoom(u); }
    }

    function redrawAll() {
      var x = state.x;
      readControls(controls, state);
      if (state.x !== x) { zoom = null; reset.disabled = true; refine(); }  // a range of steps means nothing in seconds
      order.forEach(function (m) { var p = panels[m]; if (p.drawn && !p.loading) { draw(p); } });
    }

    controls.addEventListener("change", redrawAll);
    controls.addEventListener("input", function (e) { if (e.target.type === "range") { redrawAll(); } });
    reset.addEventListener("click", function () {
      zoom = null;
      reset.disabled = true;
      order.forEach(function (m) { var u = panels[m].area.uplot; if (u) { applyZoom(u); } });
      refine();
    });

    // -- what is seen: a panel draws when it comes near the window; a stale one (new points) fetches again --
    var firstSeen = null, resolveFirst;
    var ready = new Promise(function (res) { resolveFirst = res; });
    var observer = typeof IntersectionObserver === "undefined" ? null : new IntersectionObserver(function (entries) {
      entries.forEach(function (en) {
        var p = panels[en.target.getAttribute("data-metric")];
        if (!p) { return; }
        p.visible = en.isIntersecting;
        if (p.visible && (p.stale || !p.drawn)) { p.stale = true; want(p); }
      });
      if (!firstSeen) { firstSeen = (flushing || Promise.resolve()).then(function () { resolveFirst(); }); }
    }, {rootMargin: "300px 0px"});

    var names = [];
    (spec.groups || [{group: "", metrics: spec.metrics}]).forEach(function (g) {
      g.metrics.forEach(function (m) { names.push([m, g.metrics.length]); });
    });
    names.forEach(function (x) { addPanel(x[0], x[1]); });
    if (!observer || !names.length) { resolveFirst(); }
    if (!observer && flushing) { flushing.then(resolveFirst); }

    // Live runs: casmon-ui.js polls and says what it saw; a panel with new points fetches them again (now if it
    // is seen, else when it comes into view), a new metric gets a panel.
    var live = function (runs) {
      var changed = Object.create(null);
      runs.forEach(function (r) {
        spec.runs.forEach(function (run) {
          if (run.tail !== r.tail) { return; }
          var summary = r.metrics || {};
          Object.keys(summary).forEach(function (m) {
            var kept = cache[seriesKey(run.tail, m)];
            if (!kept || kept.n !== summary[m].n) { changed[m] = true; }
          });
          run.summary = summary;
          run.status = r.status || run.status;
        });
      });
      Object.keys(changed).forEach(function (m) {
        var p = panels[m];
        if (!p) { p = addPanel(m, 1); countGroup(groupOf(m)); return; }
        p.stale = true;
        if (p.visible) { want(p); }
      });
    };
    document.addEventListener("casmon:run", function (ev) { live([ev.detail]); });
    document.addEventListener("casmon:runs", function (ev) { live(ev.detail.runs); });
    if (spec.mode === "compare" && spec.params.length) { scatterPanel(panel, spec); }
    return ready;
  }

  // -- the compare page's scatter: a parameter against a metric's last, min or max, a point per run --
  function scatterPanel(panel, spec) {
    var ys = spec.metrics.filter(function (m) { return m.indexOf("info:") !== 0; }).map(function (m) { return [m, m]; })
      .concat((spec.scalars || []).map(function (m) { return [m, "info " + m.slice(5)]; }));
    if (!ys.length) { return; }
    var main = ys.filter(function (y) { return y[0] === spec.default; });
    var state = {sx: spec.params[0], sy: main.length ? main[0][0] : ys[0][0], stat: "last", logx: false, log: false};
    var box = el("details", {"class": "dash-group scatter-box", "data-group": "scatter", open: "open"});
    box.appendChild(el("summary", {}, "parameter against a metric"));
    var controls = el("div", {"class": "chart-controls scatter-controls"});
    controls.appendChild(select("x", "sx", spec.params.map(function (p) { return [p, p]; }), state.sx));
    controls.appendChild(select("y", "sy", ys, state.sy));
    controls.appendChild(select("value", "stat", [["last", "last"], ["min", "min"], ["max", "max"]], "last"));
    controls.appendChild(checkbox("log x", "logx", false));
    controls.appendChild(checkbox("log y", "log", false));
    var area = el("div", {"class": "chart-area scatter-area"});
    box.appendChild(controls);
    box.appendChild(area);
    panel.appendChild(box);
    var drawIt = function () { readControls(controls, state); plotScatter(area, spec, state); };
    controls.addEventListener("change", drawIt);
    document.addEventListener("casmon:runs", function (ev) {
      ev.detail.runs.forEach(function (r) {
        spec.runs.forEach(function (run) { if (run.tail === r.tail) { run.summary = r.metrics; } });
      });
      drawIt();
    });
    drawIt();
  }

  function start() {
    var block = document.getElementById("casmon-chart-data");
    var panel = document.getElementById("charts");
    if (!block || !panel || typeof uPlot === "undefined") { return; }
    var spec = JSON.parse(block.textContent);
    var done = dashboard(panel, spec);
    done.then(function () { panel.setAttribute("data-ready", "1"); });
    var width = window.innerWidth;
    window.addEventListener("resize", function () {
      if (Math.abs(window.innerWidth - width) < 20) { return; }
      width = window.innerWidth;
      panel.querySelectorAll(".chart-area").forEach(function (a) {
        if (a.uplot) { a.uplot.setSize({width: Math.max(240, Math.floor(a.clientWidth)), height: a.uplot.height}); }
      });
    });
  }

  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", start); } else { start(); }
}());
