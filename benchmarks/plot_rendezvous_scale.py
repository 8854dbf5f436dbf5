#!/usr/bin/python3
"""Draws rendezvous_scale's figures against N (log axes) into a PNG.

  /usr/bin/python3 benchmarks/plot_rendezvous_scale.py OUT.png RUN.json [RUN.json ...]

Each RUN.json is what ``rendezvous_scale --out`` or ``torch_rendezvous_scale.py --out`` wrote
(before and after a change, say); each file's label names its lines. Left: first round, re-round
after a retired death, re-round after a silent vanish (seconds); a size that did not form or
re-form within the cap is drawn as a hollow triangle at the cap. Right: idle store requests/s in
all, as the clients counted them and as etcd's /metrics did. Needs matplotlib (Debian:
python3-matplotlib).
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def series(results, key):
    return [(r["n"], r.get(key)) for r in results if key in r]


def draw(ax, points, cap, label, style, color, shift=1.0):
    done = [(n, v) for n, v in points if v is not None]
    if done:
        ax.plot([n for n, _ in done], [v for _, v in done], style, color=color, label=label, marker="o", ms=4)
    missed = [n for n, v in points if v is None]
    if missed and cap:
        # Nudged sideways, so that several series that all missed the cap stay apart.
        ax.plot([n * shift for n in missed], [cap] * len(missed), "^", color=color, mfc="none", ms=8,
                label=None if done else label)


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    out, files = argv[1], argv[2:]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 8))
    styles = ["-", "--", ":", "-."]
    sizes = set()
    for k, path in enumerate(files):
        with open(path) as f:
            run = json.load(f)
        # The label up to its first ':' names the lines ("before", "after, ..."); the rest (the
        # commit) is in the file.
        label = (run.get("label") or path).split(":")[0]
        style = styles[k % len(styles)]
        shift = 1.03 ** k
        res = run["results"]
        sizes.update(r["n"] for r in res)
        cap = run.get("cap_s")
        if run.get("benchmark") == "torch_rendezvous_scale":
            # A re-round is only tried where the first round formed.
            rer = [(r["n"], r.get("reround_s")) for r in res if r.get("first_round_s") is not None]
            draw(left, series(res, "first_round_s"), cap, f"torch c10d first round ({label})", style, "tab:gray", shift)
            draw(left, rer, cap, f"torch c10d re-round after a kill ({label})", style, "black", shift)
            continue
        formed = [r for r in res if r.get("first_round_s") is not None]
        draw(left, series(res, "first_round_s"), cap, f"first round ({label})", style, "tab:blue", shift)
        draw(left, series(formed, "retired_reround_s"), cap, f"re-round, retired death ({label})", style,
             "tab:orange", shift)
        draw(left, series(formed, "silent_reround_s"), cap,
             f"re-round, silent vanish, {run.get('heartbeat_timeout_ms', 0) / 1000:g} s heartbeat timeout ({label})",
             style, "tab:red", shift)
        draw(right, series(formed, "idle_requests_per_s_client"), None, f"idle, counted by the clients ({label})",
             style, "tab:green")
        draw(right, series(formed, "idle_requests_per_s_etcd"), None, f"idle, etcd /metrics ({label})", style,
             "tab:purple")
        draw(right, series(res, "peak_requests_per_s_client"), None, f"peak while forming, clients ({label})",
             style, "tab:olive")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(sizes), [str(n) for n in sorted(sizes)])
        ax.set_yscale("log")
        ax.set_xlabel("participants N")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    left.set_ylabel("seconds (triangle: none within the cap)")
    left.set_title("Rounds over one etcd")
    right.set_ylabel("store requests / s, all participants")
    right.set_title("Store load")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
