#!/usr/bin/env python3
"""The results table of scripts/gpu_check.sh, from the raw logs it gathered.

  gpu_check_report.py RAW_DIR OUT.md

RAW_DIR holds: meta.txt, status.tsv (section, exit, seconds, note), env.log, releases.txt,
scenario-<release>-<case>.log (tests/test_nccl_group's output) with nccl/<release>-<case>/*.log
(NCCL's INFO logs, timestamped), torchrun.json, demo.log, checkpoint.json, standby.log. Whatever is
missing or malformed becomes a dash or a note in the table, never an exception: the table is
written whatever happened.
"""

import json
import os
import re
import statistics
import sys
from datetime import datetime

CASES = [("kill", "SIGKILL inside an allreduce", "3"), ("kill-standby", "SIGKILL, standby communicators", "3"),
         ("hang", "SIGSTOP (hang)", "3"), ("hang-standby", "SIGSTOP, standby communicators", "3"),
         ("restart", "the killed rank restarted", "4")]
FIELDS = [("noticed", "noticed"), ("rendezvous", "rendezvous"), ("connected", "communicator up"),
          ("resynced", "resynced"), ("first step", "first step")]
LINE = re.compile(r"^(?P<what>[^:]+): (?P<id>\S+) round (?P<round>\S+) world (?P<world>\S+) path (?P<path>[^:\s]+): "
                  r"(?P<rest>.*)$")


def read(path, default=""):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return default


def json_of(path):
    """The JSON a section wrote, or None when it is absent, empty or cut short."""
    try:
        return json.loads(read(path) or "null")
    except ValueError:
        return None


def benchmarks_of(path):
    """The benchmark entries of a Google Benchmark JSON file (none when it is unreadable)."""
    return (json_of(path) or {}).get("benchmarks", [])


def ms(v):
    return "—" if v is None else f"{v:,.0f}" if abs(v) >= 100 else f"{v:.1f}"


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def rebuild_lines(text):
    """Per survivor, its rebuild lines as dicts (path, world, and the phases in ms)."""
    out = {}
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if not m:
            continue
        d = {"path": m["path"], "world": m["world"], "round": m["round"]}
        for key, _ in FIELDS:
            f = re.search(re.escape(key) + r" ([+-]?\d+(?:\.\d+)?) ms", m["rest"])
            d[key] = float(f.group(1)) if f else None
        out.setdefault(m["id"], []).append(d)
    return out


def scenario_row(text, world):
    """The median over the survivors of each phase, each survivor's rebuild into `world`."""
    per = rebuild_lines(text)
    if not per:
        return None
    picked = []
    for lines in per.values():
        pick = next((l for l in lines if l["world"] == world), lines[0])
        picked.append(pick)
    row = {key: median(p[key] for p in picked) for key, _ in FIELDS}
    row["path"] = "/".join(sorted({p["path"] for p in picked}))
    row["survivors"] = len(picked)
    return row


TS = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\]")
TIMINGS = re.compile(r"Init timings - (\S+): rank \d+ nranks (\d+) total ([\d.]+) \(([^)]*)\)")


def nccl_summary(log_dir, nranks):
    """NCCL's own view of the communicators of `nranks` made in a run: the median of its "Init
    timings" (seconds, 10 ms resolution) and of each teardown (an abort's first line to its
    COMPLETE, from the timestamps)."""
    inits, parts, teardowns = [], {}, []
    try:
        files = [os.path.join(log_dir, f) for f in os.listdir(log_dir)]
    except OSError:
        return "—"
    for path in files:
        first_seen = {}
        for line in read(path).splitlines():
            m = TIMINGS.search(line)
            if m and m.group(2) == nranks:
                inits.append((m.group(1), float(m.group(3)) * 1e3))
                for kv in m.group(4).split(","):
                    k, _, v = kv.strip().partition(" ")
                    try:
                        parts.setdefault(k, []).append(float(v) * 1e3)
                    except ValueError:
                        pass
            t = TS.match(line)
            c = re.search(r"comm (0x[0-9a-f]+)", line)
            if not (t and c):
                continue
            when = datetime.strptime(t.group(1)[:26], "%Y-%m-%d %H:%M:%S.%f").timestamp() * 1e3
            low = line.lower()
            if "abort" in low or "revoke" in low or "destroy" in low:
                first_seen.setdefault(c.group(1), when)
            if "abort complete" in low or "destroy complete" in low:
                teardowns.append(when - first_seen.get(c.group(1), when))
    if not inits:
        return "no Init timings in its log"
    funcs = sorted({f for f, _ in inits})
    big = sorted(((median(v), k) for k, v in parts.items()), reverse=True)[:2]
    text = f"{'/'.join(funcs)}: {ms(median(t for _, t in inits))} ms (n={len(inits)})"
    if big:
        text += "; " + ", ".join(f"{k} {ms(v)}" for v, k in big)
    if teardowns:
        text += f"; teardown {ms(median(teardowns))} ms"
    return text


def main():
    raw, out_md = sys.argv[1], sys.argv[2]
    meta = read(os.path.join(raw, "meta.txt")).splitlines()
    status = [l.split("\t") for l in read(os.path.join(raw, "status.tsv")).splitlines() if l.count("\t") >= 3]
    env = read(os.path.join(raw, "env.log"))
    releases = [r for r in read(os.path.join(raw, "releases.txt")).split() if r]
    lines = []
    w = lines.append

    def said(section):
        """What the check said of a section that has no figures."""
        st = next((x for x in status if x[0] == section), None)
        return st[3] if st else "not run"

    gpu = re.search(r"^GPU 0: .*$", env, re.M)
    driver = re.search(r"== driver\n(.*)", env)
    torch_line = re.search(r"^torch .*$", env, re.M)
    w(f"### GPU check ({meta[0] if meta else 'mode ?'}), {meta[1] if len(meta) > 1 else ''}")
    w("")
    w(f"- Device: {gpu.group(0) if gpu else 'none answered (nvidia-smi)'}; "
      f"{'driver ' + driver.group(1).strip() if driver and driver.group(1).strip() else 'driver ?'}")
    for m in meta[2:]:
        w(f"- {m}")
    w(f"- libnccl releases run: {', '.join(releases) or 'none found'}"
      + (f"; {torch_line.group(0)}" if torch_line else ""))
    w("")
    w("| section | result | seconds |")
    w("|---|---|---|")
    for name, rc, secs, note in status:
        if rc != "0":
            # Where it went wrong, in the table itself: the last line of the section's log.
            last = [l.strip() for l in read(os.path.join(raw, name + ".log")).splitlines() if l.strip()]
            if last:
                note += ": " + last[-1][:160].replace("|", "/")
        w(f"| {name} | {note} | {secs} |")
    w("")

    kill_first = {}  # release -> our kill's first step (or resynced), for the torchrun ratio

    def guard(section, render):
        """One section's failure to render is a line in the table, not a lost table."""
        try:
            render()
        except Exception as e:  # noqa: BLE001 (anything: the table must be written)
            w(f"(the report could not render {section}: {type(e).__name__}: {e})")
            w("")

    def render_scenarios():
        # The NCCL rebuild scenarios.
        w("#### NCCL rebuilds, four ranks on one GPU (ms after the event, median of the 3 survivors)")
        w("")
        w("| event | libnccl | path | noticed | rendezvous | communicator up | resynced | first step "
          "| NCCL's log: init of the new communicator, largest phases, teardown (ms) |")
        w("|---|---|---|---|---|---|---|---|---|")
        for rel in releases:
            for key, label, world in CASES:
                name = f"scenario-{rel}-{key}"
                text = read(os.path.join(raw, name + ".log"))
                row = scenario_row(text, world)
                st = next((s for s in status if s[0] == name), None)
                if row is None:
                    why = st[3] if st else "not run"
                    if "No test cases matched" in text:
                        why = "no such test case in this build"
                    w(f"| {label} | {rel} | — | — | — | — | — | — | {why} |")
                    continue
                if key in ("kill", "kill-standby"):
                    kill_first[(rel, key)] = row["first step"] if row["first step"] is not None else row["resynced"]
                extra = "" if st is None or st[1] == "0" else f" (test: {st[3]})"
                w(f"| {label} | {rel} | {row['path']} | " + " | ".join(ms(row[k]) for k, _ in FIELDS)
                  + f" | {nccl_summary(os.path.join(raw, 'nccl', f'{rel}-{key}'), world)}{extra} |")
        w("")

    guard("scenarios", render_scenarios)

    def render_torchrun():
        # torchrun + NCCL against our kill.
        tr = json_of(os.path.join(raw, "torchrun.json"))
        if not tr:
            # The script writes its JSON at the end: the trials that finished before a failure or a
            # timeout are in its log, one line each.
            done = [float(x) for x in re.findall(r"trial \d+: .*first_step_all +([\d.]+) ms", read(os.path.join(raw, "torchrun.log")))]
            if done:
                tr = {"torch": "?", "backend": "nccl", "trials": f"{len(done)} finished",
                      "settings": {"0.1 s": {"summary": {"first_step_all": {"median_ms": median(done), "max_ms": max(done)}}}}}
        w("#### torchrun + NCCL on the same job (4 ranks, GPU 0, kill of one rank → all ranks' first step)")
        w("")
        if tr:
            for setting, s in tr.get("settings", {}).items():
                fa = s["summary"]["first_step_all"]
                w(f"| | kill → first step (median / max, ms) | torchrun / elastic |")
                w("|---|---|---|")
                w(f"| torchrun, torch {tr.get('torch')} {tr.get('backend')}, monitor interval {setting}, "
                  f"{tr.get('trials')} trials (full restart of all 4) | {ms(fa['median_ms'])} / {ms(fa['max_ms'])} | |")
                for key, how in (("kill", "reinit"), ("kill-standby", "standby")):
                    ours = kill_first.get((releases[0], key)) if releases else None
                    ratio = f"**{fa['median_ms'] / ours:.0f} ×**" if ours else "—"
                    w(f"| elastic, kill ({how}), libnccl {releases[0] if releases else '?'} (3 survivors, in "
                      f"process) | {ms(ours)} | {ratio} |")
        else:
            w(f"not measured: {said('torchrun')}")
        w("")

    guard("torchrun", render_torchrun)

    def render_demo():
        # The demo.
        demo = read(os.path.join(raw, "demo.log"))
        w("#### GPU demo (`scripts/demo_gpu.sh`: cuda_train, 4 workers on GPU 0, SIGKILL, preemption, resume)")
        w("")
        fin = re.search(r"^final weights: .*$", demo, re.M)
        if "identical, bit for bit" in demo:
            w(f"bit-identical: {fin.group(0) if fin else ''}")
        else:
            tail = [l for l in demo.splitlines() if l.startswith("demo_gpu:")]
            w(f"{said('demo')}{': ' + tail[-1] if tail else ''}")
        w("")

    guard("demo", render_demo)

    def render_checkpoint():
        # The checkpoint's overhead.
        w("#### Adaptive checkpoint, 1 GiB of device weights (`checkpoint_gpu_bench`)")
        w("")
        bench = benchmarks_of(os.path.join(raw, "checkpoint.json"))
        rows = [b for b in bench if "overhead_pct" in b]
        errors = [f"{b.get('name')}: {b['error_message']}" for b in bench if b.get("error_message")]
        if errors and not rows:
            w("not measured: " + "; ".join(errors))
        elif rows:
            # The steps' slowdown, and the run's with its end: the checkpoints in flight when the
            # last step ends are made durable then, once per run (older builds reported only one
            # figure, which included it).
            w("| benchmark | training slowdown (steps) | the 200-step run with its end | end: in-flight checkpoints made durable (ms) | checkpoint every (steps, at the end) | step (ms) |")
            w("|---|---|---|---|---|---|")
            for b in rows:
                total = f"{b['overhead_with_end_pct']:.2f} %" if "overhead_with_end_pct" in b else "-"
                settle = f"{b['end_settle_ms']:.0f}" if "end_settle_ms" in b else "-"
                w(f"| {b['name']} | **{b['overhead_pct']:.2f} %** | {total} | {settle} | {b.get('every_steps', 0):.0f} | {b.get('step_ms', 0):.1f} |")
        else:
            w(f"not measured: {said('checkpoint')}")
        w("")

    guard("checkpoint", render_checkpoint)

    def render_standby():
        # The standby prototype.
        standby = read(os.path.join(raw, "standby.log"))
        w("#### Standby communicators (`nccl_standby_bench`)")
        w("")
        # Its table and conclusion (its own markdown, pasted as it is; anything else as code);
        # its JSON line stays in the logs.
        keep = [l for l in standby.strip().splitlines() if not l.startswith('{"bench"')][-40:]
        if not keep:
            w(said("standby"))
        elif any(l.startswith("|---") for l in keep):
            w("\n".join(keep))
        else:
            w("```")
            w("\n".join(keep))
            w("```")
        w("")
    guard("standby", render_standby)

    def render_nccl_bench():
        # One communicator's lifecycle, alone (nccl_bench).
        bench = benchmarks_of(os.path.join(raw, "nccl_bench.json"))
        rows = [b for b in bench if "real_time" in b and not b.get("error_message")]
        w("#### One communicator's lifecycle (`nccl_bench`, one rank, libnccl "
          f"{releases[0] if releases else '?'})")
        w("")
        if rows:
            w("| benchmark | time per iteration |")
            w("|---|---|")
            for b in rows:
                w(f"| {b['name']} | {b['real_time']:.1f} {b.get('time_unit', '')} |")
        else:
            errors = [b["error_message"] for b in bench if b.get("error_message")]
            w(f"not measured: {errors[0] if errors else said('nccl_bench')}")
        w("")
    guard("nccl_bench", render_nccl_bench)

    with open(out_md, "w") as f:
        f.write("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
