"""kimi-hotfix bootstrap (see README.md). Runs in every Python process that has
this directory on PYTHONPATH, most of which never import vLLM, so it does almost
nothing: it puts a small finder in front of sys.meta_path that waits for
``import vllm`` (and leaves sys.meta_path once it has fired), and then chains
the container's own sitecustomize (the next one on sys.path), which still runs
exactly once. When vLLM is imported, just before
its ``__init__`` runs, ``kimi_hotfix.runtime.core.arm()`` reads the environment, imports
wrapt and registers post-import hooks on the vLLM modules it patches.
Stdlib only, no imports here: containers often run without bytecode caches, so
this file may be compiled at every start, so it is kept short (bench/startup.py).
"""
import sys

ALIAS = "kimi_hotfix_sitecustomize"  # where status finds this module
LOADED_FROM = __file__
CHAINED = []  # origins of the sitecustomize modules chained from here
COPIES = []  # origins of other copies of this bootstrap found on the way, not run as theirs
ARMED = False
SEARCHING = False
# kimi_hotfix.runtime.messages.INACTIVE and FORMAT: the one line logged when the package
# cannot load, with the prefix every line of the shim has
INACTIVE = "kimi-hotfix inactive: cannot load kimi_hotfix.runtime.core (%s); vLLM runs unpatched"
FORMAT = "%(asctime)s kimi-hotfix[%(process)d] %(levelname)s %(message)s"


class VllmImportTrigger:
    """Finds nothing itself. For ``vllm`` it asks the finders after it and wraps
    the loader, so the shim arms when vLLM is really imported, not when a library
    merely asks ``importlib.util.find_spec("vllm")``."""

    __slots__ = ()

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "vllm" or ARMED or SEARCHING:
            return None
        return find_vllm(self, path, target)

    def invalidate_caches(self):
        pass


class ArmingLoader:
    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        fire()  # before vllm/__init__ runs, so hooks see its submodule imports
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)


def find_vllm(trigger, path, target):
    global SEARCHING
    SEARCHING = True
    try:
        for finder in [f for f in sys.meta_path if f is not trigger]:
            find = getattr(finder, "find_spec", None)
            spec = find and find("vllm", path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = ArmingLoader(spec.loader)
                return spec
    finally:
        SEARCHING = False


def fire():
    global ARMED
    if ARMED:
        return
    ARMED = True
    retire()
    try:
        from kimi_hotfix.runtime import core
    except Exception as exc:  # a broken install must not break vLLM's import...
        if inactive(exc):
            raise  # ...unless strict mode asks for a hard failure
        return
    core.arm("sitecustomize")  # contains its own failures; strict mode raises


def inactive(exc):
    """Log INACTIVE as kimi_hotfix.runtime.messages would (FORMAT, stderr, the level
    KIMI_HOTFIX_LOG_LEVEL allows), without it: it may be what is broken.
    Returns True in strict mode (the caller raises). sitecustomize.py and
    kimi_hotfix/plugin.py each hold this function (tests/unit/test_registry.py
    keeps them equal): each entry point may be the only one present."""
    import logging
    import os

    level = os.environ.get("KIMI_HOTFIX_LOG_LEVEL", "").strip().upper()
    if level not in ("ERROR", "CRITICAL"):
        log = logging.getLogger("kimi_hotfix")
        record = log.makeRecord(log.name, logging.WARNING, __file__, 0, INACTIVE, (repr(exc),), None)
        sys.stderr.write(logging.Formatter(FORMAT).format(record) + "\n")
        sys.stderr.flush()
    return os.environ.get("KIMI_HOTFIX_STRICT", "").strip().lower() in ("1", "on", "true", "yes")


def retire():
    """Once armed the trigger finds nothing, but the import system would still
    ask it about every later import (bench/apply_cost.py): take it off
    sys.meta_path. By a new list, not in place: another thread may be walking
    the old one in an import, and a removal under its iterator skips a finder."""
    meta_path = sys.meta_path
    rest = [f for f in meta_path if not isinstance(f, VllmImportTrigger)]
    if len(rest) != len(meta_path):
        sys.meta_path = rest


def chain():
    """Run the container's own sitecustomize: the next one on sys.path after
    this directory that is not a copy of this bootstrap. A copy (the same file
    through a symlink, the bundle beside a checkout) is known by what it is,
    not where it is: run with ALIAS taken it does nothing and registers
    nothing (the guard at the end of this file), and it carries ALIAS; then
    the search goes on past it."""
    import os

    external = sys.modules.get("_frozen_importlib_external")  # no importlib.util:
    bootstrap = sys.modules.get("_frozen_importlib")  # it costs ms to import
    if external is None or bootstrap is None:
        import importlib._bootstrap as bootstrap
        import importlib._bootstrap_external as external
    here = os.path.dirname(os.path.abspath(__file__))
    entries = [os.path.abspath(e or os.curdir) for e in sys.path]
    rest = entries[entries.index(here) + 1 :] if here in entries else entries
    for entry in dict.fromkeys(e for e in rest if e != here):
        spec = external.PathFinder.find_spec("sitecustomize", [entry])
        if spec is None or spec.loader is None:
            continue
        module = bootstrap.module_from_spec(spec)
        sys.modules["sitecustomize"] = module  # ``import sitecustomize`` names theirs
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules["sitecustomize"] = sys.modules[ALIAS]
            raise  # site.py reports it exactly as it would without us
        if getattr(module, "ALIAS", None) == ALIAS and sys.modules[ALIAS] is not module:
            sys.modules["sitecustomize"] = sys.modules[ALIAS]
            COPIES.append(spec.origin)  # another copy of this bootstrap: not the container's
            continue
        CHAINED.append(spec.origin)
        return


if ALIAS not in sys.modules:  # a second run of this file changes nothing
    sys.modules[ALIAS] = sys.modules[__name__]
    if "vllm" in sys.modules:
        fire()
    elif not any(type(f).__name__ == "VllmImportTrigger" for f in sys.meta_path):
        sys.meta_path.insert(0, VllmImportTrigger())
    chain()
