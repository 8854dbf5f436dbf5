// The style sheet and the script a run timeline page carries inline: nothing is fetched, no font
// is loaded (system fonts). The script only adds to a page that is complete without it: zoom
// (drag across the picture; double-click shows everything again), a click on a mark shows its
// event's fields and opens the entry below that tells more, and a link to #ID (kill-1, round-3)
// does the same on load. It reads the events from the page's JSON block and writes into the
// page with textContent only: nothing from an events file is ever parsed as HTML.
#pragma once

#include <string_view>

namespace elastic::agent::timeline {

inline constexpr std::string_view page_style = R"css(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px 20px;color:#1d2430;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:22px 0 6px}
code,pre{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,monospace}
.facts{color:#4a5568;margin:0 0 6px}
#counts{list-style:none;padding:0;margin:0 0 8px;display:flex;flex-wrap:wrap;gap:4px 16px}
#counts b{font-variant-numeric:tabular-nums}
.bad{color:#b3261e}.good{color:#2e7d32}.warn{color:#a35c00}
.toolbar{color:#4a5568;font-size:12px;margin:6px 0}
.toolbar button{font:inherit;padding:1px 8px}
.scroll{overflow-x:auto;border:1px solid #d5dbe3;border-radius:4px}
svg text{font:11px system-ui,sans-serif;fill:#1d2430}
.stripe-0{fill:#fff}.stripe-1{fill:#f4f6f9}
.row-label{font-weight:600}.row-group,.row-checkpoints{fill:#1f4e96}.row-launcher{fill:#4a5568}
.tick{stroke:#dde3ea;stroke-width:1}.tick-label{fill:#6b7686;font-size:10px}
.s{stroke-width:1}.sl{font-size:10px;pointer-events:none}
.s-life-ok{fill:#d8eed9;stroke:#2e7d32}.s-life-failed{fill:#f8d7d5;stroke:#c62828}
.s-life-killed{fill:#f3cfcf;stroke:#8e0000}.s-life-watchdog{fill:#ead9f3;stroke:#7b1fa2}
.s-life-preempted{fill:#fde9c8;stroke:#c77700}.s-life-unknown{fill:#e4e9ef;stroke:#8796a8;stroke-dasharray:3 2}
.s-launcher{fill:#e9edf2;stroke:#8796a8}
.s-rendezvous{fill:#5b8def}.s-connect{fill:#26a69a}.s-resync{fill:#9ccc65}
.s-training{fill:#c9d8f2;stroke:#7d9fd6}
.m{cursor:pointer}.m text{font-size:10px;fill:#2d3748}
.m-exit-ok{color:#2e7d32}.m-exit-failed{color:#c62828}.m-exit-killed{color:#8e0000}.m-exit-watchdog{color:#7b1fa2}
.m-exit-preempted{color:#c77700}.m-restart{color:#1565c0}.m-kill{color:#7b1fa2}.m-stack{color:#7b1fa2}
.m-watchdog{color:#9c6fb6}.m-failure{color:#d32f2f}.m-rebuild{color:#1f4e96}.m-culprit{color:#e65100}
.m-straggler{color:#ef8f00}.m-timeouts{color:#00838f}.m-checkpoint{color:#2e7d32}.m-restore{color:#1565c0}
.m-checkpoint-failed{color:#d32f2f}.m-signal{color:#c77700}.m-preempted{color:#c77700}.m-warning{color:#e0a100}
.m-other{color:#8796a8}
.m.sel use{stroke:#000;stroke-width:2px}.s.sel{stroke:#000;stroke-width:2px}
#brush{fill:rgba(91,141,239,.18);stroke:#5b8def}
#legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;color:#2d3748;margin:8px 0;padding:0;list-style:none}
#legend svg{vertical-align:middle;margin-right:3px}
.caps{font-size:12px;color:#a35c00;margin:6px 0;padding-left:18px}
#selected{border:1px solid #d5dbe3;border-radius:4px;padding:6px 10px;margin:8px 0;background:#fbfcfd}
#selected pre{margin:4px 0;white-space:pre-wrap;word-break:break-word;font-size:12px;max-height:320px;overflow:auto}
details.kill{border:1px solid #d5dbe3;border-radius:4px;margin:6px 0;padding:4px 10px}
details.kill[open]{background:#fbf8fd}
details.kill summary{cursor:pointer}
pre.stack{max-height:440px;overflow:auto;background:#1e2230;color:#e8e8e8;padding:8px 10px;border-radius:4px;font-size:12px;line-height:1.35}
table{border-collapse:collapse;font-size:13px;margin:4px 0}
th,td{border-bottom:1px solid #e3e8ee;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f6f9;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.hl,details.hl{outline:2px solid #f2b600}
.empty{font-size:16px;padding:24px;border:1px dashed #b8c2cf;border-radius:6px;background:#fafbfc}
footer{margin-top:24px;color:#6b7686;font-size:12px}
)css";

inline constexpr std::string_view page_script = R"js(
(function () {
  "use strict";
  var data = [];
  try { data = JSON.parse(document.getElementById("events-data").textContent); } catch (e) { data = []; }
  var plot = document.getElementById("plot");
  if (!plot) { document.body.setAttribute("data-ready", "yes"); return; }
  var NS = "http://www.w3.org/2000/svg";
  var W = +plot.getAttribute("width"), H = +plot.getAttribute("height"), full = +plot.getAttribute("data-span");
  var view = [0, full];
  function X(t) { return (t - view[0]) / (view[1] - view[0]) * W; }
  function T(x) { return view[0] + x / W * (view[1] - view[0]); }
  function label(t, step) {
    if (step < 1) return (+t.toPrecision(3)) + " s";
    if (step < 60) return Math.round(t) + " s";
    if (step < 3600) return Math.round(t / 60) + " min";
    return Math.round(t / 3600) + " h";
  }
  function axis() {
    var g = document.getElementById("axis"), range = view[1] - view[0];
    var steps = [0.001,0.002,0.005,0.01,0.02,0.05,0.1,0.2,0.5,1,2,5,10,15,30,60,120,300,600,900,1800,3600,7200,14400,21600,43200,86400,172800,604800];
    var step = steps[steps.length - 1];
    for (var i = 0; i < steps.length; i++) { if (range / steps[i] <= 10) { step = steps[i]; break; } }
    while (g.firstChild) g.removeChild(g.firstChild);
    for (var t = Math.ceil(view[0] / step) * step; t <= view[1] + step * 1e-9; t += step) {
      var x = X(t), line = document.createElementNS(NS, "line"), text = document.createElementNS(NS, "text");
      line.setAttribute("class", "tick"); line.setAttribute("x1", x); line.setAttribute("x2", x);
      line.setAttribute("y1", 20); line.setAttribute("y2", H);
      text.setAttribute("class", "tick-label"); text.setAttribute("x", x + 3); text.setAttribute("y", 15);
      text.textContent = label(t, step);
      g.appendChild(line); g.appendChild(text);
    }
  }
  function place() {
    var els = plot.querySelectorAll("[data-t]");
    for (var i = 0; i < els.length; i++) {
      var el = els[i], x = X(+el.getAttribute("data-t"));
      if (el.tagName === "rect") {
        el.setAttribute("x", x.toFixed(1));
        el.setAttribute("width", Math.max(1, X(+el.getAttribute("data-t2")) - x).toFixed(1));
      } else if (el.tagName === "text") {
        var w = X(+el.getAttribute("data-t2")) - Math.max(x, 0);
        el.setAttribute("x", (Math.max(x, 0) + 10).toFixed(1));
        if (w >= +el.getAttribute("data-chars") * 6.2 + 16) el.removeAttribute("display"); else el.setAttribute("display", "none");
      } else {
        el.setAttribute("transform", "translate(" + x.toFixed(1) + " " + el.getAttribute("data-y") + ")");
      }
    }
    axis();
  }
  var picked = [];
  function select(el) {
    for (var i = 0; i < picked.length; i++) picked[i].classList.remove("sel", "hl");
    picked = [];
    var box = document.getElementById("selected"), pre = document.getElementById("selected-event");
    var e = el.getAttribute("data-e"), ref = el.getAttribute("data-ref");
    var title = el.querySelector("title");
    document.getElementById("selected-title").textContent = title ? title.textContent.split("\n")[0] : "";
    pre.textContent = e !== null && data[+e] ? JSON.stringify(data[+e], null, 2) : (title ? title.textContent : "");
    box.hidden = false;
    el.classList.add("sel"); picked.push(el);
    if (ref) {
      var target = document.getElementById(ref);
      if (target) {
        if (target.tagName === "DETAILS") target.open = true;
        target.classList.add("hl"); picked.push(target);
      }
    }
  }
  plot.addEventListener("click", function (ev) {
    var el = ev.target.closest("[data-e],[data-ref]");
    if (el && !dragged) select(el);
  });
  var brush = document.getElementById("brush"), start = null, dragged = false;
  function px(ev) { var r = plot.getBoundingClientRect(); return Math.min(W, Math.max(0, ev.clientX - r.left)); }
  plot.addEventListener("mousedown", function (ev) { start = px(ev); dragged = false; });
  window.addEventListener("mousemove", function (ev) {
    if (start === null) return;
    var x = px(ev);
    if (Math.abs(x - start) > 4) dragged = true;
    brush.setAttribute("x", Math.min(x, start)); brush.setAttribute("width", Math.abs(x - start));
    brush.setAttribute("display", dragged ? "inline" : "none");
  });
  window.addEventListener("mouseup", function (ev) {
    if (start === null) return;
    var x = px(ev), a = Math.min(x, start), b = Math.max(x, start);
    start = null; brush.setAttribute("display", "none");
    if (dragged && b - a > 4) { view = [T(a), T(b)]; place(); }
    setTimeout(function () { dragged = false; }, 0);
  });
  function reset() { view = [0, full]; place(); }
  plot.addEventListener("dblclick", reset);
  document.getElementById("reset").addEventListener("click", reset);
  function follow() {
    var id = decodeURIComponent(location.hash.slice(1));
    if (!id) return;
    // Of what points at the entry, a mark rather than a span, and a kill rather than its dump.
    var marks = plot.querySelectorAll("[data-ref]"), best = null, score = -1;
    for (var i = 0; i < marks.length; i++) {
      var m = marks[i];
      if (m.getAttribute("data-ref") !== id) continue;
      var s = (m.tagName === "g" ? 1 : 0) + (m.classList.contains("m-kill") ? 2 : 0);
      if (s > score) { best = m; score = s; }
    }
    if (best) select(best);
  }
  window.addEventListener("hashchange", follow);
  follow();
  document.body.setAttribute("data-ready", "yes");
})();
)js";

}  // namespace elastic::agent::timeline
