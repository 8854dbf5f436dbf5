#!/usr/bin/python3
"""What a real browser shows of a run timeline page (tools/agent/run_timeline.hpp).

    /usr/bin/python3 tests/test_timeline_browser.py --elastic-run PATH --digits-train PATH
        --elastic-report PATH --data tests/data/timeline [--chromium PATH] [--screenshot PNG]

1. A real disturbed run: elastic-run trains examples/digits_train on 3 workers; worker 2 SIGKILLs
   itself at step 60, workers 0 and 1 together at step 100, and worker 1 hangs at step 150 until
   the watchdog kills it; each is restarted and checkpoints are committed. The page elastic-run
   wrote beside its events (and named in its summary) is opened in headless Chromium at #kill-1
   and its DOM dumped after the page's script ran. It must show a lane per worker slot, the
   kill on the hung slot's lane with its scope, a restart mark per worker_restart, a checkpoint
   mark per committed step, the run's outcome, the script's selection of the kill (its event's
   fields) with the kill's entry open, and, when the run's events hold a watchdog_stack, the
   dump's text. The page fetches nothing: no src, no external href. Then a screenshot: a PNG of
   the window's size (--screenshot keeps it, for docs/timeline.png).
2. A recorded run with a stack dump (disturbed_run.jsonl) through elastic-report: the dump's text
   is in the kill's <details>, with the culprit, the straggler and the new deadlines marked.
3. Hostile events (hostile.jsonl: </script>, <img onerror>, <svg onload> in names, keys, hosts,
   scopes, messages and stack text, and malformed lines): nothing became markup or ran (no
   <img>, no on* attribute, no data-pwned set by an injected script), the strings are there as
   text, and the script still ran.
Chromium runs headless with a fresh --user-data-dir, --no-sandbox (as root there is no sandbox to
use), a timeout, in a process group of its own that is killed and reaped whatever happens.
Exits 0 when everything holds, 1 with one line per failed check, 77 when no chromium is found.
"""

import argparse
import html.parser
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile

failures = []


def check(ok, msg):
    if not ok:
        failures.append(msg)
    return ok


def run_bounded(argv, timeout, **kw):
    """Runs argv in a process group of its own; kills the group at the timeout. Returns
    (returncode or None, stdout, stderr)."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, out, err
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # whatever it left behind (renderer, GPU process)
        except ProcessLookupError:
            pass


class Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent = tag, dict(attrs), parent
        self.children = []  # Nodes and strings

    def text(self):
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def own_text(self):
        return "".join(c for c in self.children if isinstance(c, str))

    def classes(self):
        return self.attrs.get("class", "").split()

    def walk(self):
        yield self
        for c in self.children:
            if isinstance(c, Node):
                yield from c.walk()


class DomBuilder(html.parser.HTMLParser):
    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", [], None)
        self.cur = self.root

    def handle_starttag(self, tag, attrs):
        n = Node(tag, attrs, self.cur)
        self.cur.children.append(n)
        if tag not in self.VOID:
            self.cur = n

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, attrs, self.cur))

    def handle_endtag(self, tag):
        n = self.cur
        while n is not None and n.tag != tag:
            n = n.parent
        if n is not None and n.parent is not None:
            self.cur = n.parent

    def handle_data(self, data):
        self.cur.children.append(data)


def parse_dom(text):
    b = DomBuilder()
    b.feed(text)
    return b.root


def find(root, tag=None, cls=None, id=None):
    return [n for n in root.walk() if (tag is None or n.tag == tag) and (cls is None or cls in n.classes())
            and (id is None or n.attrs.get("id") == id)]


def title_of(node):
    t = [c for c in node.children if isinstance(c, Node) and c.tag == "title"]
    return t[0].text() if t else ""


class Chromium:
    def __init__(self, exe, work):
        self.exe, self.work, self.n = exe, work, 0

    def _argv(self, *extra):
        self.n += 1
        profile = os.path.join(self.work, "chromium-profile-%d" % self.n)
        return [self.exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
                "--user-data-dir=" + profile] + list(extra)

    def dump_dom(self, url, *extra):
        code, out, err = run_bounded(self._argv(*extra, "--dump-dom", url), 90)
        check(code == 0, "chromium --dump-dom %s exited %s: %s" % (url, code, err.decode(errors="replace")[-2000:]))
        return out.decode("utf-8", errors="replace")

    def screenshot(self, url, png, size=(1300, 700)):
        code, _, err = run_bounded(self._argv("--hide-scrollbars", "--window-size=%d,%d" % size,
                                              "--screenshot=" + png, url), 90)
        check(code == 0, "chromium --screenshot exited %s: %s" % (code, err.decode(errors="replace")[-2000:]))


def events_of(path):
    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def self_contained(dom, what):
    """Nothing on the page is fetched: no src, no href but to the page itself, no stylesheet or
    font from elsewhere."""
    for n in dom.walk():
        check("src" not in n.attrs, "%s: <%s src=%r> (the page must fetch nothing)" % (what, n.tag, n.attrs.get("src")))
        href = n.attrs.get("href")
        check(href is None or href.startswith("#"), "%s: <%s href=%r> (the page must fetch nothing)" % (what, n.tag, href))
        check(n.tag != "link", "%s: a <link> (the page must fetch nothing)" % what)
    for style in find(dom, "style"):
        check("url(" not in style.text() and "@import" not in style.text(), "%s: a style fetches from elsewhere" % what)


def tails(run_dir, lines=12):
    """The last lines of each rank's log and of the events: what a failed run was doing."""
    out = []
    for name in sorted(os.listdir(run_dir)) if os.path.isdir(run_dir) else []:
        if name.startswith("rank-") or name == "events.jsonl":
            with open(os.path.join(run_dir, name), errors="replace") as f:
                last = f.read().splitlines()[-lines:]
            out.append("--- %s, last %d lines:\n%s" % (name, len(last), "\n".join(l[:300] for l in last)))
    return "\n".join(out)


def disturbed_run(a, chromium, work):
    logs = os.path.join(work, "logs")
    run_id = "timeline-%d" % os.getpid()
    argv = [a.elastic_run, "--nproc-per-node", "3", "--min-ranks", "2", "--max-restarts", "5", "--step-timeout", "2",
            "--grace", "10", "--quiet", "--log-dir", logs, "--run-id", run_id, "--",
            a.digits_train, "--steps", "300", "--every", "20", "--step-sleep-ms", "5", "--ckpt",
            os.path.join(work, "ckpt"), "--kill-rank", "2", "--kill-at", "60", "--kill-together", "0,1",
            "--kill-together-at", "100", "--hang-rank", "1", "--hang-at", "150"]
    code, _, err = run_bounded(argv, 240)
    err = err.decode(errors="replace")
    if not check(code == 0, "elastic-run exited %s, want 0:\n%s%s" % (code, err, tails(os.path.join(logs, run_id)))):
        return
    page = os.path.join(logs, run_id, "timeline.html")
    check("  timeline         %s\n" % page in err, "the summary does not name the timeline %s:\n%s" % (page, err))
    if not check(os.path.exists(page), "no timeline at %s" % page):
        return
    events = events_of(os.path.join(logs, run_id, "events.jsonl"))
    host = next(e["host"] for e in events if e["event"] == "launcher_start")
    kills = [e for e in events if e["event"] == "watchdog_kill"]
    restarts = [e for e in events if e["event"] == "worker_restart"]
    steps = {str(e["step"]) for e in events if e["event"] == "checkpoint_commit"}
    stacks = [e for e in events if e["event"] == "watchdog_stack"]
    check(len(kills) == 1 and len(restarts) == 4 and len(steps) >= 10,
          "the run was not disturbed as asked: %d kills, %d restarts, %d checkpoints" % (len(kills), len(restarts), len(steps)))
    dom = parse_dom(chromium.dump_dom("file://%s#kill-1" % page))
    self_contained(dom, "the run's page")
    body = find(dom, "body")
    check(body and body[0].attrs.get("data-ready") == "yes", "the page's script did not run to its end")
    labels = {n.own_text(): n for n in find(dom, "text", "row-label")}
    for slot in range(3):
        check("%s · slot %d" % (host, slot) in labels, "no lane for slot %d: rows %s" % (slot, sorted(labels)))
    outcome = find(dom, id="outcome")
    check(outcome and outcome[0].text() == "finished", "the outcome shown is %r" % (outcome and outcome[0].text()))
    kill_marks = find(dom, "g", "m-kill")
    check(len(kill_marks) == len(kills), "%d kill marks for %d watchdog_kill events" % (len(kill_marks), len(kills)))
    hung = labels.get("%s · slot 1" % host)
    for m in kill_marks:
        check("scope 'step'" in title_of(m), "the kill mark does not name its scope: %r" % title_of(m))
        check(m.attrs.get("data-ref") == "kill-1", "the kill mark does not point at its entry")
        check(hung is not None and abs(float(m.attrs["data-y"]) + 4 - float(hung.attrs["y"])) < 0.01,
              "the kill is not on the hung slot's lane")
    check(len(find(dom, "g", "m-restart")) == len(restarts),
          "%d restart marks for %d worker_restart events" % (len(find(dom, "g", "m-restart")), len(restarts)))
    shown_steps = {m.attrs.get("data-step") for m in find(dom, "g", "m-checkpoint")}
    check(shown_steps == steps, "checkpoint marks for steps %s, committed %s" % (sorted(shown_steps), sorted(steps)))
    check(len(find(dom, "g", "m-exit-watchdog")) == 1, "no exit mark for the worker the watchdog killed")
    check(len(find(dom, "g", "m-exit-killed")) == 3, "not 3 exit marks for the SIGKILLed workers")
    # The script followed #kill-1: the kill's event in the panel, its entry open.
    selected = find(dom, id="selected")
    check(selected and "hidden" not in selected[0].attrs, "the script did not show the selected event")
    chosen = find(dom, id="selected-event")
    check(chosen and '"event": "watchdog_kill"' in chosen[0].text() and '"scope": "step"' in chosen[0].text(),
          "the selected event is not the kill: %r" % (chosen and chosen[0].text()[:300]))
    entry = find(dom, "details", id="kill-1")
    check(entry and "open" in entry[0].attrs, "the kill's entry is not open")
    if stacks:  # the watchdog recorded the hung worker's stacks: their text is on the page
        pre = find(entry[0], "pre", "stack") if entry else []
        first = stacks[0].get("text", "").splitlines()[:2]
        check(pre and all(line in pre[0].text() for line in first), "the stack dump's text is not in the kill's entry")

    png = os.path.join(work, "timeline.png")
    chromium.screenshot("file://" + page, png)
    with open(png, "rb") as f:
        head = f.read(24)
    check(head[:8] == b"\x89PNG\r\n\x1a\n", "the screenshot is not a PNG")
    check(struct.unpack(">II", head[16:24]) == (1300, 700), "the screenshot is not of the window's size")
    if a.screenshot:
        shutil.copyfile(png, a.screenshot)


def recorded_run(a, chromium, work):
    page = os.path.join(work, "recorded.html")
    code, _, err = run_bounded([a.elastic_report, os.path.join(a.data, "disturbed_run.jsonl"), "-o", page], 60)
    if not check(code == 0, "elastic-report exited %s: %s" % (code, err.decode(errors="replace"))):
        return
    dom = parse_dom(chromium.dump_dom("file://" + page))
    entry = find(dom, "details", id="kill-1")
    pre = find(entry[0], "pre", "stack") if entry else []
    check(pre and "(anonymous namespace)::hang_forever() at /work/main/examples/digits_train.cpp:212" in pre[0].text(),
          "the recorded stack dump's text is not in the kill's entry")
    check(entry and "vm · slot 1" in entry[0].text(), "the kill's entry does not name its lane")
    for kind in ("m-culprit", "m-straggler", "m-timeouts", "m-stack"):
        check(find(dom, "g", kind), "no %s mark" % kind)


HARNESS = """<!DOCTYPE html><html><body><pre id="out">not run</pre>
<iframe id="f" src="recorded.html" width="1400" height="900"></iframe>
<script>
// Drives the page as a person would: a drag across the picture, a click on the kill, a
// double-click; then says what the page showed after each.
document.getElementById("f").addEventListener("load", function () {
  var w = this.contentWindow, d = this.contentDocument, out = [];
  var plot = d.getElementById("plot"), r = plot.getBoundingClientRect(), y = r.top + 40;
  function mouse(target, type, x) {
    target.dispatchEvent(new w.MouseEvent(type, {bubbles: true, clientX: r.left + x, clientY: y}));
  }
  function ticks() {
    return Array.prototype.map.call(d.querySelectorAll("#axis .tick-label"), function (t) { return t.textContent; }).join(",");
  }
  function killX() { return d.querySelector("g.m-kill").getAttribute("transform"); }
  out.push("ticks: " + ticks(), "kill: " + killX());
  mouse(plot, "mousedown", 800); mouse(w, "mousemove", 900); mouse(w, "mouseup", 900);
  out.push("zoomed ticks: " + ticks(), "zoomed kill: " + killX());
  setTimeout(function () {
    d.querySelector("g.m-kill").dispatchEvent(new w.MouseEvent("click", {bubbles: true}));
    out.push("selected: " + d.getElementById("selected-title").textContent);
    out.push("open: " + d.getElementById("kill-1").open);
    mouse(plot, "dblclick", 50);
    out.push("reset ticks: " + ticks(), "reset kill: " + killX());
    document.getElementById("out").textContent = out.join("\\n");
  }, 50);
});
</script></body></html>
"""


def interaction(a, chromium, work):
    """Zoom by a drag, a click on the kill, reset by a double-click, driven from a page that
    holds the recorded run's page in an iframe (file pages reach each other only with
    --allow-file-access-from-files)."""
    page = os.path.join(work, "recorded.html")
    if not os.path.exists(page):
        return
    harness = os.path.join(work, "harness.html")
    with open(harness, "w") as f:
        f.write(HARNESS)
    dom = parse_dom(chromium.dump_dom("file://" + harness, "--allow-file-access-from-files", "--virtual-time-budget=5000"))
    out = find(dom, id="out")
    lines = dict(line.split(": ", 1) for line in (out[0].text() if out else "").split("\n") if ": " in line)
    if not check(len(lines) >= 7, "the page did not answer the drag, the click and the double-click: %r" % lines):
        return
    check(lines["zoomed ticks"] != lines["ticks"] and len(lines["zoomed ticks"].split(",")) >= 4,
          "a drag across a tenth of the picture did not zoom the axis: %s -> %s" % (lines["ticks"], lines["zoomed ticks"]))
    check(lines["zoomed kill"] != lines["kill"], "the kill mark did not move with the zoom")
    check(lines["selected"].startswith("watchdog_kill: scope 'step'"), "a click on the kill selected %r" % lines["selected"])
    check(lines["open"] == "true", "a click on the kill did not open its entry")
    check(lines["reset ticks"] == lines["ticks"] and lines["reset kill"] == lines["kill"],
          "a double-click did not show everything again")


def hostile(a, chromium, work):
    page = os.path.join(work, "hostile.html")
    code, _, err = run_bounded([a.elastic_report, os.path.join(a.data, "hostile.jsonl"), "-o", page], 60)
    if not check(code == 0, "elastic-report exited %s on hostile events: %s" % (code, err.decode(errors="replace"))):
        return
    dom = parse_dom(chromium.dump_dom("file://%s#kill-1" % page))
    self_contained(dom, "the hostile page")
    body = find(dom, "body")[0]
    check(body.attrs.get("data-ready") == "yes", "the script did not run to its end on hostile events")
    check("data-pwned" not in body.attrs, "a script from the events ran: data-pwned=%r" % body.attrs.get("data-pwned"))
    check(not find(dom, "img"), "an <img> from the events became an element")
    for n in dom.walk():
        bad = [k for k in n.attrs if k.startswith("on")]
        check(not bad, "<%s> got an event handler attribute %s" % (n.tag, bad))
    scripts = find(dom, "script")
    check(len(scripts) == 2, "%d <script> elements, want the page's 2" % len(scripts))
    text = body.text()
    for s in ("<img src=x onerror=\"document.body.setAttribute('data-pwned','message')\">",
              "</pre></details><img src=x onerror=", "</script><script>document.body.setAttribute('data-pwned','command')",
              "h2<img src=x onerror="):
        check(s in text, "the hostile string %r is not on the page as text" % s)
    chosen = find(dom, id="selected-event")
    check(chosen and "</title><script>" in chosen[0].text(), "the selected kill's hostile scope is not shown as text")
    check(find(dom, "title")[0].text() == "hostile · run timeline", "the page's title changed")
    check("malformed lines skipped: 8" in text, "the malformed lines are not counted on the page")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--elastic-run", required=True)
    p.add_argument("--digits-train", required=True)
    p.add_argument("--elastic-report", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--chromium", default="")
    p.add_argument("--screenshot", default="")
    a = p.parse_args()
    exe = a.chromium or shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe or not os.access(exe, os.X_OK):
        print("no chromium: install Debian's chromium (scripts/lib.sh installs it with the test packages)")
        return 77
    with tempfile.TemporaryDirectory(prefix="elastic-timeline-") as work:
        chromium = Chromium(exe, work)
        disturbed_run(a, chromium, work)
        recorded_run(a, chromium, work)
        interaction(a, chromium, work)
        hostile(a, chromium, work)
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("the timeline pages show what their events say, in a real headless Chromium")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
