/* casmon ui: the lineage panel (a layered graph, laid out by the server) and the "used by" lists.
   Each loads its JSON only when it comes into view; every string from the store is set as text. */
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
  var W = 200, H = 46, GAP_X = 56, GAP_Y = 14, PAD = 12, CHARS = 26, MIN_SCALE = 0.7;

  function el(name, attrs, parent) {
    var e = document.createElementNS(SVG, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }

  function html(tag, cls, text, parent) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }

  function clip(s) {
    s = String(s);
    return s.length > CHARS ? s.slice(0, CHARS - 1) + "\u2026" : s;
  }

  function load(url) {
    return fetch(url, {credentials: "same-origin", cache: "no-store"}).then(function (r) {
      return r.json().then(function (data) {
        if (!r.ok) throw new Error(data && data.error ? data.error : "HTTP " + r.status);
        return data;
      });
    });
  }

  function fail(box, err) {
    box.textContent = "";
    html("p", "casmon-error lineage-error", "lineage cannot be shown: " + err.message, box);
  }

  function draw(box, g) {
    box.textContent = "";
    if (!g.nodes.length) {
      html("p", "muted lineage-empty", "nothing recorded upstream", box);
      return;
    }
    var width = PAD * 2 + g.columns * W + (g.columns - 1) * GAP_X;
    var height = PAD * 2 + g.rows * H + (g.rows - 1) * GAP_Y;
    var wrap = html("div", "lineage-scroll", null, box);
    // shrunk to the panel's width, down to MIN_SCALE; a wider graph scrolls sideways
    var scale = Math.max(MIN_SCALE, Math.min(1, (wrap.clientWidth || width) / width));
    var svg = el("svg", {"class": "lineage-graph", width: Math.floor(width * scale), height: Math.floor(height * scale),
                         viewBox: "0 0 " + width + " " + height, role: "img"}, wrap);
    el("title", {}, svg).textContent = "lineage graph";
    var defs = el("defs", {}, svg);
    var marker = el("marker", {id: "lineage-arrow", viewBox: "0 0 10 10", refX: 9, refY: 5,
                               markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse"}, defs);
    el("path", {d: "M 0 0 L 10 5 L 0 10 z", "class": "lineage-arrowhead"}, marker);
    var colRows = {}, at = {};
    g.nodes.forEach(function (n) { colRows[n.col] = Math.max(colRows[n.col] || 0, n.row + 1); });
    g.nodes.forEach(function (n) {
      var colHeight = colRows[n.col] * H + (colRows[n.col] - 1) * GAP_Y;
      var top = PAD + (height - 2 * PAD - colHeight) / 2;  // each column centred
      at[n.id] = {x: PAD + n.col * (W + GAP_X), y: top + n.row * (H + GAP_Y)};
    });
    var edges = el("g", {"class": "lineage-edges"}, svg);
    g.edges.forEach(function (e) {
      var a = at[e.from], b = at[e.to];
      if (!a || !b) return;
      var x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x, y2 = b.y + H / 2, mx = (x1 + x2) / 2;
      var p = el("path", {d: "M" + x1 + "," + y1 + " C" + mx + "," + y1 + " " + mx + "," + y2 + " " + x2 + "," + y2,
                          "class": "lineage-edge lineage-edge-" + e.kind, "marker-end": "url(#lineage-arrow)",
                          "data-from": e.from, "data-to": e.to}, edges);
      el("title", {}, p).textContent = e.kind + (e.label ? " " + e.label : "");
    });
    var nodes = el("g", {"class": "lineage-nodes"}, svg);
    g.nodes.forEach(function (n) {
      var p = at[n.id];
      var parent = n.link ? el("a", {href: n.link, "class": "lineage-link"}, nodes) : nodes;
      var grp = el("g", {"class": "lineage-node lineage-" + n.kind + (n.missing ? " lineage-missing" : "") +
                         (n.root ? " lineage-root" : "") + (n.status && n.status !== "live" ? " lineage-" + n.status : ""),
                         transform: "translate(" + p.x + "," + p.y + ")", "data-id": n.id, "data-kind": n.kind},
                   parent);
      el("title", {}, grp).textContent = n.label + "\n" + n.sub;
      el("rect", {width: W, height: H, rx: 7, ry: 7, "class": "lineage-box"}, grp);
      el("rect", {width: 5, height: H, rx: 2, "class": "lineage-stripe"}, grp);
      var t = el("text", {x: 14, y: 19, "class": "lineage-label"}, grp);
      t.textContent = clip(n.label);
      var s = el("text", {x: 14, y: 36, "class": "lineage-sub"}, grp);
      s.textContent = clip(n.sub);
    });
    // Columns are centred, so in a graph taller than its box the root and the short columns (the sources) sit
    // mid-height: open the box scrolled to the root, not to the top of the tallest column.
    var root = g.nodes.filter(function (n) { return n.root; })[0];
    if (root && wrap.scrollHeight > wrap.clientHeight) {
      wrap.scrollTop = Math.max(0, (at[root.id].y + H / 2) * scale - wrap.clientHeight / 2);
    }
    var legend = html("p", "muted lineage-legend", null, box);
    [["entry", "cached call"], ["file", "file"], ["param", "parameter"], ["run", "run"]].forEach(function (k) {
      var item = html("span", "lineage-key lineage-key-" + k[0], null, legend);
      html("span", "lineage-swatch", null, item);
      item.appendChild(document.createTextNode(k[1]));
    });
    html("span", "lineage-key lineage-key-missing", "dashed: missing (cleared or collected)", legend);
    if (g.more > 0) {
      html("p", "muted lineage-more", g.more + " more " + (g.more === 1 ? "node" : "nodes") +
           " not drawn (the " + g.nodes.length + " nearest are); casmon lineage --json lists them all", box);
    }
  }

  function withPage(src, page) {
    return src + (src.indexOf("?") >= 0 ? "&" : "?") + "page=" + page;
  }

  function usedBy(box, src) {
    var list = null, pageNo = 1, button = null, count = null;
    function more() {
      if (button) button.disabled = true;
      load(withPage(src, pageNo)).then(function (d) {
        if (!list) {
          box.textContent = "";
          count = html("p", "muted used-by-count", null, box);
          list = html("ul", "used-by-list", null, box);
        }
        count.textContent = d.total ? d.total + (d.total === 1 ? " item" : " items") + " downstream"
                                    : "nothing recorded downstream";
        d.items.forEach(function (it) {
          var li = html("li", "used-by-item used-by-" + it.kind, null, list);
          html("span", "used-by-kind", it.kind === "entry" ? "cached call" : it.kind, li);
          if (it.link) {
            var a = html("a", null, it.label, li);
            a.href = it.link;
          } else {
            html("span", null, it.label, li);
          }
          html("span", "muted used-by-sub", it.sub, li);
        });
        if (button) button.remove();
        button = null;
        if (d.next) {
          pageNo = d.next;
          button = html("button", "used-by-more", "show more", box);
          button.type = "button";
          button.addEventListener("click", more);
        }
      }).catch(function (err) { fail(box, err); });
    }
    more();
  }

  function start(box) {
    var src = box.getAttribute("data-src");
    box.removeAttribute("data-src");
    box.setAttribute("data-loading", "1");
    if (box.classList.contains("used-by")) {
      usedBy(box, src);
      box.removeAttribute("data-loading");
      return;
    }
    load(src).then(function (g) { draw(box, g); }).catch(function (err) { fail(box, err); })
      .then(function () { box.removeAttribute("data-loading"); box.setAttribute("data-loaded", "1"); });
  }

  function init() {
    var boxes = document.querySelectorAll(".lineage-panel[data-src], .used-by[data-src]");
    if (!boxes.length) return;
    if (!("IntersectionObserver" in window)) {
      boxes.forEach(start);
      return;
    }
    var seen = new IntersectionObserver(function (entries) {
      entries.forEach(function (en) {
        if (en.isIntersecting) {
          seen.unobserve(en.target);
          start(en.target);
        }
      });
    }, {rootMargin: "200px"});
    boxes.forEach(function (b) { seen.observe(b); });
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
