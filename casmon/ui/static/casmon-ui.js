// casmon ui: the pages' conveniences. Every page works without them (plain links and GET forms); with
// them, the runs table and a run's page follow running runs without a reload (polling the server's JSON
// endpoints every 2 s while a run on the page is running), columns can be hidden, and the compare page
// can show only what differs. Text from the server is set with textContent, never as markup.
"use strict";
(function () {
  var POLL_MS = 2000; // while a run on the page is running
  var IDLE_POLL_MS = 15000; // the runs table otherwise: to notice new runs
  var LIVE = {running: true, claimed: true};

  function $(sel, root) { return (root || document).querySelector(sel); }
  function $$(sel, root) { return Array.prototype.slice.call((root || document).querySelectorAll(sel)); }

  function stored(key, fallback) {
    try { var v = window.localStorage.getItem(key); return v === null ? fallback : JSON.parse(v); } catch (e) { return fallback; }
  }
  function store(key, value) {
    try { window.localStorage.setItem(key, JSON.stringify(value)); } catch (e) { /* private mode: not kept */ }
  }

  var KNOWN_STATUS = {ok: 1, failed: 1, running: 1, killed: 1, lost: 1, claimed: 1, unreadable: 1};
  function setStatus(cell, status) {
    if (!cell) { return; }
    var badge = $(".casmon-status", cell) || cell.appendChild(document.createElement("span"));
    badge.className = "casmon-status" + (KNOWN_STATUS[status] ? " casmon-status-" + status : "");
    badge.textContent = status;
  }

  function getJSON(url) {
    return fetch(url, {credentials: "same-origin", cache: "no-store"}).then(function (r) {
      if (!r.ok) { throw new Error(url + ": " + r.status); }
      return r.json();
    });
  }

  // Polls ``next()`` (a promise of the delay until the next poll, or null to stop); errors retry slowly.
  function poll(next, first) {
    var again = function (ms) { if (ms !== null) { window.setTimeout(tick, ms); } };
    var tick = function () {
      next().then(again, function () { again(IDLE_POLL_MS); });
    };
    window.setTimeout(tick, first);
  }

  // -- runs: the compare button, the column chooser, live rows --
  function runsTable() {
    var form = document.getElementById("compare-form");
    if (form) {
      var button = document.getElementById("compare-button");
      var update = function () {
        var n = 0;
        $$("input[name=run]", form).forEach(function (b) {
          b.closest("tr").classList.toggle("selected", b.checked);
          if (b.checked) { n += 1; }
        });
        button.disabled = n < 1;
        button.textContent = n < 2 ? (n === 1 ? "Show the selected run" : "Compare selected runs") : "Compare " + n + " runs";
      };
      form.addEventListener("change", update);
      update();
    }
    var table = document.getElementById("runs");
    if (!table) { return; }
    columnChooser(table);
    var serial = table.getAttribute("data-serial") || "0";
    var notice = document.getElementById("new-runs");
    var fresh = 0;
    poll(function () {
      return getJSON("/api/runs?since=" + encodeURIComponent(serial)).then(function (got) {
        serial = String(got.serial);
        (got.runs || []).forEach(function (r) {
          var row = $("tr[data-run=\"" + CSS.escape(r.tail) + "\"]", table);
          if (!row) { if (r["new"]) { fresh += 1; } return; }
          row.setAttribute("data-status", r.status);
          setStatus($("td[data-col=status]", row), r.status);
          var d = $("td[data-col=duration]", row);
          if (d) { d.textContent = r.elapsed_text; }
          Object.keys(r.metrics || {}).forEach(function (m) {
            var c = $("td[data-col=\"metric." + CSS.escape(m) + "\"]", row);
            if (c) { c.textContent = r.metrics[m].last_text; }
          });
        });
        if (notice && fresh) {
          notice.hidden = false;
          $("span", notice).textContent = fresh === 1 ? "1 new run" : fresh + " new runs";
        }
        return $$("tr[data-status]", table).some(function (row) { return LIVE[row.getAttribute("data-status")]; })
          ? POLL_MS : IDLE_POLL_MS;
      });
    }, anyLive(table) ? POLL_MS : IDLE_POLL_MS);
  }

  function anyLive(root) {
    return $$("[data-status]", root).some(function (e) { return LIVE[e.getAttribute("data-status")]; });
  }

  // Columns hidden by the reader, kept in this browser (localStorage) for every casmon ui page.
  function columnChooser(table) {
    var box = document.getElementById("column-chooser");
    if (!box) { return; }
    var key = "casmon.hidden-columns";
    var hidden = stored(key, []);
    var list = $(".columns", box);
    $$("thead th[data-col]", table).forEach(function (th) {
      var col = th.getAttribute("data-col");
      if (col === "run") { return; }
      var label = document.createElement("label");
      var c = document.createElement("input");
      c.type = "checkbox";
      c.value = col;
      c.checked = hidden.indexOf(col) < 0;
      label.appendChild(c);
      label.appendChild(document.createTextNode(" " + (th.getAttribute("data-label") || col)));
      list.appendChild(label);
    });
    var apply = function () {
      $$("[data-col]", table).forEach(function (e) {
        e.classList.toggle("col-hidden", hidden.indexOf(e.getAttribute("data-col")) >= 0);
      });
      $$("thead th[data-group]", table).forEach(function (g) {
        var n = $$("thead th[data-col][data-in=\"" + g.getAttribute("data-group") + "\"]", table).filter(function (th) {
          return !th.classList.contains("col-hidden");
        }).length;
        g.colSpan = Math.max(n, 1);
        g.classList.toggle("col-hidden", n === 0);
      });
    };
    list.addEventListener("change", function (e) {
      var col = e.target.value;
      hidden = hidden.filter(function (c) { return c !== col; });
      if (!e.target.checked) { hidden.push(col); }
      store(key, hidden);
      apply();
    });
    box.hidden = false;
    apply();
  }

  // -- one run: status, elapsed time, latest metric values and the output's tail, while it runs --
  function runPage() {
    var live = document.getElementById("run-live");
    if (!live) { return; }
    var tail = live.getAttribute("data-run");
    if (!LIVE[live.getAttribute("data-status")]) { return; }
    poll(function () {
      return getJSON("/api/run/" + encodeURIComponent(tail)).then(function (r) {
        live.setAttribute("data-status", r.status);
        setStatus(document.getElementById("run-status"), r.status);
        var el = document.getElementById("run-elapsed");
        if (el) { el.textContent = r.elapsed_text; }
        var body = $("#run-metrics tbody");
        if (body) {
          Object.keys(r.metrics || {}).sort().forEach(function (m) {
            var row = $("tr[data-metric=\"" + CSS.escape(m) + "\"]", body);
            if (!row) {
              row = document.createElement("tr");
              row.setAttribute("data-metric", m);
              ["name", "last", "step", "n", "min", "max"].forEach(function (k, i) {
                var td = document.createElement(i ? "td" : "th");
                td.setAttribute("data-k", k);
                if (i) { td.className = "num"; }
                row.appendChild(td);
              });
              body.appendChild(row);
              var none = document.getElementById("no-metrics");
              if (none) { none.hidden = true; }
              $("#run-metrics").hidden = false;
            }
            var s = r.metrics[m];
            $("[data-k=name]", row).textContent = m;
            ["last", "step", "n", "min", "max"].forEach(function (k) { $("[data-k=" + k + "]", row).textContent = s[k + "_text"]; });
          });
        }
        var out = document.getElementById("output-tail");
        if (out && typeof r.output_tail === "string" && out.textContent !== r.output_tail) {
          var atEnd = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
          out.textContent = r.output_tail;
          out.hidden = !r.output_tail;
          if (atEnd) { out.scrollTop = out.scrollHeight; }
        }
        document.dispatchEvent(new CustomEvent("casmon:run", {detail: r}));
        return LIVE[r.status] ? POLL_MS : null;
      });
    }, POLL_MS);
  }

  // -- compare: only what differs; live runs redraw the chart --
  function comparePage() {
    var toggle = document.getElementById("only-differs");
    if (toggle) {
      var key = "casmon.only-differs";
      toggle.checked = stored(key, false);
      var apply = function () { document.body.classList.toggle("only-differs", toggle.checked); };
      toggle.addEventListener("change", function () { store(key, toggle.checked); apply(); });
      toggle.closest(".only-differs-switch").hidden = false;
      apply();
    }
    var cmp = document.getElementById("compare");
    if (!cmp || !anyLive(cmp) || cmp.hasAttribute("data-standalone")) { return; }
    var serial = cmp.getAttribute("data-serial") || "0";
    poll(function () {
      return getJSON("/api/runs?since=" + encodeURIComponent(serial)).then(function (got) {
        serial = String(got.serial);
        var mine = (got.runs || []).filter(function (r) { return $("[data-run=\"" + CSS.escape(r.tail) + "\"]", cmp); });
        mine.forEach(function (r) {
          var e = $("[data-run=\"" + CSS.escape(r.tail) + "\"]", cmp);
          e.setAttribute("data-status", r.status);
          setStatus(e, r.status);
        });
        if (mine.length) { document.dispatchEvent(new CustomEvent("casmon:runs", {detail: {runs: mine}})); }
        return anyLive(cmp) ? POLL_MS : null;
      });
    }, POLL_MS);
  }

  // -- legacy SVG charts (store and calls pages): nothing to do; the report's metric chooser --
  document.addEventListener("DOMContentLoaded", function () {
    runsTable();
    runPage();
    comparePage();
  });
}());
