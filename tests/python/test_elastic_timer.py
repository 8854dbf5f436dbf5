#!/usr/bin/python3
"""elastic_timer (python/) against a real watchdog (tools/elastic-watchdog): real processes,
real signals, the real shared-memory table.

    /usr/bin/python3 tests/python/test_elastic_timer.py ELASTIC_WATCHDOG_PROGRAM SOURCE_DIR

Each case runs a Python child with ELASTIC_WATCHDOG set and a bounded wait; the torch case runs
only where torch imports (Debian's python3-torch under /usr/bin/python3).
"""

import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time

watchdog_program, src = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "python"))
import elastic_timer  # noqa: E402

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def child(code, timeout=20, env=None):
    """Runs `code` in a fresh interpreter under the watchdog; (returncode, stderr)."""
    e = dict(os.environ, PYTHONPATH=os.path.join(src, "python"), ELASTIC_WATCHDOG=name)
    e.update(env or {})
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stderr


name = f"pytest-{os.getpid()}"
work = tempfile.mkdtemp()
events = os.path.join(work, "events.jsonl")
wd = subprocess.Popen([watchdog_program, "--name", name, "--events", events, "--poll", "5", "--escalate-after", "1000",
                       "--no-stack-dump"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
try:
    for _ in range(200):
        if os.path.exists("/dev/shm/elastic-timer." + name):
            break
        time.sleep(0.01)
    time.sleep(0.1)

    t0 = time.monotonic()
    rc, err = child("""
        import time, elastic_timer
        with elastic_timer.expires(after=0.3, scope="hung_step"):
            time.sleep(10)
    """)
    took = time.monotonic() - t0
    check(rc == -signal.SIGABRT, f"an expired scope ends the process with SIGABRT (got {rc}, after {took:.2f} s)")
    check("Fatal Python error: Aborted" in err and "<string>" in err, "faulthandler wrote the Python stack")
    kills = [json.loads(l) for l in open(events) if '"watchdog_kill"' in l]
    check(any(k.get("scope") == "hung_step" for k in kills), f"the watchdog's kill event names the scope: {kills[-1:]}")

    rc, _ = child("""
        import time, elastic_timer
        with elastic_timer.expires(after=1.0, scope="fine"):
            time.sleep(0.1)
        time.sleep(1.5)
    """)
    check(rc == 0, f"a scope left in time kills nobody (got {rc})")

    rc, _ = child("""
        import time, elastic_timer
        with elastic_timer.expires(after=10, scope="outer"):
            for _ in range(40):
                with elastic_timer.expires(after=0.5, scope="inner"):
                    pass
            time.sleep(1.0)
    """)
    check(rc == 0, f"nested scopes: the inner ones left, the outer one still open, nobody killed (got {rc})")

    rc, _ = child("""
        import time, elastic_timer
        with elastic_timer.expires(after=10, scope="outer"):
            with elastic_timer.expires(after=0.3, scope="inner"):
                time.sleep(10)
    """)
    check(rc == -signal.SIGABRT, f"an inner scope expiring inside a long outer one is enforced (got {rc})")

    rc, _ = child("""
        import threading, time, elastic_timer
        c = elastic_timer.TimerClient()
        token = c.enter("handed_over", 0.4)
        t = threading.Thread(target=c.leave, args=(token,))
        t.start(); t.join()
        time.sleep(1.0)
        with elastic_timer.expires(after=5, client=c):  # the owner's stack is still usable
            pass
    """)
    check(rc == 0, f"a scope left on another thread is no longer watched (got {rc})")

    rc, _ = child("""
        import os, time, elastic_timer
        with elastic_timer.expires(after=1.0, scope="parent"):
            pid = os.fork()
            if pid == 0:
                with elastic_timer.expires(after=5, scope="child"):
                    time.sleep(0.05)
                os._exit(0)
            _, st = os.waitpid(pid, 0)
        assert st == 0, st
        time.sleep(1.5)
    """)
    check(rc == 0, f"a forked child claims its own slot; the parent's scope left in time (got {rc})")

    rc, _ = child("""
        import gc, os, threading, elastic_timer
        ts = [threading.Thread(target=lambda: elastic_timer.expires(after=5).__enter__()) for _ in range(8)]
        for t in ts: t.start()
        for t in ts: t.join()
        gc.collect()
        seg = elastic_timer._attach(None)
        owners = [int.from_bytes(seg.map[seg.slot(i) - seg.base:seg.slot(i) - seg.base + 8], "little")
                  for i in range(64)]
        assert os.getpid() not in owners, owners
    """)
    check(rc == 0, f"a thread's slot (and its open scope) is given back when the thread ends (got {rc})")

    rc, err = child("""
        import warnings, elastic_timer
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            c = elastic_timer.TimerClient()
        assert not c.watched
        assert any("cannot be opened" in str(x.message) for x in w), [str(x.message) for x in w]
        try:
            elastic_timer.attach("no-such-segment-here")
        except elastic_timer.SegmentError as e:
            assert "cannot be opened" in str(e), e
        else:
            raise SystemExit("attach() of a missing segment did not raise")
    """, env={"ELASTIC_WATCHDOG": "no-such-segment-here"})
    check(rc == 0, f"a missing segment: TimerClient() warns and runs unwatched, attach() raises ({err.strip()[-200:]})")

    fake = f"pytest-fake-{os.getpid()}"
    with open("/dev/shm/elastic-timer." + fake, "wb") as f:
        f.write(struct.pack("<QI", 0x3130474F44574C45, 9) + bytes(4096))
    bad = f"pytest-bad-{os.getpid()}"
    with open("/dev/shm/elastic-timer." + bad, "wb") as f:
        f.write(b"not a watchdog table" + bytes(4096))
    try:
        rc, err = child(f"""
            import elastic_timer
            for n, want in (("{fake}", "layout 9"), ("{bad}", "bad magic")):
                try:
                    elastic_timer.attach(n)
                except elastic_timer.SegmentError as e:
                    assert want in str(e), e
                else:
                    raise SystemExit("attached " + n)
        """)
        check(rc == 0, f"a table of another layout or no table at all is refused with the reason ({err.strip()[-200:]})")
    finally:
        os.unlink("/dev/shm/elastic-timer." + fake)
        os.unlink("/dev/shm/elastic-timer." + bad)

    try:
        import torch.distributed.elastic.timer  # noqa: F401
        have_torch = True
    except Exception:
        have_torch = False
    if have_torch:
        rc, err = child("""
            import time
            import torch.distributed.elastic.timer as timer
            import elastic_timer
            timer.configure(elastic_timer.TimerClient())
            with timer.expires(after=5):
                pass
            with timer.expires(after=0.3, scope="torch_scope"):
                time.sleep(10)
        """, timeout=60)
        check(rc == -signal.SIGABRT, f"torch's timer.expires through elastic_timer.TimerClient is enforced (got {rc})")
    else:
        print("skip torch's timer API: torch is not importable")
finally:
    wd.send_signal(signal.SIGTERM)
    try:
        wd.wait(timeout=10)
    except subprocess.TimeoutExpired:
        wd.kill()
        wd.wait()

if failures:
    print(f"{len(failures)} failed")
    sys.exit(1)
print("elastic_timer: all passed")
