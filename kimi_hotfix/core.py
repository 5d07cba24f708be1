"""Arming, per-patch state, toggling, undo and the one summary line per process.

Loaded only when vLLM is imported (or by ``check`` and the plugin). ``arm()``
parses the environment, imports wrapt and registers one post-import hook per
patch on the vLLM module it targets (wrapt runs the hook at once where that
module is already loaded). Each hook asks its patch to decide from what the
loaded vLLM does or contains (``Patch.check``), then lets it wrap vLLM's
methods; every wrapper carries a marker, so a second arming (the module re-run,
the vLLM plugin after sitecustomize, a second copy of the package) never wraps
twice, and everything installed is recorded so it can be put back
(kimi_hotfix.wrapping).

Containment: a hook or wrapper error is logged once and vLLM's original
behaviour stays; the host's import never fails because of us, unless
KIMI_HOTFIX_STRICT=1 asks for a hard failure. A check that cannot tell applies
the patch (the safe side) and warns. This module names no patch.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import logging
import os
import sys
import threading

from kimi_hotfix import __version__, _wrapt, base, wrapping
from kimi_hotfix import config as _config_mod
from kimi_hotfix.base import KimiHotfixError, PatchError, State  # noqa: F401 (re-exported)
from kimi_hotfix.patches import PATCH_MODULES

log = logging.getLogger("kimi_hotfix")

MARKER = wrapping.MARKER  # attribute on everything the shim installs


_lock = threading.RLock()
_patches: dict = {}
_config = None
_states: dict = {}  # name -> State
_records: dict = {}  # name -> [wrapping.Record] of what is installed now
_armed_by: list = []
_summary_logged = False
_wrapper_failures: set = set()


def patches() -> dict:
    """name -> Patch, in registry order. Importing them imports no vLLM."""
    if not _patches:
        for modname in PATCH_MODULES:
            module = importlib.import_module(f"kimi_hotfix.patches.{modname}")
            _patches[module.PATCH.name] = module.PATCH
    return _patches


def patch_names() -> tuple:
    return tuple(patches())


def load_wrapt():
    return _wrapt.load()  # the bundle's private copy, else the top-level wrapt


# -- the summary line ---------------------------------------------------------


def summary_line() -> str:
    level = sys.flags.optimize
    parts = [f"{name}: {_states.get(name, 'not armed')}" for name in patches()]
    return (
        f"kimi-hotfix {__version__} (vllm {base.vllm_version() or 'not installed'}, "
        f"{'python -' + 'O' * level if level else 'python'}): " + " | ".join(parts)
    )


def _maybe_log_summary(at_exit: bool = False) -> None:
    global _summary_logged
    with _lock:
        if _summary_logged or _config is None:
            return
        pending = [n for n, s in _states.items() if s.kind == base.PENDING]
        if pending and not at_exit:
            return
        for name in pending:
            _states[name] = State(base.NOT_LOADED, f"{patches()[name].target} never imported")
        _summary_logged = True
        log.info("%s", summary_line())


def _after_fork_in_child() -> None:
    global _summary_logged
    _summary_logged = False
    _maybe_log_summary()


# -- arming -----------------------------------------------------------------


def initial_state(name: str, cfg) -> State:
    """The state arming gives ``name`` before its module loads (status shows it too)."""
    if not cfg.enabled:
        return State(base.DISABLED, f"KIMI_HOTFIX={os.environ.get('KIMI_HOTFIX')}")
    if name in cfg.disabled:
        return State(base.DISABLED, "KIMI_HOTFIX_DISABLE")
    return State(base.PENDING)


def arm(source: str = "api") -> dict:
    """Read the environment and register the post-import hooks, once per process.
    Returns the states. Never raises, except in strict mode."""
    try:
        return _arm(source)
    except KimiHotfixError:
        raise
    except Exception:
        log.warning("kimi-hotfix: arming failed; vLLM runs unpatched", exc_info=True)
        return states()


def _arm(source: str) -> dict:
    global _config
    with _lock:
        _armed_by.append(source)
        if _config is not None:
            return states()
        names = patch_names()
        _config = cfg = _config_mod.parse(names)
        wrapping.setup_logging(log, cfg.log_level)
        for warning in cfg.warnings:
            log.warning("%s", warning)
        _states.update((name, initial_state(name, cfg)) for name in names)
        atexit.register(_maybe_log_summary, True)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
        pending = [n for n in names if _states[n].kind == base.PENDING]
        if pending:
            try:
                wrapt = load_wrapt()
            except ImportError as exc:
                for name in pending:
                    _states[name] = State(base.FAILED, "wrapt is not installed")
                log.warning("wrapt is not installed: kimi-hotfix is inactive "
                            "(pip install wrapt, or use the drop-in bundle)")
                if cfg.strict:
                    raise KimiHotfixError("wrapt is not installed") from exc
                pending = []
            for name in pending:
                target = patches()[name].target
                module = sys.modules.get(target)
                if module is not None and getattr(module.__spec__, "_initializing", False):
                    _settle_when_imported(name, module)
                else:
                    wrapt.register_post_import_hook(_make_hook(name), target)
    _maybe_log_summary()
    return states()


def _settle_when_imported(name: str, module) -> None:
    """``module`` is half-executed: another thread (or this one, further up the
    stack) is importing it. A helper thread, which holds no import lock and so
    cannot deadlock, waits for that import to finish, then settles the patch."""

    def wait():
        importlib._bootstrap._lock_unlock_module(module.__name__)
        if sys.modules.get(module.__name__) is module:
            _make_hook(name)(module)
        else:  # that import failed: patch a later, successful one
            load_wrapt().register_post_import_hook(_make_hook(name), module.__name__)

    threading.Thread(target=wait, name=f"kimi-hotfix-{name}", daemon=True).start()


def _make_hook(name: str):
    def kimi_hotfix_hook(module):
        try:
            _settle(name, module)
        except KimiHotfixError:
            raise  # strict mode: fail the host import on purpose
        except Exception:  # never let our error fail vLLM's import
            log.warning("kimi-hotfix: hook for %s failed; vLLM unchanged", name, exc_info=True)

    kimi_hotfix_hook.__qualname__ = f"kimi_hotfix_hook[{name}]"
    return kimi_hotfix_hook


def decide(patch, module, optimize=None) -> base.Decision:
    """The patch's decision; a check that raises cannot tell (never "not needed"),
    except PatchError: the patch cannot find what it patches."""
    level = sys.flags.optimize if optimize is None else optimize
    try:
        decision = patch.check(module, level)
    except PatchError:
        raise  # the patch's own target is missing: it cannot apply (failed)
    except Exception as exc:
        return base.cannot_tell(f"its check raised {type(exc).__name__}: {exc}")
    if not isinstance(decision, base.Decision):
        return base.cannot_tell(f"its check returned {decision!r}")
    return decision


def _settle(name: str, module) -> None:
    with _lock:
        if _states.get(name, State(base.DISABLED)).kind != base.PENDING:
            return
        try:
            _decide_and_install(name, patches()[name], module)
        finally:  # the parsed vLLM sources served this patch only (a few MB a process)
            recompile = sys.modules.get("kimi_hotfix.recompile")
            if recompile is not None:
                recompile.forget()
    _maybe_log_summary()


def _decide_and_install(name, patch, module) -> None:
    try:
        decision = decide(patch, module)
    except PatchError as exc:
        _fail(name, exc)
        return
    forced = name in _config.forced
    if not decision.applies and not forced:
        _states[name] = State(decision.verdict, decision.reason)
        return
    detail = ""
    if decision.verdict == base.UNKNOWN:
        detail = f"cannot tell: {decision.reason}; applied to be safe"
        log.warning("kimi-hotfix: cannot tell whether %s is needed (%s); applying it to be safe",
                    name, decision.reason)
    elif forced and not decision.applies:
        detail = f"forced; {State(decision.verdict, decision.reason)}"
    _install(name, patch, module, detail)
    if decision.verdict == base.UNKNOWN and _config.strict:
        raise KimiHotfixError(f"{name}: cannot tell whether it is needed: {decision.reason}")


def _install(name, patch, module, detail="") -> None:
    """Apply ``patch`` all or nothing; the state says what happened."""
    records: list = []
    try:
        note = patch.apply(module, wrapping.recorder(name, records, load_wrapt))
    except Exception as exc:
        wrapping.restore(records)
        _fail(name, exc)
        return
    _records[name] = records
    if not records:
        detail = "already patched by another copy of the shim"
    elif note:
        detail = f"{detail}; {note}" if detail else note
    _states[name] = State(base.APPLIED, detail)


def _fail(name, exc) -> None:
    why = str(exc) if isinstance(exc, PatchError) else f"{type(exc).__name__}: {exc}"
    _states[name] = State(base.FAILED, why)
    log.warning("kimi-hotfix: %s could not apply (%s); vLLM unchanged", name, why,
                exc_info=not isinstance(exc, PatchError))
    if _config is not None and _config.strict:
        raise KimiHotfixError(f"{name}: {why}") from exc


def wrapper_failed(name: str, exc: BaseException, instead: str) -> None:
    """For a wrapper whose own code failed: logs once per patch what runs
    ``instead``; strict mode raises."""
    with _lock:
        first = name not in _wrapper_failures
        _wrapper_failures.add(name)
    if first:
        log.warning("kimi-hotfix: %s wrapper failed (%s: %s); %s", name, type(exc).__name__,
                    exc, instead, exc_info=exc)
    if _config is not None and _config.strict:
        raise KimiHotfixError(f"{name} wrapper failed: {exc}") from exc


# -- toggling -----------------------------------------------------------------


@contextlib.contextmanager
def toggled(name: str, applied: bool):
    """Within the block, patch ``name`` is applied (whatever its check says) or
    not (vLLM's own methods); afterwards the process is exactly as it was: the
    same objects installed, the same state. Its module must be loaded. Yields
    the state inside the block."""
    patch = patches()[name]
    module = sys.modules.get(patch.target)
    if module is None:
        raise PatchError(f"{patch.target} is not imported")
    if _config is None:
        arm("toggle")
    with _lock:
        saved_state, saved = _states.get(name), list(_records.get(name, []))
    added: list = []
    try:
        with _lock:
            if applied and not saved:
                _install(name, patch, module, "toggled on")
                added = _records.pop(name, [])
            elif not applied and saved:
                for rec in saved:
                    setattr(rec.owner, rec.attr, rec.original)
                _states[name] = State(base.DISABLED, "toggled off")
            state = _states[name]
        yield state
    finally:
        with _lock:
            wrapping.restore(added)
            for rec in saved:
                setattr(rec.owner, rec.attr, rec.wrapper)
            _records[name] = saved
            _states[name] = saved_state


def undo(name=None) -> dict:
    """Put back vLLM's original methods for one patch (or all): a rollback."""
    with _lock:
        for patch_name in [name] if name else list(_records):
            records = _records.pop(patch_name, [])
            if records:
                wrapping.restore(records)
                _states[patch_name] = State(base.DISABLED, "undone")
        return states()


def reapply(name=None) -> dict:
    """Decide and apply again the patches undo() took out (their module loaded)."""
    for patch_name in [name] if name else list(patches()):
        if _states.get(patch_name) == State(base.DISABLED, "undone"):
            module = sys.modules.get(patches()[patch_name].target)
            if module is not None:
                with _lock:
                    _states[patch_name] = State(base.PENDING)
                _settle(patch_name, module)
    return states()


def states() -> dict:
    """name -> State; before arming, every patch is pending."""
    with _lock:
        return {name: _states.get(name, State(base.PENDING)) for name in patch_names()}


is_wrapped = wrapping.is_wrapped


def armed_by() -> list:
    return list(_armed_by)


def current_config():
    return _config
