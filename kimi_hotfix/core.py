"""Arming and settling: when and how each patch is decided and applied.

Loaded only when vLLM is imported (or by ``check`` and the plugin). ``arm()``
parses the environment, imports wrapt and registers one post-import hook per
patch on the vLLM module it targets (wrapt runs the hook at once where that
module is already loaded). The hook *settles* the patch: its ``check`` decides
from what the loaded vLLM does or contains, then its ``apply`` wraps vLLM's
methods through a context bound to it (kimi_hotfix.wrapping), all or nothing.
The states live in kimi_hotfix.state; this module names no patch.

Containment: an arming, hook, check or apply failure ends in ``failed`` (with
its reason, logged once) and vLLM's original behaviour stays; the host's import
never fails because of us, unless KIMI_HOTFIX_STRICT=1 asks for a hard failure
(KimiHotfixError) on every one of these paths. A check that cannot tell applies
the patch (the safe side) and warns. No lock is held while a patch's code runs.
"""

from __future__ import annotations

import time

_IMPORT_STARTED = time.perf_counter()  # importing this module counts as arming

import atexit
import contextlib
import os
import sys
from dataclasses import replace
from typing import Optional

from kimi_hotfix import __version__, _wrapt, importwatch, messages, registry, state, wrapping
from kimi_hotfix import config as _config_mod
from kimi_hotfix.base import Decision, KimiHotfixError, Kind, PatchError, State, Verdict, describe
from kimi_hotfix.base import cannot_tell as _cannot_tell
from kimi_hotfix.wrapping import MARKER, is_wrapped  # noqa: F401 (the public surface)

patches = registry.patches
patch_names = registry.names
armed_by = state.armed_by
current_config = state.config


def load_wrapt():
    return _wrapt.load()  # the bundle's private copy, else the top-level wrapt


def _strict() -> bool:
    cfg = state.config()
    return cfg.strict if cfg is not None else _config_mod.parse(()).strict


def initial_state(name: str, cfg) -> State:
    """The state arming gives ``name`` before its module loads (status shows it
    too): ``failed`` where the patch's own module cannot be loaded."""
    if not cfg.enabled:  # the value as set, cut and escaped: it ends up in the summary line
        value = _config_mod.printable(os.environ.get("KIMI_HOTFIX") or "")
        return State(Kind.DISABLED, f"KIMI_HOTFIX={value}")
    if name in cfg.disabled:
        return State(Kind.DISABLED, "KIMI_HOTFIX_DISABLE")
    broken = registry.unloadable().get(name)
    if broken is not None:
        return State(Kind.FAILED, broken.why)
    return State(Kind.PENDING)


# -- arming -----------------------------------------------------------------------


def arm(source: str = "api") -> dict:
    """Read the environment and register the post-import hooks, once per process.
    Returns the states. Raises only in strict mode. Logs one summary line for
    all it did (targets already imported settle at once)."""
    global _IMPORT_STARTED
    started, settled = time.perf_counter(), state.cost().get("settle", 0.0)
    if _IMPORT_STARTED is not None:  # the first arm() counts this module's import too
        started, _IMPORT_STARTED = _IMPORT_STARTED, None
    with state.batch():
        try:
            _arm(source)
            _install_metrics()
        except KimiHotfixError:
            raise
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            if state.config() is None:  # failed before configuring: states must still say so
                state.configure(_config_mod.Config(), {})
            messages.setup(state.config().log_level, state.config().log_format)  # the usual prefix
            state.fail_pending(f"arming failed: {why}")
            messages.emit(messages.ARMING_FAILED, why, exc_info=True)
            if _strict():
                raise KimiHotfixError(f"arming failed: {why}") from exc
        finally:  # the settles it ran count as settling
            state.add_cost("arm", time.perf_counter() - started
                           - (state.cost().get("settle", 0.0) - settled))
    return states()


def _arm(source: str) -> None:
    state.note_armed_by(source)
    with state.lock():
        if state.config() is not None:
            return
        cfg = _config_mod.parse(registry.names())
        state.configure(cfg, {name: initial_state(name, cfg) for name in registry.names()})
    messages.setup(cfg.log_level, cfg.log_format)
    for message, args in cfg.warnings:
        messages.emit(message, *args)
    broken = [name for name, s in states().items()
              if s.kind == Kind.FAILED and name in registry.unloadable()]
    for name in broken:
        messages.emit(messages.LOAD_FAILED, name, registry.get(name).why)
    atexit.register(state.at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=state.after_fork_in_child)
    pending = [n for n, s in states().items() if s.kind == Kind.PENDING]
    if broken and cfg.strict:
        raise KimiHotfixError("; ".join(f"{n}: {registry.get(n).why}" for n in broken))
    if not pending:
        return
    try:
        wrapt = load_wrapt()
    except ImportError as exc:
        state.fail_pending("wrapt is not installed")
        messages.emit(messages.WRAPT_MISSING)
        if cfg.strict:
            raise KimiHotfixError("wrapt is not installed") from exc
        return
    for name in pending:
        target = registry.get(name).target
        module = sys.modules.get(target)
        if module is not None and importwatch.initializing(module):
            try:
                importwatch.when_imported(module, _after_import(name))
            except (TypeError, AttributeError) as exc:  # a spec that cannot be watched
                _contained_hook_failure(name, exc)
        else:
            wrapt.register_post_import_hook(_hook(name), target)


_metrics_tried = False


def _install_metrics() -> None:
    """The states on vLLM's /metrics (kimi_hotfix.metrics): post-import hooks on
    prometheus_client and, after the patches' own hooks, on their targets.
    Imports neither; once per process. Under KIMI_HOTFIX=0 too: the kill
    switch shows (``enabled="false"``), where no series would look like no shim."""
    global _metrics_tried
    cfg = state.config()
    if cfg is None or _metrics_tried:
        return
    _metrics_tried = True  # a later arm() (the plugin after the bootstrap) tries nothing again
    try:
        from kimi_hotfix import metrics

        metrics.install(states, __version__, [p.target for p in registry.patches().values()
                                              if p.target])
    except Exception as exc:  # the exporter never takes the patches down with it...
        why = f"installing the exporter failed ({describe(exc)})"
        messages.emit(messages.METRICS_FAILED, why, exc_info=True)
        if cfg.strict:  # ...but a canary in strict mode learns that the shim is broken
            raise KimiHotfixError(f"metrics: {why}") from exc


def _hook(name: str):
    def kimi_hotfix_hook(module):
        settle(name, module)  # contains its own failures; strict mode raises

    kimi_hotfix_hook.__qualname__ = f"kimi_hotfix_hook[{name}]"
    return kimi_hotfix_hook


def _after_import(name: str):
    """The callback for a target that was half-imported at arming
    (kimi_hotfix.importwatch): settle once it is imported; if that import
    failed, patch a later, successful one."""

    def finished(module):
        if module is not None:
            settle(name, module)
            return
        try:
            load_wrapt().register_post_import_hook(_hook(name), registry.get(name).target)
        except Exception as exc:
            _contained_hook_failure(name, exc)

    return finished


def _contained_hook_failure(name, exc) -> None:
    why = f"{type(exc).__name__}: {exc}"
    state.put(name, State(Kind.FAILED, f"its import hook failed: {why}"))
    messages.emit(messages.HOOK_FAILED, name, why, exc_info=exc)
    state.log_if_changed()
    if _strict():
        raise KimiHotfixError(f"{name}: its import hook failed: {why}") from exc


# -- settling ---------------------------------------------------------------------


def decide(patch, module, optimize: Optional[int] = None) -> Decision:
    """The patch's decision; a check that raises cannot tell (never "not needed"),
    except PatchError: the patch cannot find what it patches."""
    level = sys.flags.optimize if optimize is None else optimize
    try:
        decision = patch.check(module, level)
    except PatchError:
        raise
    except Exception as exc:
        return _cannot_tell(f"its check raised {type(exc).__name__}: {exc}")
    if not isinstance(decision, Decision):
        return _cannot_tell(f"its check returned {decision!r}")
    return decision


def settle(name: str, module) -> None:
    """Decide and apply ``name`` on ``module``, once (other calls return at once)."""
    token = state.begin(name)
    if token is None:
        return
    started = time.perf_counter()
    try:
        outcome, error = _decide_and_apply(name, registry.get(name), module, token.records)
    except Exception as exc:  # the shim's own code failed: contained
        wrapping.uninstall(token.records)
        token.records.clear()
        why = f"{type(exc).__name__}: {exc}"
        outcome = State(Kind.FAILED, f"its import hook failed: {why}")
        messages.emit(messages.HOOK_FAILED, name, why, exc_info=True)
        error = KimiHotfixError(f"{name}: its import hook failed: {why}") if _strict() else None
    finally:  # the parsed vLLM sources served this patch only (a few MB a process)
        recompile = sys.modules.get("kimi_hotfix.recompile")
        if recompile is not None:
            recompile.forget()
        state.add_cost("settle", time.perf_counter() - started)
    state.finish(name, token, outcome)
    state.log_if_changed()
    if error is not None:
        raise error


def _context(name: str, records: list) -> wrapping.PatchContext:
    return wrapping.PatchContext(name, records, load_wrapt, state.wrapper_failed)


def _decide_and_apply(name, patch, module, records) -> tuple:
    """(the new State, a KimiHotfixError to raise in strict mode or None)."""
    strict = _strict()
    try:
        decision = decide(patch, module)
    except PatchError as exc:
        messages.emit(messages.APPLY_FAILED, name, exc)
        return State(Kind.FAILED, str(exc)), (KimiHotfixError(f"{name}: {exc}") if strict else None)
    forced = name in state.config().forced
    if not decision.applies and not forced:
        return State(Kind(decision.verdict.value), decision.reason), None
    unsure = decision.verdict == Verdict.UNKNOWN
    ctx = _context(name, records)
    try:
        note = patch.apply(module, ctx)
    except Exception as exc:
        wrapping.uninstall(records)
        records.clear()
        why = str(exc) if isinstance(exc, PatchError) else f"{type(exc).__name__}: {exc}"
        if unsure:
            messages.emit(messages.UNSURE_FAILED, name, decision.reason, why)
            detail = f"cannot tell whether it is needed ({decision.reason}) and cannot apply ({why})"
        else:
            messages.emit(messages.APPLY_FAILED, name, why,
                          exc_info=None if isinstance(exc, PatchError) else exc)
            detail = why
        return State(Kind.FAILED, detail), (KimiHotfixError(f"{name}: {detail}") if strict else None)
    parts = []
    if unsure:
        messages.emit(messages.UNSURE_APPLIED, name, decision.reason)
        parts.append(f"cannot tell: {decision.reason}; applied to be safe")
    elif forced and not decision.applies:
        parts.append(f"forced; {State(Kind(decision.verdict.value), decision.reason)}")
    if not records and ctx.skipped:
        parts.append("already applied by another copy of the shim")
    if note:
        parts.append(note)
    error = None
    if unsure and strict:
        error = KimiHotfixError(f"{name}: cannot tell whether it is needed: {decision.reason}")
    return State(Kind.APPLIED, "; ".join(parts)), error


# -- re-imports ------------------------------------------------------------------------


def _reachable(rec) -> bool:
    """Does vLLM still reach what the record wrapped: the attribute holds the
    wrapper, and its owner is what its module (in sys.modules) names? False
    after ``importlib.reload`` or a fresh import of the module (new objects)."""
    if not wrapping.holds(rec, rec.wrapper):
        return False
    if isinstance(rec.owner, type(sys)):
        found = sys.modules.get(rec.owner.__name__)
        return found is None or found is rec.owner  # removed, not re-imported yet: still in use
    found = sys.modules.get(rec.owner.__module__)
    if found is None:
        return True
    for part in rec.owner.__qualname__.split("."):
        found = getattr(found, part, None)
    return found is rec.owner


_retired: dict = {}  # name -> records on the objects a re-import replaced


def _settle_reimported() -> None:
    """An applied patch whose module was reloaded or imported afresh settles
    again on the new objects (what it wrapped before stays wrapped, and is
    undone with the rest), and its state says so: no ``applied`` is stale."""
    for name in registry.names():
        if state.get(name).kind != Kind.APPLIED:
            continue
        old = state.records(name)
        if not old or all(_reachable(rec) for rec in old):
            continue
        target = registry.get(name).target
        try:
            state.put(name, State(Kind.PENDING), records=[])
            with state.batch():
                module = sys.modules.get(target)
                if module is not None:
                    settle(name, module)
                else:
                    load_wrapt().register_post_import_hook(_hook(name), target)
                now = state.get(name)
                note = f"settled again: {target} was re-imported"
                if now.kind != Kind.PENDING:
                    now = replace(now, detail="; ".join(filter(None, [now.detail, note])))
                state.put(name, now)
                _retired.setdefault(name, []).extend(old)  # undo() puts them back too
        except KimiHotfixError:
            raise
        except Exception as exc:
            _contained_hook_failure(name, exc)


def states() -> dict:
    """name -> State in this process (a patch whose module was re-imported
    settles again first)."""
    if state.config() is not None:
        _settle_reimported()
    return state.states()


# -- toggling and rollback ------------------------------------------------------------


@contextlib.contextmanager
def toggled(name: str, applied: bool):
    """Within the block, patch ``name`` is applied (whatever its check says) or
    not (vLLM's own methods); afterwards the process is exactly as it was: the
    same objects installed, the same state (where the block changed nothing,
    e.g. on for a patch already applied, the state keeps what happened in it,
    such as wrapper failures). Its module must be loaded. Yields the state
    inside the block. Does not log the summary line."""
    patch = registry.get(name)
    module = sys.modules.get(patch.target)
    if module is None:
        raise PatchError(f"{patch.target} is not imported")
    if state.config() is None:
        arm("toggle")
    saved_state, saved = state.get(name), state.records(name)
    added: list = []
    off: list = []
    try:
        if applied and not saved:
            note = patch.apply(module, _context(name, added))
            state.put(name, State(Kind.APPLIED, "; ".join(filter(None, ["toggled on", note]))))
        elif not applied and saved:
            left = wrapping.uninstall(saved)
            off = [r for r in saved if r not in left]
            if left:
                raise PatchError(f"cannot toggle {name} off: "
                                 f"{', '.join(r.qualname for r in left)} replaced since")
            state.put(name, State(Kind.DISABLED, "toggled off"))
        yield state.get(name)
    finally:
        wrapping.uninstall(added)
        wrapping.reinstall(off)
        if added or off:
            state.put(name, saved_state, records=saved)


def undo(name: Optional[str] = None) -> dict:
    """Put back vLLM's original methods for one patch (or all): a rollback. A
    patch still pending (or being applied) stays off. The states say what could
    not be restored (something else re-wrapped it since)."""
    for patch_name in [name] if name else list(registry.names()):
        if state.mark_undone(patch_name) != "installed":
            continue
        records = state.pop_records(patch_name) + _retired.pop(patch_name, [])
        left = wrapping.uninstall(records)
        for rec in left:
            messages.emit(messages.UNDO_INCOMPLETE, patch_name, rec.qualname)
        state.put(patch_name, state.undone_state(left, nothing_here=not records))
    state.log_if_changed()
    return states()


def reapply(name: Optional[str] = None) -> dict:
    """Decide and apply again the patches undo() took out (at once where their
    module is loaded, else when vLLM imports it)."""
    with state.batch():
        for patch_name in [name] if name else list(registry.names()):
            if state.get(patch_name).undone:
                state.put(patch_name, State(Kind.PENDING))
                module = sys.modules.get(registry.get(patch_name).target)
                if module is not None:
                    settle(patch_name, module)
    return states()
