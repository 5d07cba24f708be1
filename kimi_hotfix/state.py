"""Each patch's state in this process, what is installed, and the summary line.

One lock guards this module's tables, held only for short reads and writes:
no patch code, no import and no logging runs under it (a patch's check and
apply run between ``begin`` and ``finish``, outside it). After a fork, the child
makes a new lock (another thread may have held the parent's), rolls back what
another thread of the parent was installing at that moment, and logs its own
summary line.

The summary line (``kimi-hotfix <version> (vllm <version>, python -O): name:
state | ...``) is logged when arming ends, again whenever it changes (a patch
settles, a wrapper first fails, undo), in every forked child, and at exit when
a pending patch turns ``not loaded``. Wherever the line may have changed,
the ``listeners`` run too (kimi_hotfix.metrics publishes this process's
states and costs for the pod's view on /metrics).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import dataclass, field
from typing import Optional

from kimi_hotfix import __version__, _wrapt, messages, registry, versions, wrapping
from kimi_hotfix.base import KimiHotfixError, Kind, State

_lock = threading.RLock()
_config = None
_states: dict = {}  # name -> State
_records: dict = {}  # name -> [wrapping.Record] installed now
_settling: dict = {}  # name -> Settling
_armed_by: list = []
_logged: Optional[str] = None  # the last summary line logged by this process
_pid = None
_silent = False  # a child forked only to exec another program logs nothing
_cost: dict = {}  # phase -> seconds this process spent in the shim (kimi_hotfix.metrics)
listeners: list = []  # called (no argument, no lock held) wherever the line may have changed


@dataclass
class Settling:
    """A patch being decided and applied (outside the lock) by one thread."""

    thread: int
    records: list = field(default_factory=list)
    undone: bool = False  # undo() came in meanwhile: put back what gets installed


def lock():
    return _lock


def config():
    return _config


def configure(cfg, initial: dict) -> None:
    global _config
    with _lock:
        _config = cfg
        _states.update(initial)


def strict() -> bool:
    return bool(_config is not None and _config.strict)


def get(name: str) -> State:
    with _lock:
        return _states.get(name, State(Kind.PENDING))


def states() -> dict:
    """name -> State; before arming, every patch is pending."""
    with _lock:
        return {name: _states.get(name, State(Kind.PENDING)) for name in registry.names()}


def put(name: str, new: State, records: Optional[list] = None) -> None:
    with _lock:
        _states[name] = new
        if records is not None:
            _records[name] = list(records)


def records(name: str) -> list:
    with _lock:
        return list(_records.get(name, []))


def all_records() -> dict:
    """name -> [wrapping.Record] of what is installed now."""
    with _lock:
        return {name: list(recs) for name, recs in _records.items()}


def pop_records(name: str) -> list:
    with _lock:
        return _records.pop(name, [])


def armed_by() -> list:
    with _lock:
        return list(_armed_by)


def add_cost(phase: str, seconds: float) -> None:
    with _lock:
        _cost[phase] = _cost.get(phase, 0.0) + seconds


def cost() -> dict:
    with _lock:
        return dict(_cost)


def note_armed_by(source: str) -> None:
    with _lock:
        _armed_by.append(source)


def fail_pending(reason: str) -> list:
    """Every pending patch (one with no state yet included) becomes ``failed:
    reason``; returns their names."""
    every = registry.names()  # outside the lock: it may import the patch modules
    with _lock:
        names = [n for n in dict.fromkeys([*every, *_states])
                 if _states.get(n, State(Kind.PENDING)).kind == Kind.PENDING]
        for name in names:
            _states[name] = State(Kind.FAILED, reason)
        return names


# -- settling ---------------------------------------------------------------------


def begin(name: str) -> Optional[Settling]:
    """Claim ``name`` for settling in this thread; None if it is not pending or
    another thread settles it already."""
    with _lock:
        if name in _settling or _states.get(name, State(Kind.DISABLED)).kind != Kind.PENDING:
            return None
        token = _settling[name] = Settling(threading.get_ident())
        return token


def finish(name: str, token: Settling, new: State) -> None:
    """Record the outcome of a settle (its records are ``token.records``)."""
    with _lock:
        if _settling.get(name) is token:
            del _settling[name]
        undone = token.undone
        if not undone:
            _states[name] = new
            _records[name] = list(token.records)
    if undone:  # undo() ran while this patch was being applied
        left = wrapping.uninstall(token.records)
        for rec in left:
            messages.emit(messages.UNDO_INCOMPLETE, name, rec.qualname)
        put(name, undone_state(left))


def mark_undone(name: str) -> Optional[str]:
    """undo() of a patch that is pending or being settled: it stays disabled.
    Returns None, or "installed" when it has records for the caller to restore."""
    with _lock:
        token = _settling.get(name)
        if token is not None:
            token.undone = True
        current = _states.get(name, State(Kind.PENDING))
        if token is not None or current.kind == Kind.PENDING:
            _states[name] = State(Kind.DISABLED, "undone", undone=True)
            return None
        return "installed" if current.kind == Kind.APPLIED else "other"


def undone_state(left: list, nothing_here: bool = False) -> State:
    """The state undo() leaves, naming what it could not restore."""
    detail = "undone"
    if nothing_here:
        detail += "; nothing to restore here: another copy of the shim installed it"
    if left:
        detail += f"; could not restore {', '.join(r.qualname for r in left)} (replaced since)"
    return State(Kind.DISABLED, detail, undone=True)


# -- wrapper failures ---------------------------------------------------------------


def wrapper_failed(name: str, exc: BaseException, instead: str) -> None:
    """A patch's own code failed on one call: count it in the state; log the
    first (and the changed summary line); strict mode raises."""
    reason = f"{type(exc).__name__}: {exc}"
    with _lock:
        current = _states.get(name, State(Kind.APPLIED))
        first = current.failures == 0
        _states[name] = current.with_failure(reason)
    if first:
        messages.emit(messages.WRAPPER_FAILED, name, reason, instead, exc_info=exc)
        log_if_changed()
    if strict():
        raise KimiHotfixError(f"{name} wrapper failed: {exc}") from exc


# -- the summary line ----------------------------------------------------------------


def summary_line() -> str:
    with _lock:
        parts = [f"{name}: {_states.get(name, State(Kind.PENDING)).line_text()}"
                 for name in registry.names()]
    version = versions.vllm_version() or ("version unknown" if "vllm" in sys.modules
                                           else "not installed")
    return (f"kimi-hotfix {__version__} (vllm {version}, "
            f"{versions.python_label()}): " + " | ".join(parts))


_batch = threading.local()


@contextlib.contextmanager
def batch():
    """Changes made in this block, by this thread, are logged as one line at its end."""
    depth = getattr(_batch, "depth", 0)
    _batch.depth = depth + 1
    try:
        yield
    finally:
        _batch.depth = depth
        if not depth:
            log_if_changed()


def _fields() -> dict:
    """The summary line's parts, for the JSON log format."""
    with _lock:
        parts = {name: str(_states.get(name, State(Kind.PENDING))) for name in registry.names()}
    return {"version": __version__, "vllm": versions.vllm_version() or None,
            "python": versions.python_label(), "states": parts}


def log_if_changed() -> None:
    """Log the summary line if this process has not logged it as it is now."""
    global _logged
    if _config is None or getattr(_batch, "depth", 0) or _silent:
        return
    line = summary_line()
    with _lock:
        changed = line != _logged
        _logged = line
    if changed:
        messages.emit(messages.SUMMARY, line, fields=_fields())
    for listener in list(listeners):  # each contains its own failures (metrics.publish)
        listener()


def at_exit() -> None:
    """Pending patches end ``not loaded``, or ``failed`` where the target was
    imported but the patch never settled (its hook did not run)."""
    with _lock:
        for name, current in list(_states.items()):
            if current.kind != Kind.PENDING or name in _settling:
                continue
            target = registry.get(name).target
            _states[name] = (State(Kind.FAILED, f"{target} was imported but the patch never ran")
                             if target in sys.modules else
                             State(Kind.NOT_LOADED, f"{target} never imported"))
    log_if_changed()


def forked_to_exec() -> bool:
    """Is this fork ``subprocess``'s, for a ``preexec_fn`` before an exec? Such
    a child runs the at-fork handlers (Python runs them when a preexec_fn is
    given), then becomes another program: it must not log as a vLLM process."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_execute_child" and code.co_filename.endswith("subprocess.py"):
            return True
        frame = frame.f_back
    return False


def after_fork_in_child() -> None:
    """A forked child: new locks (ours, and wrapt's hook lock where a thread
    the child does not have held it); what another thread of the parent was
    installing is rolled back here; the child logs its own line, unless it
    was forked only to exec another program (``forked_to_exec``)."""
    global _lock, _logged, _silent
    _lock = threading.RLock()
    wrapping.after_fork_in_child()
    _wrapt.after_fork_in_child()
    _silent = forked_to_exec()
    me = threading.get_ident()
    for name, token in list(_settling.items()):
        if token.thread == me:
            continue  # this thread forked from inside the settle (patch code forking)
        del _settling[name]
        wrapping.uninstall(token.records)
        _states[name] = State(Kind.FAILED, "was being applied by another thread when this "
                                           "process forked; rolled back here")
        if not _silent:
            messages.emit(messages.FORK_INTERRUPTED, name)
    _logged = None
    log_if_changed()
