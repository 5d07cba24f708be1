"""Which wrapt the shim uses: the bundle's private copy, else the top-level one.

The drop-in bundle (scripts/bundle) carries wrapt inside this package, at
``kimi_hotfix/_vendor/wrapt``, importable only as ``kimi_hotfix._vendor.wrapt``.
It is not on sys.path, so the container's own ``import wrapt`` is unchanged: it
finds the image's wrapt, or fails where the image has none (ddtrace keeps its
wrapt private the same way, under ddtrace/vendor). The pip-installed package and
a git checkout have no ``_vendor`` and use the top-level ``wrapt``, an ordinary
dependency.

The private copy is wrapt 1.x (``VENDORED_REQUIREMENT``): its modules import
each other relatively and its C extension imports nothing by absolute name, so
it works under the private name as it is. (wrapt 2.x's extension imports
``wrapt.exceptions`` absolutely when it initialises, which would load the
container's own wrapt; scripts/bundle checks the private copy for that.)

``load()`` imports and returns the wrapt to use (ImportError when there is
none); ``status`` says which one it would use, importing nothing
(kimi_hotfix.tools.status.find_wrapt).

wrapt's post-import hooks share one lock (``wrapt.importer``), taken by its
finder on every import once a hook is registered (and, in wrapt 1.x, held
while the hooks run). A process forked while another thread held it would
block forever on its next import: ``after_fork_in_child()`` resets it there.
Stdlib only; imported when vLLM is imported (or by ``status``), never at
interpreter start-up.
"""

from __future__ import annotations

import importlib
import os

VENDORED = __name__.split(".")[0] + "._vendor.wrapt"  # kimi_hotfix._vendor.wrapt
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # kimi_hotfix/
VENDOR_DIR = os.path.join(_PACKAGE_DIR, "_vendor")
VENDORED_REQUIREMENT = "wrapt>=1.14,<2"


def vendored_dir():
    path = os.path.join(VENDOR_DIR, "wrapt")
    return path if os.path.isfile(os.path.join(path, "__init__.py")) else None


def load():
    """The wrapt module the shim uses: the private copy when this package has
    one (the bundle), else the top-level ``wrapt``. ImportError when there is
    neither; a private copy that is there but broken raises (never a silent
    switch to a different wrapt than ``status`` reports)."""
    return importlib.import_module(VENDORED if vendored_dir() is not None else "wrapt")


def after_fork_in_child() -> None:
    """A forked child: the post-import hook lock of each wrapt loaded here, if
    a thread the child does not have held it, is reset (in place: wrapt 1.x's
    decorators hold the lock object itself). Not when this thread holds it."""
    import sys

    for name in (VENDORED, "wrapt"):
        lock = getattr(sys.modules.get(name + ".importer"), "_post_import_hooks_lock", None)
        reinit = getattr(lock, "_at_fork_reinit", None)
        if reinit is None or not hasattr(lock, "acquire"):
            continue
        if lock.acquire(blocking=False):  # free, or held by this very thread (an RLock)
            lock.release()
            continue
        reinit()
