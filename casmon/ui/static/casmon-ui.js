// casmon ui: small conveniences; every page works without them (plain links and GET forms).
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  // Runs: the compare button counts the selected runs; a selected row is highlighted.
  var form = document.getElementById("compare-form");
  if (form) {
    var button = document.getElementById("compare-button");
    var update = function () {
      var boxes = form.querySelectorAll("input[name=run]");
      var n = 0;
      boxes.forEach(function (b) {
        b.closest("tr").classList.toggle("selected", b.checked);
        if (b.checked) { n += 1; }
      });
      button.disabled = n < 2;
      button.textContent = n < 2 ? "Compare selected runs" : "Compare " + n + " runs";
    };
    form.addEventListener("change", update);
    update();
  }
  // Compare: the metric chooser shows one chart (without script every chart shows, and the form reloads).
  var select = document.getElementById("metric-select");
  if (select) {
    var show = function () {
      document.querySelectorAll("figure.metric-chart").forEach(function (f) {
        f.hidden = f.getAttribute("data-metric") !== select.value;
      });
    };
    select.addEventListener("change", show);
    show();
  }
  // Curves: a click on a legend entry hides or shows that run's line.
  document.querySelectorAll("svg.chart .legend").forEach(function (g) {
    g.addEventListener("click", function () {
      var svg = g.closest("svg");
      var i = g.getAttribute("data-series");
      var line = svg.querySelector('polyline[data-series="' + i + '"]');
      if (line) { line.classList.toggle("off"); g.classList.toggle("off"); }
    });
  });
});
