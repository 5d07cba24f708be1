"""What the shim installs, and how it puts it back; and its one log handler.

``recorder(name, records, load_wrapt)`` returns the ``wrap`` function a patch's
``apply`` gets: each wrapper or replacement carries ``MARKER`` (so no copy of
the shim wraps twice) and is recorded; ``restore(records)`` puts vLLM's own
objects back, in reverse order, where nothing else replaced them since.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

from kimi_hotfix.base import PatchError

MARKER = "_self_kimi_hotfix_patch"  # attribute on everything the shim installs


@dataclass
class Record:
    owner: object
    attr: str
    original: object  # the raw class/module __dict__ entry
    wrapper: object


def is_wrapped(obj) -> bool:
    return getattr(obj, MARKER, None) is not None


def recorder(name: str, records: list, load_wrapt):
    def wrap(owner, attr: str, wrapper=None, *, replacement=None):
        """Put ``wrapper(wrapped, instance, args, kwargs)`` around ``owner.attr``
        (a ``wrapt.FunctionWrapper``), or install ``replacement``, a function
        standing in for the original (hot paths, where a wrapper's extra frame
        costs too much). Either is marked and recorded; the replacement's
        ``__wrapped__`` is the original."""
        if attr not in vars(owner):
            raise PatchError(f"{getattr(owner, '__qualname__', owner)}.{attr} is not defined there")
        original = vars(owner)[attr]
        if getattr(original, MARKER, None) is not None:
            return None  # wrapped already, by this or another copy of the shim
        if (wrapper is None) == (replacement is None):
            raise PatchError("wrap() takes a wrapper or a replacement")
        if replacement is None:
            proxy = load_wrapt().FunctionWrapper(original, wrapper)
        else:
            proxy = replacement
            proxy.__wrapped__ = original
        setattr(proxy, MARKER, name)
        setattr(owner, attr, proxy)
        records.append(Record(owner, attr, original, proxy))
        return proxy

    return wrap


def restore(records: list) -> None:
    for rec in reversed(records):
        if vars(rec.owner).get(rec.attr) is rec.wrapper:
            setattr(rec.owner, rec.attr, rec.original)
    records.clear()


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at emit time."""

    def __init__(self):
        logging.Handler.__init__(self)

    @property
    def stream(self):
        return sys.stderr


def setup_logging(log, level: str) -> None:
    """One handler on the ``kimi_hotfix`` logger, not propagated to the host's."""
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        handler = _StderrHandler()
        handler.setFormatter(
            logging.Formatter("%(asctime)s kimi-hotfix[%(process)d] %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(getattr(logging, level, logging.INFO))
