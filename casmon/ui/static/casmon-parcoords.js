// casmon ui: parallel coordinates on the runs page. One SVG line per run of the table's page, across an axis
// per parameter (numbers on a linear scale, anything else as categories) and a last axis for a chosen metric
// (its last, min or max value). Dragging along an axis keeps only the lines that cross it there (a brush; a
// click clears it); a line is a link to its run. What to draw is the page's JSON block #casmon-parcoords-data
// (read as data, never run). No inline style: SVG attributes and casmon-ui.css.
"use strict";
(function () {
  var NS = "http://www.w3.org/2000/svg";
  var MAX_SHOWN = 12;  // parameter axes drawn at first; the chooser adds or removes them
  var HEIGHT = 360, TOP = 46, BOTTOM = 34, SIDE = 60, RIGHT = 120;  // the metric's ticks and name need room on the right
  // Low to high metric values: viridis's stops (dark blue to yellow-green), darkened to read on white.
  var RAMP = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [190, 200, 30]];

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) { e.textContent = text; }
    return e;
  }

  function svg(tag, attrs, text) {
    var e = document.createElementNS(NS, tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) { e.textContent = text; }
    return e;
  }

  function ramp(f) {
    f = Math.max(0, Math.min(1, f)) * (RAMP.length - 1);
    var i = Math.min(Math.floor(f), RAMP.length - 2), t = f - i, a = RAMP[i], b = RAMP[i + 1];
    return "rgb(" + [0, 1, 2].map(function (k) { return Math.round(a[k] + (b[k] - a[k]) * t); }).join(",") + ")";
  }

  function fmt(v) {
    if (typeof v !== "number" || !isFinite(v)) { return String(v); }
    if (v === 0) { return "0"; }
    var a = Math.abs(v);
    if (a >= 1e5 || a < 1e-3) { return v.toPrecision(3).replace(/\.?0+e/, "e"); }
    return String(Number(v.toPrecision(4)));
  }

  function cut(s, n) { s = String(s); return s.length > n ? s.slice(0, Math.max(1, n - 1)) + "\u2026" : s; }

  // A key's own value: a parameter named "constructor" is not Object's.
  function own(o, k) { return o && Object.prototype.hasOwnProperty.call(o, k) ? o[k] : undefined; }

  function isNum(v) { return typeof v === "number" && isFinite(v); }

  // An axis over the runs' values: numbers (linear) when every present value is a number, else categories.
  function axisOf(name, label, values) {
    var present = values.filter(function (v) { return v !== undefined && v !== null && v !== "NaN"; });
    var numeric = present.length > 0 && present.every(isNum);
    var ax = {name: name, label: label, numeric: numeric};
    if (numeric) {
      var lo = Math.min.apply(null, present), hi = Math.max.apply(null, present);
      if (lo === hi) { var pad = Math.abs(lo) * 0.1 || 1; lo -= pad; hi += pad; }
      ax.lo = lo; ax.hi = hi;
      ax.pos = function (v) { return isNum(v) ? 1 - (v - lo) / (hi - lo) : null; };
    } else {
      var cats = [];
      present.forEach(function (v) { var k = String(v); if (cats.indexOf(k) < 0) { cats.push(k); } });
      var nums = cats.every(function (c) { return c !== "" && isFinite(Number(c)); });
      cats.sort(function (a, b) { return nums ? Number(a) - Number(b) : (a < b ? -1 : a > b ? 1 : 0); });
      ax.cats = cats;
      ax.pos = function (v) {
        if (v === undefined || v === null) { return null; }
        var i = cats.indexOf(String(v));
        return i < 0 ? null : (cats.length === 1 ? 0.5 : 1 - i / (cats.length - 1));
      };
    }
    return ax;
  }

  function metricValue(run, metric, stat) {
    var s = own(run.metrics, metric);
    var v = s ? own(s, stat) : undefined;
    return isNum(v) ? v : undefined;
  }

  function parcoords(box, data) {
    var state = {metric: data["default"], stat: "last", brushes: Object.create(null)};
    var shown = (data.varying.length ? data.varying : data.params).slice(0, MAX_SHOWN);
    var controls = el("div", {"class": "chart-controls pc-controls"});
    var metricSel = el("select", {"data-pc": "metric", "aria-label": "metric"});
    data.metrics.forEach(function (m) {
      var o = el("option", {value: m}, m);
      if (m === state.metric) { o.selected = true; }
      metricSel.appendChild(o);
    });
    var statSel = el("select", {"data-pc": "stat", "aria-label": "which value"});
    [["last", "latest"], ["min", "min"], ["max", "max"]].forEach(function (s) { statSel.appendChild(el("option", {value: s[0]}, s[1])); });
    var l1 = el("label", {"class": "control"}, "metric ");
    l1.appendChild(metricSel);
    var l2 = el("label", {"class": "control"}, "value ");
    l2.appendChild(statSel);
    controls.appendChild(l1);
    controls.appendChild(l2);
    var chooser = el("details", {"class": "pc-axes"});
    chooser.appendChild(el("summary", {}, "axes (" + data.params.length + " parameters)"));
    var list = el("div", {"class": "columns"});
    data.params.forEach(function (p) {
      var lab = el("label", {"class": "control"});
      var c = el("input", {type: "checkbox", value: p, "data-pc-axis": p});
      c.checked = shown.indexOf(p) >= 0;
      lab.appendChild(c);
      lab.appendChild(document.createTextNode(" " + p));
      list.appendChild(lab);
    });
    chooser.appendChild(list);
    controls.appendChild(chooser);
    var count = el("span", {"class": "muted pc-count"});
    controls.appendChild(count);
    var clear = el("button", {type: "button", "class": "pc-clear", hidden: "hidden"}, "clear filters");
    controls.appendChild(clear);
    box.textContent = "";
    box.appendChild(controls);
    var holder = el("div", {"class": "pc-holder"});
    box.appendChild(holder);
    var lines = [], axes = [];

    function filter() {
      var n = 0, any = false;
      Object.keys(state.brushes).forEach(function () { any = true; });
      lines.forEach(function (l) {
        var ok = axes.every(function (ax, i) {
          var b = state.brushes[ax.name];
          if (!b) { return true; }
          var p = l.pos[i];
          return p !== null && p >= b[0] - 1e-9 && p <= b[1] + 1e-9;
        });
        l.path.classList.toggle("pc-out", !ok);
        l.link.setAttribute("data-shown", ok ? "1" : "0");
        if (ok) { n += 1; }
      });
      count.textContent = n + " of " + lines.length + " runs";
      clear.hidden = !any;
    }

    function draw() {
      holder.textContent = "";
      var runs = data.runs;
      axes = shown.map(function (p) { return axisOf(p, p, runs.map(function (r) { return own(r.params, p); })); });
      var mAxis = axisOf("metric:" + state.metric, state.metric + " (" + statSel.options[statSel.selectedIndex].text + ")",
        runs.map(function (r) { return metricValue(r, state.metric, state.stat); }));
      axes.push(mAxis);
      Object.keys(state.brushes).forEach(function (k) {
        if (!axes.some(function (a) { return a.name === k; })) { delete state.brushes[k]; }
      });
      var width = Math.max(600, Math.floor(box.clientWidth || 900));
      var h = HEIGHT - TOP - BOTTOM, step = axes.length > 1 ? (width - SIDE - RIGHT) / (axes.length - 1) : 0;
      var xs = axes.map(function (_a, i) { return axes.length > 1 ? SIDE + i * step : width / 2; });
      var root = svg("svg", {width: width, height: HEIGHT, viewBox: "0 0 " + width + " " + HEIGHT, role: "img",
        "aria-label": "parallel coordinates of " + runs.length + " runs"});
      var linesG = svg("g", {"class": "pc-lines"});
      root.appendChild(linesG);
      lines = runs.map(function (r) {
        var pos = axes.map(function (ax, i) {
          return i === axes.length - 1 ? ax.pos(metricValue(r, state.metric, state.stat)) : ax.pos(own(r.params, ax.name));
        });
        var d = "", pen = false;
        pos.forEach(function (p, i) {
          if (p === null) { return; }  // no value on this axis: the line goes on to the next it has
          d += (pen ? "L" : "M") + xs[i].toFixed(1) + "," + (TOP + p * h).toFixed(1);
          pen = true;
        });
        var mv = metricValue(r, state.metric, state.stat);
        var colour = mv === undefined || !mAxis.numeric ? "#8c959f" : ramp(1 - mAxis.pos(mv));
        var a = svg("a", {href: r.href, "data-run": r.tail, "class": "pc-run"});
        var path = svg("path", {d: d || "M0,0", "class": "pc-line", stroke: colour});
        path.appendChild(svg("title", {}, r.name + " \u00b7 " + state.metric + " " + state.stat + " = " +
          (mv === undefined ? "\u2013" : fmt(mv))));
        a.appendChild(path);
        linesG.appendChild(a);
        return {run: r, pos: pos, path: path, link: a};
      });
      var room = axes.length > 1 ? step : width;
      axes.forEach(function (ax, i) {
        var g = svg("g", {"class": "pc-axis", "data-axis": ax.name});
        var x = xs[i];
        g.appendChild(svg("line", {x1: x, y1: TOP, x2: x, y2: TOP + h}));
        var last = i === axes.length - 1;
        var anchor = i === 0 && axes.length > 1 ? "start" : "middle";
        var chars = Math.max(4, Math.floor((last ? Math.min(room, RIGHT) * 2 : anchor === "middle" ? room : room / 2 + SIDE) / 7));
        var name = svg("text", {x: x, y: TOP - 22, "text-anchor": anchor, "class": "pc-name"}, cut(ax.label, chars));
        name.appendChild(svg("title", {}, ax.label));
        g.appendChild(name);
        var ticks = ax.numeric ? [[ax.hi, 0], [(ax.lo + ax.hi) / 2, 0.5], [ax.lo, 1]].map(function (t) { return [fmt(t[0]), t[1]]; })
          : ax.cats.map(function (c) { return [c, ax.pos(c)]; });
        var every = Math.max(1, Math.ceil(ticks.length / Math.max(2, Math.floor(h / 14))));
        ticks.forEach(function (t, k) {
          if (k % every) { return; }
          var y = TOP + t[1] * h;
          g.appendChild(svg("line", {x1: x - 3, y1: y, x2: x + 3, y2: y}));
          g.appendChild(svg("text", {x: x + 6, y: y + 4, "text-anchor": "start"}, cut(t[0], last ? 14 : Math.max(3, Math.floor(room / 7) - 1))));
        });
        var brush = svg("rect", {"class": "pc-brush", x: x - 8, width: 16, y: TOP, height: 0, visibility: "hidden"});
        var b = state.brushes[ax.name];
        if (b) { brush.setAttribute("y", TOP + b[0] * h); brush.setAttribute("height", (b[1] - b[0]) * h); brush.setAttribute("visibility", "visible"); }
        g.appendChild(brush);
        var hit = svg("rect", {"class": "pc-hit", x: x - 12, width: 24, y: TOP - 6, height: h + 12, "data-brush": ax.name});
        hit.appendChild(svg("title", {}, "drag along " + ax.label + " to keep only the runs there; click to clear"));
        g.appendChild(hit);
        brushing(hit, brush, ax, h);
        root.appendChild(g);
      });
      holder.appendChild(root);
      filter();
    }

    // A drag along an axis sets its brush (in the axis's 0..1, top to bottom); a click without a drag clears it.
    function brushing(hit, brush, ax, h) {
      var start = null;
      var frac = function (ev) {
        var r = hit.ownerSVGElement.getBoundingClientRect(), scale = r.height / HEIGHT;
        return Math.max(0, Math.min(1, ((ev.clientY - r.top) / scale - TOP) / h));
      };
      hit.addEventListener("pointerdown", function (ev) {
        ev.preventDefault();
        start = frac(ev);
        hit.setPointerCapture(ev.pointerId);
      });
      hit.addEventListener("pointermove", function (ev) {
        if (start === null) { return; }
        var f = frac(ev), a = Math.min(start, f), z = Math.max(start, f);
        brush.setAttribute("y", TOP + a * h);
        brush.setAttribute("height", (z - a) * h);
        brush.setAttribute("visibility", "visible");
      });
      hit.addEventListener("pointerup", function (ev) {
        if (start === null) { return; }
        var f = frac(ev), a = Math.min(start, f), z = Math.max(start, f);
        start = null;
        if (z - a < 0.01) {
          delete state.brushes[ax.name];
          brush.setAttribute("visibility", "hidden");
        } else {
          state.brushes[ax.name] = [a, z];
        }
        filter();
      });
    }

    metricSel.addEventListener("change", function () { state.metric = metricSel.value; draw(); });
    statSel.addEventListener("change", function () { state.stat = statSel.value; draw(); });
    list.addEventListener("change", function () {
      var on = Object.create(null);
      list.querySelectorAll("input[data-pc-axis]").forEach(function (c) { if (c.checked) { on[c.value] = true; } });
      shown = data.params.filter(function (p) { return on[p]; });
      draw();
    });
    clear.addEventListener("click", function () { state.brushes = Object.create(null); draw(); });
    var width = window.innerWidth;
    window.addEventListener("resize", function () {
      if (!box.isConnected || Math.abs(window.innerWidth - width) < 20) { return; }  // swapped out: not drawn
      width = window.innerWidth;
      draw();
    });
    draw();
    box.setAttribute("data-ready", "1");
  }

  function start() {
    var block = document.getElementById("casmon-parcoords-data");
    var box = document.getElementById("parcoords");
    if (!block || !box) { return; }
    parcoords(box, JSON.parse(block.textContent));
  }

  // Drawn after the table is on screen (the chart is below it): the first frame paints the rows, not the
  // lines. A sort, a filter or a page swapped in (casmon-ui.js) brings a new block: drawn again.
  function later() {
    var go = function () { window.setTimeout(start, 0); };
    if (window.requestAnimationFrame) { window.requestAnimationFrame(go); } else { go(); }
  }

  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", later); } else { later(); }
  document.addEventListener("casmon:runs-view", later);
}());
