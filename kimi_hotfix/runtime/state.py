"""The store: each patch's state in this process, what is installed, what it cost.

Tables only, no policy (kimi_hotfix.runtime.core decides what is written, when, and
who is told). One lock, held only for short reads and writes: no patch code,
import or logging runs under it (a patch's check and apply run between
``begin`` and ``end``, outside it). Imports only kimi_hotfix.runtime.base and the stdlib.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Optional

from kimi_hotfix.runtime.base import Kind, State

_lock = threading.RLock()
_config = None
_names: tuple = ()  # every patch, in registry order (set by configure)
_states: dict = {}  # name -> State
_records: dict = {}  # name -> [wrapping.Record] installed now
_settling: dict = {}  # name -> Settling
_armed_by: list = []
_cost: dict = {}  # phase -> seconds this process spent in the shim


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
    """The configuration, and the first state of every patch in ``initial``, in
    registry order (a patch named before stays)."""
    global _config, _names
    with _lock:
        _config, _names = cfg, tuple(dict.fromkeys([*_names, *initial]))
        _states.update(initial)


def get(name: str) -> State:
    with _lock:
        return _states.get(name, State(Kind.PENDING))


def states() -> dict:
    """name -> State, in registry order."""
    with _lock:
        return {name: _states.get(name, State(Kind.PENDING)) for name in _names}


def put(name: str, new: State, records: Optional[list] = None) -> None:
    with _lock:
        _states[name] = new
        if records is not None:
            _records[name] = list(records)


def update(name: str, change, default: Optional[State] = None) -> tuple:
    """(old, new): the state replaced by ``change(old)`` in one step (``old``:
    ``default``, else pending, where ``name`` has none yet)."""
    with _lock:
        old = _states.get(name, default or State(Kind.PENDING))
        new = _states[name] = change(old)
        return old, new


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


def note_armed_by(source: str) -> None:
    with _lock:
        _armed_by.append(source)


def add_cost(phase: str, seconds: float) -> None:
    with _lock:
        _cost[phase] = _cost.get(phase, 0.0) + seconds


def cost() -> dict:
    with _lock:
        return dict(_cost)


def begin(name: str) -> Optional[Settling]:
    """Claim ``name`` for settling in this thread; None if it is not pending or
    another thread settles it already."""
    with _lock:
        if name in _settling or _states.get(name, State(Kind.DISABLED)).kind != Kind.PENDING:
            return None
        token = _settling[name] = Settling(threading.get_ident())
        return token


def end(name: str, token: Settling, new: State) -> bool:
    """Release the claim and record ``new`` with ``token.records``, unless undo()
    came in meanwhile; returns ``token.undone``."""
    with _lock:
        if _settling.get(name) is token:
            del _settling[name]
        if not token.undone:
            _states[name] = new
            _records[name] = list(token.records)
        return token.undone


def mark_undone(name: str, undone: State) -> Optional[State]:
    """Put ``undone`` for a patch that is pending or being settled (the settle's
    token is told) and return None; else return its state, unchanged."""
    with _lock:
        token = _settling.get(name)
        if token is not None:
            token.undone = True
        current = _states.get(name, State(Kind.PENDING))
        if token is not None or current.kind == Kind.PENDING:
            _states[name] = undone
            return None
        return current


def settling() -> dict:
    """name -> Settling, for a forked child to roll back."""
    with _lock:
        return dict(_settling)


def drop_settling(name: str) -> None:
    with _lock:
        _settling.pop(name, None)


def after_fork_in_child() -> None:
    """A forked child: a new lock (another thread may have held the parent's)."""
    global _lock
    _lock = threading.RLock()
