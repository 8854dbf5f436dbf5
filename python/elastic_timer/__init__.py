"""Timer scopes of a Python worker, enforced by elastic's watchdog.

Under ``elastic-run`` every worker gets ``ELASTIC_WATCHDOG``, the name of the launcher's
shared-memory table of deadlines. A scope entered here writes its deadline into that table (a
few stores, no message to a server) and the watchdog kills the worker once a deadline passes:
first with SIGABRT, on which Python's faulthandler writes every thread's Python stack into the
worker's log, then SIGKILL if it still lives.

torch's expiration-timer API works unchanged::

    import torch.distributed.elastic.timer as timer
    import elastic_timer
    timer.configure(elastic_timer.TimerClient())
    with timer.expires(after=60):
        train_step()

or without torch::

    with elastic_timer.expires(after=60, scope="train_step"):
        train_step()

Without ``ELASTIC_WATCHDOG`` (not under elastic-run) scopes are not enforced, and say so once.
The table's layout is include/elastic/timer/detail/table.hpp (layout version 1): the offsets below
are that file's, and tests/python/test_elastic_timer.py checks them against a live watchdog.
Atomic operations come from libatomic (``__atomic_*``), so this package is pure Python.
"""

import ctypes
import ctypes.util
import faulthandler
import mmap
import os
import platform
import signal as _signal
import sys
import threading
import time
import warnings

__all__ = ["TimerClient", "ElasticTimerClient", "expires", "attach", "watched", "TableFullWarning", "SegmentError"]
__version__ = "0.1.0"


class SegmentError(RuntimeError):
    """The watchdog's table named by ELASTIC_WATCHDOG cannot be used (absent, another version or owner)."""


class TableFullWarning(RuntimeWarning):
    """A scope is not watched: the table has no free slot, or the thread has 32 scopes open."""


# include/elastic/timer/detail/table.hpp, layout version 1.
_MAGIC = 0x3130474F44574C45  # "ELWDOG01"
_LAYOUT_VERSION = 1
_HEADER_BYTES = 192
_SLOT_BYTES = 64 * 33
_SCOPES_PER_SLOT = 32
_NAME_BYTES = 32
# segment_header
_H_MAGIC, _H_VERSION, _H_SLOT_COUNT, _H_SCOPES, _H_SLOT_BYTES, _H_OWNER_UID = 0, 8, 12, 16, 20, 24
_H_TOTAL_BYTES, _H_HIGH_WATER, _H_TABLE_FULL, _H_NEXT_WAKE, _H_DOORBELL = 32, 56, 64, 128, 136
# slot_header
_S_OWNER, _S_START_TIME, _S_TID, _S_RANK, _S_DEPTH, _S_DROPPED, _S_GENERATION = 0, 8, 16, 20, 24, 28, 32
# scope_entry, 64 bytes each after the slot header
_E_GENERATION, _E_DEADLINE, _E_ENTERED, _E_SIGNAL, _E_WARN, _E_NAME = 0, 8, 16, 24, 28, 32

_RELAXED, _ACQUIRE, _RELEASE, _ACQ_REL, _SEQ_CST = 0, 2, 3, 4, 5
_FUTEX_WAKE = 1
# x86 keeps stores in order and makes every aligned store of up to 8 bytes atomic: there an
# entry's fields, its generation and the depth are plain ctypes stores (the release order the
# table's protocol asks for is the machine's own). Elsewhere they go through libatomic.
_TSO = platform.machine() in ("x86_64", "AMD64", "i386", "i686")
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "ppc64le": 221, "s390x": 238}.get(platform.machine())


def _load_libatomic():
    for name in ("libatomic.so.1", ctypes.util.find_library("atomic")):
        if name:
            try:
                return ctypes.CDLL(name)
            except OSError:
                pass
    raise SegmentError("libatomic is not installed (Debian: apt-get install libatomic1): elastic_timer needs its "
                       "atomic operations to share the watchdog's table")


_atomic = None
_libc = ctypes.CDLL(None, use_errno=True)
_u64, _i64, _u32, _i32 = ctypes.c_uint64, ctypes.c_int64, ctypes.c_uint32, ctypes.c_int32


class _Atomics:
    """libatomic's __atomic_* functions (looked up by name: a class body would mangle them)."""

    def __init__(self, lib):
        def fn(name, args, res):
            f = getattr(lib, name)
            f.argtypes, f.restype = args, res
            return f
        vp, i = ctypes.c_void_p, ctypes.c_int
        self.cas8 = fn("__atomic_compare_exchange_8", [vp, vp, _u64, i, i], ctypes.c_bool)
        self.cas4 = fn("__atomic_compare_exchange_4", [vp, vp, _u32, i, i], ctypes.c_bool)
        self.store8 = fn("__atomic_store_8", [vp, _u64, i], None)
        self.store4 = fn("__atomic_store_4", [vp, _u32, i], None)
        self.load8 = fn("__atomic_load_8", [vp, i], _u64)
        self.load4 = fn("__atomic_load_4", [vp, i], _u32)
        self.add4 = fn("__atomic_fetch_add_4", [vp, _u32, i], _u32)
        self.add8 = fn("__atomic_fetch_add_8", [vp, _u64, i], _u64)


def _process_start_time(pid):
    """Field 22 of /proc/PID/stat, as the watchdog reads it to tell a pid's processes apart."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def _monotonic_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class _Segment:
    """The watchdog's table, mapped for as long as the process lives (scopes point into it)."""

    def __init__(self, name):
        if not name or "/" in name or len(name) > 200:
            raise SegmentError(f"watchdog segment name {name!r} is not valid")
        path = "/dev/shm/elastic-timer." + name
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as e:
            raise SegmentError(f"watchdog segment '{name}' ({path}) cannot be opened: {e.strerror}; is the "
                               "watchdog (elastic-run) running?") from None
        try:
            st = os.fstat(fd)
            if not (st.st_mode & 0o170000) == 0o100000:
                raise SegmentError(f"{path} is not a shared-memory object")
            if st.st_uid not in (os.geteuid(), 0):
                raise SegmentError(f"watchdog segment '{name}' belongs to uid {st.st_uid}, not this user")
            deadline = time.monotonic() + 2.0
            while os.fstat(fd).st_size < _HEADER_BYTES:
                if time.monotonic() > deadline:
                    raise SegmentError(f"watchdog segment '{name}' was never initialized")
                time.sleep(0.002)
            self.map = mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.name = name
        a = _atomic
        while a.load8(self.base + _H_MAGIC, _ACQUIRE) == 0:
            if time.monotonic() > deadline:
                raise SegmentError(f"watchdog segment '{name}' was never initialized")
            time.sleep(0.002)
        magic = a.load8(self.base + _H_MAGIC, _ACQUIRE)
        version = _u32.from_address(self.base + _H_VERSION).value
        if magic != _MAGIC:
            raise SegmentError(f"{path} is not an elastic watchdog segment (bad magic)")
        if version != _LAYOUT_VERSION:
            raise SegmentError(f"watchdog segment '{name}' has table layout {version}; this elastic_timer "
                               f"({__version__}) reads layout {_LAYOUT_VERSION}: use the package of the same "
                               "elastic release as elastic-run")
        self.binding = _Binding()  # each thread's slot in this table
        self.slot_count = _u32.from_address(self.base + _H_SLOT_COUNT).value
        scopes = _u32.from_address(self.base + _H_SCOPES).value
        slot_bytes = _u32.from_address(self.base + _H_SLOT_BYTES).value
        total = _u64.from_address(self.base + _H_TOTAL_BYTES).value
        if (scopes != _SCOPES_PER_SLOT or slot_bytes != _SLOT_BYTES
                or total != _HEADER_BYTES + self.slot_count * _SLOT_BYTES or len(self.map) < total):
            raise SegmentError(f"watchdog segment '{name}' is damaged (its sizes disagree with its header)")

    def slot(self, i):
        return self.base + _HEADER_BYTES + i * _SLOT_BYTES


class _Views:
    """ctypes objects over one slot's words, made once per claimed slot: a store through one is
    a fraction of what making the object costs."""

    def __init__(self, seg, slot):
        e = [slot + 64 + 64 * k for k in range(_SCOPES_PER_SLOT)]
        self.entry = e
        self.gen = [_u64.from_address(x + _E_GENERATION) for x in e]
        self.deadline = [_i64.from_address(x + _E_DEADLINE) for x in e]
        self.entered = [_i64.from_address(x + _E_ENTERED) for x in e]
        self.signal = [_i32.from_address(x + _E_SIGNAL) for x in e]
        self.warn = [_u32.from_address(x + _E_WARN) for x in e]
        self.depth = _u32.from_address(slot + _S_DEPTH)
        self.next_wake = _i64.from_address(seg.base + _H_NEXT_WAKE)


class _Held:
    """A thread's slot in a table: claimed at its first scope, given back when the thread ends
    (the thread's locals are dropped then); the watchdog reclaims those of a dead process."""

    def __init__(self):
        self.slot = None      # address of the slot header
        self.pid = 0          # the process that claimed it (a forked child claims its own)
        self.depth = 0
        self.generation = 0
        self.open = []        # (scope id, entry index, generation), innermost last
        self.retry_after = 0
        self.views = None

    def __del__(self):
        try:
            _give_back(self)
        except Exception:  # interpreter shutdown
            pass


class _Binding(threading.local):
    def __init__(self):
        self.held = _Held()


def _give_back(b):
    if b.slot is None or b.pid != os.getpid():
        return
    s, a = b.slot, _atomic
    for k in range(_SCOPES_PER_SLOT):
        a.store8(s + 64 + 64 * k + _E_GENERATION, 0, _RELAXED)
    a.store4(s + _S_DEPTH, 0, _RELAXED)
    a.store8(s + _S_GENERATION, b.generation + 1, _RELAXED)
    a.store8(s + _S_START_TIME, 0, _RELAXED)
    a.store8(s + _S_OWNER, 0, _RELEASE)
    b.slot = None


class TimerClient:
    """torch.distributed.elastic.timer's client interface (acquire/release), on elastic's watchdog.

    ``signal``: what an expired scope gets first (default SIGABRT: with Python's faulthandler,
    enabled here, every thread's Python stack goes to stderr, the worker's log); the watchdog
    follows with SIGKILL if the worker still lives. ``segment``: the table's name (default
    ``$ELASTIC_WATCHDOG``).
    """

    def __init__(self, signal=_signal.SIGABRT, segment=None):
        self.signal = int(signal)
        if segment is not None:
            self._segment = _attach(segment)  # asked for by name: a table that cannot be used is an error
        else:
            try:
                self._segment = _attach(None)
            except SegmentError as e:  # as the C++ client: the worker runs on, unwatched, and says so once
                _warn_once("unwatched", f"timer scopes are not enforced in this process: {e}")
                self._segment = None
        if self._segment is not None and self.signal == _signal.SIGABRT and not faulthandler.is_enabled():
            faulthandler.enable(all_threads=True)

    @property
    def watched(self):
        """Whether scopes entered with this client are enforced (a watchdog table is attached)."""
        return self._segment is not None

    def acquire(self, scope_id, expiration_time):
        """torch's call: a scope named ``scope_id`` that expires at ``expiration_time`` (time.time())."""
        self.enter(scope_id, max(0.0, expiration_time - time.time()))

    def release(self, scope_id):
        """torch's call: the innermost open scope named ``scope_id`` ended."""
        if self._segment is None:
            return
        b = self._segment.binding.held
        if b.slot is None or b.pid != os.getpid():
            return
        self._leave_innermost(b, 0, scope_id)

    def enter(self, name, after_seconds):
        """Opens a scope that expires ``after_seconds`` from now; returns a token for leave()."""
        seg = self._segment
        if seg is None:
            return None
        b = self._segment.binding.held
        if b.slot is None or b.pid != os.getpid():
            if not self._bind(b):
                return None
        if b.depth >= _SCOPES_PER_SLOT:
            _atomic.add4(b.slot + _S_DROPPED, 1, _RELAXED)
            _warn_once("depth", f"a thread has {_SCOPES_PER_SLOT} timer scopes open: deeper ones are not watched")
            return None
        now = _monotonic_ns()
        deadline = now + int(after_seconds * 1e9)
        k, v = b.depth, b.views
        b.generation += 1
        g = b.generation
        if not _TSO:
            _atomic.add8(v.entry[k] + _E_GENERATION, 0, _SEQ_CST)  # the seqlock's write fence (the entry is free: 0)
        v.deadline[k].value = deadline
        v.entered[k].value = now
        v.signal[k].value = self.signal
        v.warn[k].value = 0
        ctypes.memmove(v.entry[k] + _E_NAME, _padded(name), _NAME_BYTES)
        b.depth = k + 1
        if _TSO:
            v.gen[k].value = g
            v.depth.value = k + 1
        else:
            _atomic.store8(v.entry[k] + _E_GENERATION, g, _RELEASE)
            _atomic.store4(b.slot + _S_DEPTH, k + 1, _RELEASE)
        b.open.append((name, k, g))
        if deadline < v.next_wake.value:
            _ring(seg)
        return (b.pid, b.slot, k, g)

    def leave(self, token):
        """Ends the scope enter() returned ``token`` for."""
        if self._segment is None or token is None:
            return
        b = self._segment.binding.held
        pid, slot, index, g = token
        if pid != os.getpid():
            return  # entered before a fork: the slot is the parent's
        if b.slot != slot:
            # Left on another thread than it was entered on: clear the entry only if it is still
            # this scope; its thread drops it from its stack when it next leaves a scope.
            expected = _u64(g)
            _atomic.cas8(slot + 64 + 64 * index + _E_GENERATION, ctypes.addressof(expected), 0, _ACQ_REL, _RELAXED)
            return
        self._leave_innermost(b, 2, g)

    def _leave_innermost(self, b, field, value):
        """Leaves the innermost open scope whose `field` (0: its name, 2: its generation) is `value`."""
        for i in range(len(b.open) - 1, -1, -1):
            if b.open[i][field] == value:
                self._leave(b, i)
                return

    def _leave(self, b, i):
        _, index, g = b.open.pop(i)
        v = b.views
        if v.gen[index].value != g:  # cleared from another thread meanwhile
            if index + 1 == b.depth:
                self._pop_free(b, index + 1)
            return
        if _TSO:
            v.gen[index].value = 0
        else:
            _atomic.store8(v.entry[index] + _E_GENERATION, 0, _RELEASE)
        if index + 1 == b.depth:
            self._pop_free(b, index)

    @staticmethod
    def _pop_free(b, d):
        """Lowers the thread's depth to `d`, and below it past entries already free."""
        v = b.views
        while d > 0 and v.gen[d - 1].value == 0:
            d -= 1
        b.open = [o for o in b.open if o[1] < d]
        b.depth = d
        if _TSO:
            v.depth.value = d
        else:
            _atomic.store4(b.slot + _S_DEPTH, d, _RELEASE)

    def _bind(self, b):
        seg, a = self._segment, _atomic
        now = time.monotonic()
        if b.pid == os.getpid() and now < b.retry_after:
            return False
        pid = os.getpid()
        b.slot, b.depth, b.open = None, 0, []
        start = _process_start_time(pid)
        expected = _u64(0)
        for i in range(seg.slot_count):
            s = seg.slot(i)
            if a.load8(s + _S_OWNER, _RELAXED) != 0:
                continue
            expected.value = 0
            if not a.cas8(s + _S_OWNER, ctypes.addressof(expected), pid, _ACQ_REL, _ACQUIRE):
                continue
            _i32.from_address(s + _S_TID).value = threading.get_native_id()
            _i32.from_address(s + _S_RANK).value = int(os.environ.get("RANK", os.environ.get("ELASTIC_RANK", "-1")))
            a.store4(s + _S_DEPTH, 0, _RELAXED)
            a.store4(s + _S_DROPPED, 0, _RELAXED)
            for k in range(_SCOPES_PER_SLOT):
                a.store8(s + 64 + 64 * k + _E_GENERATION, 0, _RELAXED)
            b.generation = a.load8(s + _S_GENERATION, _RELAXED)
            a.store8(s + _S_START_TIME, start, _RELEASE)
            hw, cur = seg.base + _H_HIGH_WATER, _u32(0)
            while True:
                cur.value = a.load4(hw, _ACQUIRE)
                if cur.value >= i + 1 or a.cas4(hw, ctypes.addressof(cur), i + 1, _ACQ_REL, _ACQUIRE):
                    break
            b.slot, b.pid, b.views = s, pid, _Views(seg, s)
            return True
        a.add8(seg.base + _H_TABLE_FULL, 1, _RELAXED)
        b.pid, b.retry_after = pid, now + 1.0
        _warn_once("full", f"the watchdog table '{seg.name}' has no free slot: this thread's scopes are not watched "
                           "(start the watchdog with a larger --capacity)")
        return False


_names = {}


def _padded(name):
    """A scope's name as the table holds it: UTF-8, at most 31 bytes, NUL-padded (cached)."""
    raw = _names.get(name)
    if raw is None:
        raw = str(name).encode("utf-8", "replace")[:_NAME_BYTES - 1].ljust(_NAME_BYTES, b"\0")
        if len(_names) < 4096:
            _names[name] = raw
    return raw


def _ring(seg):
    """Wakes the watchdog: a deadline earlier than its next planned look."""
    addr = seg.base + _H_DOORBELL
    _atomic.add4(addr, 1, _RELEASE)
    if _SYS_FUTEX is not None:
        _libc.syscall(ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(addr), ctypes.c_int(_FUTEX_WAKE),
                      ctypes.c_int(2147483647), None, None, ctypes.c_int(0))


_warned = set()
_attached = {}
_attach_lock = threading.Lock()


def _warn_once(key, message):
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, TableFullWarning if key in ("full", "depth") else RuntimeWarning, stacklevel=3)


def _attach(name=None):
    """The table ``name`` (default $ELASTIC_WATCHDOG), mapped once per process; None without one."""
    global _atomic
    name = name if name is not None else os.environ.get("ELASTIC_WATCHDOG")
    if not name:
        _warn_once("unwatched", "ELASTIC_WATCHDOG is not set (not under elastic-run): timer scopes are not enforced")
        return None
    with _attach_lock:
        if name not in _attached:
            if _atomic is None:
                _atomic = _Atomics(_load_libatomic())
            _attached[name] = _Segment(name)
        return _attached[name]


def attach(segment=None):
    """Maps the watchdog's table now (default $ELASTIC_WATCHDOG); raises SegmentError if it cannot."""
    if segment is None and not os.environ.get("ELASTIC_WATCHDOG"):
        raise SegmentError("ELASTIC_WATCHDOG is not set: run under elastic-run, or give the segment's name")
    return _attach(segment) is not None


_default = None


def watched():
    """Whether this process's scopes are enforced by a watchdog."""
    return _client().watched


def _client():
    global _default
    if _default is None:
        _default = TimerClient()
    return _default


class _Expires:
    __slots__ = ("client", "scope", "after", "token")

    def __init__(self, client, scope, after):
        self.client, self.scope, self.after = client, scope, after

    def __enter__(self):
        if isinstance(self.client, TimerClient):
            self.token = self.client.enter(self.scope, self.after)
        else:  # any torch TimerClient
            self.client.acquire(self.scope, time.time() + self.after)
        return self

    def __exit__(self, *exc):
        if isinstance(self.client, TimerClient):
            self.client.leave(self.token)
        else:
            self.client.release(self.scope)
        return False


def expires(after, scope=None, client=None):
    """A scope that must end within ``after`` seconds, or the watchdog ends the worker.

    The same call as torch.distributed.elastic.timer.expires; ``scope`` defaults to the caller's
    file and line (read from the frame, not inspect.stack(), which costs tens of microseconds).
    """
    if scope is None:
        f = sys._getframe(1)
        scope = f"{os.path.basename(f.f_code.co_filename)}#{f.f_lineno}"
    return _Expires(client if client is not None else _client(), scope, after)


ElasticTimerClient = TimerClient  # the name beside torch's LocalTimerClient and FileTimerClient
