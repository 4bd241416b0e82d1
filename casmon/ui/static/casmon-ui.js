// casmon ui: the pages' conveniences. Every page works without them (plain links and GET forms); with
// them, the runs table and a run's page follow running runs without a reload (polling the server's JSON
// endpoints every 2 s while a run on the page is running, every 5 s otherwise on the runs table, which
// puts new runs in), columns can be hidden, a sort, a filter or another page of the runs table is swapped in
// without a reload, and the compare page can show only what differs. Text from the server's JSON is set with
// textContent, never as markup, and a new row is built element by element; the one exception is the runs
// table's swap, whose markup the server made as it makes its pages (every store string escaped).
"use strict";
(function () {
  var POLL_MS = 2000; // while a run on the page is running
  var IDLE_POLL_MS = 5000; // the runs table otherwise: a new run shows within one poll
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
  // ``text``: what the badge says ("killed (SIGTERM)"); the status alone picks its colour.
  function setStatus(cell, status, text) {
    if (!cell) { return; }
    var badge = $(".casmon-status", cell) || cell.appendChild(document.createElement("span"));
    badge.className = "casmon-status" + (KNOWN_STATUS[status] ? " casmon-status-" + status : "");
    badge.textContent = text || status;
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

  // -- runs: the compare button, the column chooser, live rows, sort/filter/pages in place --
  function runsTable() {
    var form = document.getElementById("compare-form");
    var update = function () {};
    if (form) {
      var button = document.getElementById("compare-button");
      // The runs ticked, in order, kept while a sort, a filter or a page is swapped in: ticked again where they
      // show, sent as hidden fields where they do not.
      var picked = [];
      var kept = document.createElement("span");
      kept.id = "selection-kept";
      kept.hidden = true;
      kept.appendChild(document.createElement("span"));
      var clear = document.createElement("button");
      clear.type = "button";
      clear.textContent = "clear";
      kept.appendChild(clear);
      button.parentNode.appendChild(kept);
      var boxes = function () { return $$("input[type=checkbox][name=run]", form); };
      update = function () {
        var shown = Object.create(null);
        boxes().forEach(function (b) {
          shown[b.value] = true;
          b.checked = picked.indexOf(b.value) >= 0;
          b.closest("tr").classList.toggle("selected", b.checked);
        });
        $$("input[type=hidden][name=run]", form).forEach(function (h) { h.parentNode.removeChild(h); });
        var away = picked.filter(function (v) { return !shown[v]; });
        away.forEach(function (v) {
          var h = document.createElement("input");
          h.type = "hidden";
          h.name = "run";
          h.value = v;
          form.appendChild(h);
        });
        var n = picked.length;
        button.disabled = n < 1;
        button.textContent = n < 2 ? (n === 1 ? "Show the selected run" : "Compare selected runs") : "Compare " + n + " runs";
        kept.hidden = away.length === 0;
        $("span", kept).textContent = " · " + away.length + " not on this page ";
      };
      boxes().forEach(function (b) { if (b.checked) { picked.push(b.value); } });  // a browser's restored form
      form.addEventListener("change", function (ev) {
        var b = ev.target;
        if (b && b.type === "checkbox" && b.name === "run") {
          var at = picked.indexOf(b.value);
          if (b.checked && at < 0) { picked.push(b.value); }
          if (!b.checked && at >= 0) { picked.splice(at, 1); }
        }
        update();
      });
      clear.addEventListener("click", function () { picked = []; update(); });
      update();
    }
    var table = document.getElementById("runs");
    if (!table) { return; }
    var chooser = columnChooser(table);
    var serial, insert, per, fresh, newColumns, columns, known;
    // What follows the table that is on the page now (it is swapped whole by a sort, a filter or a page).
    var bind = function () {
      table = document.getElementById("runs");
      serial = table.getAttribute("data-serial") || "0";
      insert = table.getAttribute("data-insert") || "";
      per = parseInt(table.getAttribute("data-per"), 10) || 0;
      fresh = 0;
      newColumns = false;
      columns = $$("thead tr:last-child th[data-col]", table).map(function (th) {
        return {col: th.getAttribute("data-col"), group: th.getAttribute("data-in")};
      });
      known = Object.create(null);  // no prototype: a column may be named constructor
      columns.forEach(function (c) { known[c.col] = true; });
    };
    bind();
    var notice = function () { return document.getElementById("new-runs"); };
    var count = document.getElementById("runs-count");
    // The text cells of a row, as the server's table shows them (a sparkline stays: its text is the same).
    var fill = function (row, r) {
      row.setAttribute("data-status", r.status);
      setStatus($("td[data-col=status]", row), r.status, r.status_text);
      Object.keys(r.cells || {}).forEach(function (col) {
        if (col === "run" || col === "status") { return; }
        if (!known[col]) {  // a column the page has not (unless the page left columns out)
          if (r.cells[col] !== "" && table.getAttribute("data-cut") === "0") { newColumns = true; }
          return;
        }
        var td = $("td[data-col=\"" + CSS.escape(col) + "\"]", row);
        if (!td) { return; }
        var target = col === "commit" ? ($("code", td) || td) : td;
        if (target.textContent !== r.cells[col]) { target.textContent = r.cells[col]; }
      });
    };
    // A run that started since the page was made, as a row like the server's.
    var newRow = function (r) {
      var row = document.createElement("tr");
      row.setAttribute("data-run", r.tail);
      var box = document.createElement("td");
      var check = document.createElement("input");
      check.type = "checkbox";
      check.name = "run";
      check.value = r.tail;
      check.setAttribute("aria-label", "select " + r.name);
      box.appendChild(check);
      row.appendChild(box);
      columns.forEach(function (c) {
        var td = document.createElement("td");
        td.setAttribute("data-col", c.col);
        if (c.col === "run") {
          td.className = "name";
          var a = document.createElement("a");
          a.href = "/run/" + encodeURIComponent(r.tail);
          a.textContent = r.name;
          td.appendChild(a);
        } else if (c.col === "commit") {
          td.appendChild(document.createElement("code"));
        } else if (c.col === "start") {
          td.className = "when";
        } else if (c.group !== "fixed" || c.col === "duration") {
          td.className = c.group === "params" ? "num param" : "num";
        }
        row.appendChild(td);
      });
      fill(row, r);
      return row;
    };
    poll(function () {
      var since = serial, shown = table;
      return getJSON("/api/runs?since=" + encodeURIComponent(since)).then(function (got) {
        if (shown !== table) { return anyLive(table) ? POLL_MS : IDLE_POLL_MS; }  // swapped meanwhile: its own serial
        serial = String(got.serial);
        var body = $("tbody", table), added = 0;
        (got.runs || []).slice().reverse().forEach(function (r) {  // oldest change first: newest run on top
          var row = $("tr[data-run=\"" + CSS.escape(r.tail) + "\"]", table);
          if (row) { fill(row, r); return; }
          if (!r["new"]) { return; }
          var full = per && $$("tr[data-run]", body).length >= per;
          if (!insert || (insert === "bottom" && full)) { fresh += 1; return; }  // a full last page: the next one's
          row = newRow(r);
          if (insert === "top") { body.insertBefore(row, body.firstChild); } else { body.appendChild(row); }
          added += 1;
        });
        // A page keeps its size: the rows a new one pushes past it are the next page's first, as the server pages.
        var over = per ? $$("tr[data-run]", body).slice(per) : [];
        over.forEach(function (row) { body.removeChild(row); });
        if (over.length) { update(); }  // a selected row gone: the compare button counts what is left
        if (added) {
          chooser.apply();
          if (count) {
            var n = parseInt(count.getAttribute("data-n"), 10) + added;
            count.setAttribute("data-n", String(n));
            count.textContent = n === 1 ? "1 run" : n.toLocaleString("en-US") + " runs";
          }
        }
        var note = notice();
        if (note && (fresh || newColumns)) {
          var parts = [];
          if (fresh) { parts.push(fresh === 1 ? "1 new run" : fresh + " new runs"); }
          if (newColumns) { parts.push("new columns"); }
          note.hidden = false;
          $("span", note).textContent = parts.join(" and ");
        }
        return anyLive(table) ? POLL_MS : IDLE_POLL_MS;
      });
    }, anyLive(table) ? POLL_MS : IDLE_POLL_MS);
    inPlace(function (got) {
      if (count) { count.setAttribute("data-n", String(got.all)); }
      bind();
      chooser.rebuild(table);
      update();
    });
  }

  // A sort (a column's head), a page (the pager) or a filter (the filter box) fetches only the parts of the
  // page it changes (/api/runs/view: the server's own markup for them, escaped as in its pages) and swaps
  // them in; the address bar gets the view's URL (history.pushState), so back, forward, reload and a shared
  // link show the same. Without this script, or when the fetch fails, the links and the form navigate.
  function inPlace(swapped) {
    var filter = document.getElementById("runs-filter");
    if (!document.getElementById("runs-after") || !window.fetch || !window.history || !window.history.pushState
        || !window.URLSearchParams) { return; }
    var seq = 0, ctrl = null;
    var put = function (got) {
      Object.keys(got.parts || {}).forEach(function (id) {
        var el = document.getElementById(id);
        if (!el) { return; }
        if (id === "runs") { el.outerHTML = got.parts[id]; } else { el.innerHTML = got.parts[id]; }  // the table whole
      });
      if (filter) {
        ["sort", "order"].forEach(function (k) { if (filter.elements[k]) { filter.elements[k].value = got[k]; } });
        var per = filter.elements.per;
        if (got.per !== 50) {
          if (!per) {
            per = document.createElement("input");
            per.type = "hidden";
            per.name = "per";
            filter.insertBefore(per, filter.elements.q);
          }
          per.value = String(got.per);
        } else if (per) {
          per.parentNode.removeChild(per);
        }
      }
      swapped(got);
    };
    // ``col``: the column whose head was clicked; its new head gets the focus (a keyboard sorts on).
    var go = function (href, how, col) {
      var u = new URL(href, window.location.href);
      var mine = ++seq;
      if (ctrl) { ctrl.abort(); }
      ctrl = window.AbortController ? new AbortController() : null;
      var table = document.getElementById("runs");
      if (table) { table.setAttribute("aria-busy", "true"); }
      return fetch("/api/runs/view" + u.search, {credentials: "same-origin", cache: "no-store",
                                                 signal: ctrl ? ctrl.signal : undefined}).then(function (r) {
        return r.json();
      }).then(function (got) {
        if (mine !== seq) { return; }
        if (!got || !got.parts || typeof got.url !== "string") { throw new Error("no view"); }  // the page says why
        put(got);
        var q = filter && filter.elements.q;
        if (q && (how === "pop" || document.activeElement !== q)) { q.value = got.q; }
        if (how === "push" && got.url !== window.location.pathname + window.location.search) {
          window.history.pushState({casmonRuns: 1}, "", got.url);
        } else if (how !== "pop") {
          window.history.replaceState({casmonRuns: 1}, "", got.url);
        }
        var head = col ? $("#runs thead th[data-col=\"" + CSS.escape(col) + "\"] a") : null;
        if (head) { head.focus(); }
        document.dispatchEvent(new CustomEvent("casmon:runs-view", {detail: {url: got.url}}));
      }).catch(function (err) {
        if (mine !== seq || (err && err.name === "AbortError")) { return; }
        if (how === "pop") { window.location.reload(); } else { window.location.assign(u.pathname + u.search); }
      });
    };
    document.addEventListener("click", function (ev) {
      if (ev.defaultPrevented || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.altKey) { return; }
      var a = ev.target.closest ? ev.target.closest("a[href]") : null;
      if (!a || !a.closest("#runs thead, #runs-after nav.pager, #runs-notice")) { return; }
      var u = new URL(a.href, window.location.href);
      if (u.origin !== window.location.origin || u.pathname !== "/") { return; }
      ev.preventDefault();
      var th = a.closest("#runs thead th[data-col]");
      go(u.href, "push", th ? th.getAttribute("data-col") : null);
    });
    if (filter) {
      filter.addEventListener("submit", function (ev) {
        ev.preventDefault();
        go("/?" + new URLSearchParams(new FormData(filter)).toString(), "push");
      });
    }
    window.addEventListener("popstate", function () { go(window.location.href, "pop"); });
  }

  function anyLive(root) {
    return $$("[data-status]", root).some(function (e) { return LIVE[e.getAttribute("data-status")]; });
  }

  // Columns hidden by the reader, kept in this browser (localStorage) for every casmon ui page. The group
  // header row spans what is left of each group (the first group: the box column and the fixed columns).
  function columnChooser(table) {
    var box = document.getElementById("column-chooser");
    var key = "casmon.hidden-columns";
    var hidden = stored(key, []);
    var apply = function () {
      $$("[data-col]", table).forEach(function (e) {
        e.classList.toggle("col-hidden", hidden.indexOf(e.getAttribute("data-col")) >= 0);
      });
      $$("thead th[data-group]", table).forEach(function (g) {
        var heads = $$("thead tr:last-child th[data-in=\"" + g.getAttribute("data-group") + "\"]", table);
        var n = heads.filter(function (th) { return !th.classList.contains("col-hidden"); }).length;
        g.colSpan = Math.max(n, 1);
        g.classList.toggle("col-hidden", n === 0);
      });
    };
    if (!box) { return {apply: apply, rebuild: function (t) { table = t; apply(); }}; }
    var list = $(".columns", box);
    // A box per column of the table (after a swap, of the new one: its columns are the shown runs').
    var build = function () {
      var group = "fixed";
      list.textContent = "";
      $$("thead th[data-col]", table).forEach(function (th) {
        var col = th.getAttribute("data-col");
        if (col === "run") { return; }
        if (th.getAttribute("data-in") !== group) {  // each group's columns under its name (loss, and loss)
          group = th.getAttribute("data-in");
          var head = $("thead th[data-group=\"" + group + "\"]", table);
          list.appendChild(document.createElement("b")).textContent = head ? head.textContent : group;
        }
        var label = document.createElement("label");
        var c = document.createElement("input");
        c.type = "checkbox";
        c.value = col;
        c.checked = hidden.indexOf(col) < 0;
        label.appendChild(c);
        label.appendChild(document.createTextNode(" " + (th.getAttribute("data-label") || col)));
        list.appendChild(label);
      });
    };
    list.addEventListener("change", function (e) {
      var col = e.target.value;
      hidden = hidden.filter(function (c) { return c !== col; });
      if (!e.target.checked) { hidden.push(col); }
      store(key, hidden);
      apply();
    });
    build();
    box.hidden = false;
    apply();
    return {apply: apply, rebuild: function (t) { table = t; build(); apply(); }};
  }

  // -- one run: status, elapsed time, latest metric values and the output's tail, while it runs --
  function runPage() {
    var live = document.getElementById("run-live");
    if (!live) { return; }
    var tail = live.getAttribute("data-run");
    if (!LIVE[live.getAttribute("data-status")] || live.hasAttribute("data-standalone")) { return; }
    poll(function () {
      return getJSON("/api/run/" + encodeURIComponent(tail)).then(function (r) {
        live.setAttribute("data-status", r.status);
        setStatus(document.getElementById("run-status"), r.status, r.status_text);
        var tb = document.getElementById("run-traceback");
        if (tb && r.traceback && tb.textContent !== r.traceback) {  // it failed while the page was open
          tb.textContent = r.traceback;
          tb.hidden = false;
          document.getElementById("traceback").hidden = false;
        }
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
          setStatus(e, r.status, r.status_text);
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
