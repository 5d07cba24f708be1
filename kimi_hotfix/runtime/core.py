"""The lifecycle: when each patch is decided and applied, and every policy around it.

Loaded only when vLLM is imported (or by ``check`` and the plugin). ``arm()``
parses the environment, imports wrapt and registers one post-import hook per
patch on the vLLM module it targets (wrapt runs the hook at once where that
module is already loaded). The hook *settles* the patch: its module loads
(kimi_hotfix.runtime.registry), then it is decided and applied (kimi_hotfix.runtime.outcome)
through a context bound to it (kimi_hotfix.runtime.wrapping), all or nothing. A target
imported again (a reload, a fresh import) settles again there and then
(kimi_hotfix.runtime.importwatch).

This module owns every policy; kimi_hotfix.runtime.state only stores what it decides:
finishing a settle, undo and its rollback (an undo that lands mid-settle),
wrapper failures, strictness, the summary line (logged when arming ends, on
each change, in every forked child, and at exit where a pending patch turns
``not loaded``) and who is told of a change (``listeners`` get a snapshot:
kimi_hotfix.runtime.metrics), exit and fork. It names no patch.

Containment: an arming, hook, decide or apply failure ends in ``failed`` (with
its reason, logged once) and vLLM's original behaviour stays; the host's import
never fails because of us, unless KIMI_HOTFIX_STRICT=1 asks for a hard failure
(KimiHotfixError) on every one of these paths. No lock is held while a patch's
code runs.
"""

from __future__ import annotations

import time

_IMPORT_STARTED = time.perf_counter()  # importing this module counts as arming

import atexit
import contextlib
import os
import sys
import threading
from dataclasses import replace
from typing import Optional

from kimi_hotfix.runtime import _wrapt, messages, registry, state, versions
from kimi_hotfix.runtime import config as _config_mod
from kimi_hotfix.runtime.base import KimiHotfixError, Kind, State, describe, is_wrapped  # noqa: F401 (API)

for _package in (__package__.split(".")[0], __package__):  # a namespace package: its __init__ is gone
    if getattr(sys.modules.get(_package), "__file__", None) is None:
        raise ImportError(f"{_package.replace('.', '/')}/__init__.py is missing: an incomplete copy "
                          "of the shim")

__version__ = versions.SHIM
# -O parity (kimi_hotfix.runtime.parity): armed here, before any target; no registry patch
O_PARITY = "o_parity"
armed_by = state.armed_by
current_config = state.config
listeners: list = []  # called with a snapshot (no lock held) wherever the line may have changed


def _strict() -> bool:
    cfg = state.config()
    return cfg.strict if cfg is not None else _config_mod.parse(()).strict


def initial_state(name: str, cfg) -> State:
    """The state arming gives ``name``: ``failed`` where its module was loaded
    already and cannot be (the others load when vLLM imports their target)."""
    if not cfg.enabled:  # the value as set, cut and escaped: it ends up in the summary line
        value = _config_mod.printable(os.environ.get("KIMI_HOTFIX") or "")
        return State(Kind.DISABLED, f"KIMI_HOTFIX={value}")
    if name in cfg.disabled:
        return State(Kind.DISABLED, "KIMI_HOTFIX_DISABLE")
    broken = registry.broken(name)
    return State(Kind.FAILED, broken) if broken else State(Kind.PENDING)


# -- arming -----------------------------------------------------------------------


def arm(source: str = "api") -> dict:
    """Read the environment and register the post-import hooks, once per process.
    Returns the states. Raises only in strict mode. Logs one summary line for
    all it did (targets already imported settle at once)."""
    global _IMPORT_STARTED
    started, settled = time.perf_counter(), state.cost().get("settle", 0.0)
    if _IMPORT_STARTED is not None:  # the first arm() counts this module's import too
        started, _IMPORT_STARTED = _IMPORT_STARTED, None
    with batch():
        try:
            _arm(source)
            _install_metrics()
        except KimiHotfixError:
            raise
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            if state.config() is None:  # failed before configuring: states must still say so
                state.configure(_config_mod.Config(), dict.fromkeys(registry.names(), State(Kind.PENDING)))
            messages.setup(state.config().log_level, state.config().log_format)  # the usual prefix
            _fail_pending(f"arming failed: {why}")
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
        cfg = _config_mod.parse(registry.names(), switches=(O_PARITY,))
        state.configure(cfg, {name: initial_state(name, cfg) for name in registry.names()})
        state.put(O_PARITY, initial_state(O_PARITY, cfg))
    messages.setup(cfg.log_level, cfg.log_format)
    for message, args in cfg.warnings:
        messages.emit(message, *args)
    atexit.register(at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=after_fork_in_child)
    _said_broken([n for n, s in state.states().items() if s.kind == Kind.FAILED])
    _arm_parity(cfg)  # before the hooks: vLLM's modules imported from now on load with it
    pending = [n for n in registry.names() if state.get(n).kind == Kind.PENDING]
    if not pending:
        return
    try:
        wrapt = _wrapt.load()
    except ImportError as exc:
        _fail_pending("wrapt is not installed")
        messages.emit(messages.WRAPT_MISSING)
        if cfg.strict:
            raise KimiHotfixError("wrapt is not installed") from exc
        return
    for name in pending:
        target = registry.target(name)
        module = sys.modules.get(target)
        if module is not None and _half_imported(module):
            from kimi_hotfix.runtime import importwatch
            try:
                importwatch.when_imported(module, _after_import(name))
            except (TypeError, AttributeError) as exc:  # a spec that cannot be watched
                _contained_hook_failure(name, exc)
        else:
            wrapt.register_post_import_hook(_hook(name), target)


def _arm_parity(cfg) -> None:
    """-O parity (kimi_hotfix.runtime.parity): under -O, vLLM's modules run plain
    Python's bytecode. Its module loads only under -O."""
    if state.get(O_PARITY).kind != Kind.PENDING:
        return  # disabled
    if not sys.flags.optimize:
        state.put(O_PARITY, State(Kind.NOT_AFFECTED, "python without -O keeps vLLM's asserts"))
        return
    try:
        from kimi_hotfix.runtime import parity
        parity.arm(_parity_changed)
    except Exception as exc:  # contained: the patches go on, vLLM runs with -O's bytecode
        why = describe(exc)
        state.put(O_PARITY, State(Kind.FAILED, f"{why}: vLLM's modules run with -O's bytecode"))
        messages.emit(messages.PARITY_FAILED, why, exc_info=True)
        if cfg.strict:
            raise KimiHotfixError(f"{O_PARITY}: {why}") from exc
        return
    _parity_changed()


def _parity_changed() -> None:
    """Parity's report changed (armed; a module imported before arming got its
    plain code, or could not): its state says so; a module kept at -O's code
    is logged once; strict mode raises."""
    from kimi_hotfix.runtime import parity
    report = parity.report()
    if report is None or report.undone:
        return
    said, text = state.get(O_PARITY), report.text()
    if said == State(Kind.APPLIED, text):
        return
    state.put(O_PARITY, State(Kind.APPLIED, text))
    if report.mode() == "partial" and "partial" not in said.detail.split(":", 1)[0]:
        messages.emit(messages.PARITY_PARTIAL, text)
        if _strict():
            raise KimiHotfixError(f"{O_PARITY}: {text}")
    log_if_changed()


def parity_mode() -> str:
    """Which -O parity is in force in this process (kimi_hotfix.runtime.parity):
    ``package``, ``late``, ``partial``, ``off``, ``plain``, ``failed``, or
    ``pending`` before arming."""
    current = parity_state()
    if current.kind == Kind.APPLIED:
        return current.detail.split(":", 1)[0]
    return {Kind.NOT_AFFECTED: "plain", Kind.DISABLED: "off", Kind.FAILED: "failed"}.get(
        current.kind, "pending")


def _half_imported(module) -> bool:  # importwatch.initializing, not loading it for nothing
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _fail_pending(reason: str) -> None:
    """Every pending patch becomes ``failed: reason``."""
    for name in (O_PARITY, *registry.names()):  # parity's state is stored beside the patches'
        state.update(name, lambda s: State(Kind.FAILED, reason) if s.kind == Kind.PENDING else s)


_metrics_tried = False


def _install_metrics() -> None:
    """The states on vLLM's /metrics (kimi_hotfix.runtime.metrics), told of every
    change. Under KIMI_HOTFIX=0 too: the kill switch shows (``enabled="false"``),
    where no series would look like no shim. Once per process."""
    global _metrics_tried
    cfg = state.config()
    if cfg is None or _metrics_tried:
        return
    _metrics_tried = True  # a later arm() (the plugin after the bootstrap) tries nothing again
    try:
        from kimi_hotfix.runtime import metrics
        if metrics.install(snapshot(), [registry.target(n) for n in registry.names()
                                        if registry.target(n)]):
            _wrapt.load().register_post_import_hook(_serving, metrics.PROMETHEUS)
        listeners.append(metrics.publish)
    except Exception as exc:
        _exporter_failed(f"installing the exporter failed ({describe(exc)})", exc)


def _serving(module) -> None:
    """prometheus_client was imported: the scrape's side of the exporter loads
    (kimi_hotfix.runtime.scrape; contains its own failures, but not its file's)."""
    try:
        from kimi_hotfix.runtime import scrape
    except Exception as exc:
        _exporter_failed(f"loading kimi_hotfix.runtime.scrape failed ({describe(exc)})", exc)
        return
    scrape.on_prometheus_client(module)


def _exporter_failed(why: str, exc: BaseException) -> None:
    """The exporter never takes the patches down with it (logged once per
    failure), but a canary in strict mode learns that the shim is broken."""
    messages.emit(messages.METRICS_FAILED, why, exc_info=True)
    if _strict():
        raise KimiHotfixError(f"metrics: {why}") from exc


def _hook(name: str):
    def kimi_hotfix_hook(module):
        settle(name, module)  # contains its own failures; strict mode raises

    kimi_hotfix_hook.__qualname__ = f"kimi_hotfix_hook[{name}]"
    return kimi_hotfix_hook


def _after_import(name: str):
    """The callback for a target that was half-imported at arming
    (kimi_hotfix.runtime.importwatch): settle once it is imported; if that import
    failed, patch a later, successful one."""

    def finished(module):
        if module is not None:
            settle(name, module)
            return
        try:
            _wrapt.load().register_post_import_hook(_hook(name), registry.target(name))
        except Exception as exc:
            _contained_hook_failure(name, exc)

    return finished


def _contained_hook_failure(name, exc) -> None:
    why = f"{type(exc).__name__}: {exc}"
    state.put(name, State(Kind.FAILED, f"its import hook failed: {why}"))
    messages.emit(messages.HOOK_FAILED, name, why, exc_info=exc)
    log_if_changed()
    if _strict():
        raise KimiHotfixError(f"{name}: its import hook failed: {why}") from exc


# -- settling ---------------------------------------------------------------------


def settle(name: str, module) -> None:
    """Decide and apply ``name`` on ``module``, once (other calls return at once).
    The patch modules, and the settle-only modules, load now."""
    _load_patches()
    token = state.begin(name)
    if token is None:
        return
    started = time.perf_counter()
    try:
        outcome, error = _outcome().decide_and_apply(name, registry.get(name), module,
                                                     context(name, token.records),
                                                     name in state.config().forced, _strict())
        if token.records:  # what it wrapped, re-imported, is settled again there and then
            from kimi_hotfix.runtime import importwatch
            importwatch.watch_reimports(registry.target(name), _reimported)
    except Exception as exc:  # the shim's own code failed (or one of its files): contained
        _uninstall(token.records)
        token.records.clear()
        # a SyntaxError's own text names its file's base name only: describe() the whole path
        why = describe(exc) if isinstance(exc, SyntaxError) else f"{type(exc).__name__}: {exc}"
        outcome = State(Kind.FAILED, f"its import hook failed: {why}")
        messages.emit(messages.HOOK_FAILED, name, why, exc_info=True)
        error = KimiHotfixError(f"{name}: its import hook failed: {why}") if _strict() else None
    finally:  # the parsed vLLM sources served this patch only (a few MB a process)
        recompile = sys.modules.get("kimi_hotfix.runtime.recompile")
        if recompile is not None:
            recompile.forget()
        state.add_cost("settle", time.perf_counter() - started)
    if state.end(name, token, outcome):  # undo() ran while this patch was being applied
        state.put(name, _undone_state(name, _uninstall(token.records)))
    log_if_changed()
    if error is not None:
        raise error


_patches_loaded = False


def _load_patches() -> None:
    """At the first target's import, every patch's module loads: one that cannot
    reads ``failed`` with its cause in every process that imports any target,
    its own or not. A process that imports none (``vllm --version``) loads none."""
    global _patches_loaded
    if _patches_loaded:
        return
    _patches_loaded = True
    try:
        registry.patches()
    except Exception:  # the patch API itself cannot load: settle says so, per patch
        return
    broken = [n for n in registry.names() if registry.broken(n) and state.get(n).kind == Kind.PENDING]
    for name in broken:
        state.put(name, State(Kind.FAILED, registry.broken(name)))
    if broken:
        try:
            _said_broken(broken)
        finally:
            log_if_changed()


def _said_broken(names: list) -> None:
    """Each patch module that cannot load, logged with its cause; strict mode raises."""
    found = {n: registry.broken(n) for n in names if registry.broken(n)}
    for name, why in found.items():
        messages.emit(messages.LOAD_FAILED, name, why)
    if found and _strict():
        raise KimiHotfixError("; ".join(f"{n}: {why}" for n, why in found.items()))


def _uninstall(records: list) -> list:
    """wrapping.uninstall where anything was installed: what it could not restore."""
    wrapping = sys.modules.get("kimi_hotfix.runtime.wrapping")
    return wrapping.uninstall(records) if records and wrapping is not None else []


def _outcome():
    from kimi_hotfix.runtime import outcome  # settle-only: loaded at the first target's import

    return outcome


def context(name: str, records: list):
    """The Context a patch's apply gets: its wraps go to ``records``."""
    from kimi_hotfix.runtime import wrapping
    return wrapping.PatchContext(name, records, _wrapt.load, wrapper_failed, spent)


# -- wrapper failures and first-call costs (a patch's Context reports them) -------------


def wrapper_failed(name: str, exc: BaseException, instead: str) -> None:
    """A patch's own code failed on one call: count it in the state; log the
    first (and the changed summary line); strict mode raises."""
    reason = f"{type(exc).__name__}: {exc}"
    old, _new = state.update(name, lambda s: s.with_failure(reason), State(Kind.APPLIED))
    if old.failures == 0:
        messages.emit(messages.WRAPPER_FAILED, name, reason, instead, exc_info=exc)
        log_if_changed()
    if _strict():
        raise KimiHotfixError(f"{name} wrapper failed: {exc}") from exc


def spent(phase: str, seconds: float) -> None:
    """Seconds a patch's own code spent outside a settle (``first_call``)."""
    state.add_cost(phase, seconds)
    log_if_changed()  # tells the listeners (the cost is on /metrics)


# -- re-imports ------------------------------------------------------------------------


_retired: dict = {}  # name -> records on the objects a re-import replaced


def _reimported(module) -> None:
    """importwatch's callback: ``module`` was just imported again."""
    _settle_reimported([n for n in registry.names()
                        if registry.target(n) == getattr(module, "__name__", None)])


def _settle_reimported(names=None) -> None:
    """An applied patch whose module was reloaded or imported afresh settles
    again on the new objects (what it wrapped before stays wrapped, and is
    undone with the rest), and its state says so: no ``applied`` is stale."""
    for name in registry.names() if names is None else names:
        if state.get(name).kind != Kind.APPLIED:
            continue
        old = state.records(name)
        from kimi_hotfix.runtime import wrapping
        if not old or all(wrapping.reachable(rec) for rec in old):
            continue
        target = registry.target(name)
        try:
            state.put(name, State(Kind.PENDING), records=[])
            with batch():
                module = sys.modules.get(target)
                if module is not None:
                    settle(name, module)
                else:
                    _wrapt.load().register_post_import_hook(_hook(name), target)
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
    """name -> State in this process (before arming, every patch is pending);
    a re-import that no import statement made (a module object put in
    sys.modules by hand) is settled here."""
    if state.config() is None:
        return {name: State(Kind.PENDING) for name in registry.names()}
    _settle_reimported()
    return state.states()


# -- undo and reapply ------------------------------------------------------------------


def _undone_state(name: str, left: list, nothing_here: bool = False) -> State:
    """The state undo() leaves, naming what it could not restore (and logging it)."""
    for rec in left:
        messages.emit(messages.UNDO_INCOMPLETE, name, rec.qualname)
    detail = "undone"
    if nothing_here:
        detail += "; nothing to restore here: another copy of the shim installed it"
    if left:
        detail += f"; could not restore {', '.join(r.qualname for r in left)} (replaced since)"
    return State(Kind.DISABLED, detail, undone=True)


def undo(name: Optional[str] = None) -> dict:
    """Put back vLLM's original methods for one patch (or all): a rollback. A
    patch still pending (or being applied) stays off. The states say what could
    not be restored (something else re-wrapped it since)."""
    if name in (None, O_PARITY):
        _undo_parity()
    for patch_name in [name] if name and name != O_PARITY else list(registry.names()):
        current = state.mark_undone(patch_name, State(Kind.DISABLED, "undone", undone=True))
        if current is None or current.kind != Kind.APPLIED:
            continue
        from kimi_hotfix.runtime import wrapping
        records = state.pop_records(patch_name) + _retired.pop(patch_name, [])
        left = wrapping.uninstall(records)
        state.put(patch_name, _undone_state(patch_name, left, nothing_here=not records))
    log_if_changed()
    return states()


def _undo_parity() -> None:
    """Parity's finder off, the in-place code back; modules it loaded keep plain bytecode."""
    if state.config() is None or state.get(O_PARITY).kind != Kind.APPLIED:
        return
    parity = sys.modules.get("kimi_hotfix.runtime.parity")
    kept = parity.undo() if parity is not None else 0
    detail = "undone"
    if kept:
        detail += f"; {kept} vLLM modules loaded since arming keep plain bytecode (a re-import would not)"
    state.put(O_PARITY, State(Kind.DISABLED, detail, undone=True))


def reapply(name: Optional[str] = None) -> dict:
    """Decide and apply again the patches undo() took out (at once where their
    module is loaded, else when vLLM imports it)."""
    with batch():
        if name in (None, O_PARITY) and state.config() is not None and state.get(O_PARITY).undone:
            state.put(O_PARITY, State(Kind.PENDING))
            _arm_parity(state.config())
        for patch_name in [name] if name and name != O_PARITY else list(registry.names()):
            if state.get(patch_name).undone:
                state.put(patch_name, State(Kind.PENDING))
                module = sys.modules.get(registry.target(patch_name))
                if module is not None:
                    settle(patch_name, module)
    return states()


# -- the summary line, and who is told of a change ---------------------------------------

_logged: Optional[str] = None  # the last summary line logged by this process
_silent = False  # a child forked only to exec another program logs nothing
_batch = threading.local()


def parity_state() -> State:
    """-O parity's state in this process (``pending`` before arming)."""
    return state.get(O_PARITY) if state.config() is not None else State(Kind.PENDING)


def _parity_head() -> str:
    """The summary line's head names the -O parity in force, under -O only (its
    details: ``status``, ``check``, the JSON log's ``o_parity``; a ``partial`` or
    ``failed`` one is also logged as a warning of its own)."""
    return f", -O parity: {parity_mode()}" if sys.flags.optimize else ""


def summary_line() -> str:
    parts = [f"{name}: {current.line_text()}" for name, current in state.states().items()]
    version = versions.vllm_version() or ("version unknown" if "vllm" in sys.modules
                                           else "not installed")
    return (f"kimi-hotfix {__version__} (vllm {version}, "
            f"{versions.python_label()}{_parity_head()}): " + " | ".join(parts))


def _fields() -> dict:
    """The summary line's parts, for the JSON log format."""
    parts = {name: str(current) for name, current in state.states().items()}
    return {"version": __version__, "vllm": versions.vllm_version() or None,
            "python": versions.python_label(), "o_parity": str(parity_state()), "states": parts}


def snapshot() -> dict:
    """What the listeners are told: the states, the costs, who armed, the toggles."""
    cfg = state.config()
    return {"states": state.states(), "cost": state.cost(), "armed_by": state.armed_by(),
            "version": __version__, "enabled": cfg is None or cfg.enabled,
            "pod_files": cfg is None or cfg.pod_files, "o_parity": parity_mode()}


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


def log_if_changed() -> None:
    """Log the summary line if this process has not logged it as it is now, and
    tell the listeners."""
    global _logged
    if state.config() is None or getattr(_batch, "depth", 0) or _silent:
        return
    line = summary_line()
    with state.lock():
        changed, _logged = line != _logged, line
    if changed:
        messages.emit(messages.SUMMARY, line, fields=_fields())
    if listeners:
        told = snapshot()
        for listener in list(listeners):  # each contains its own failures (metrics.publish)
            listener(told)


# -- exit and fork -------------------------------------------------------------------


def at_exit() -> None:
    """Pending patches end ``not loaded``, or ``failed`` where the target was
    imported but the patch never settled (its hook did not run)."""
    settling = state.settling()
    for name in registry.names():
        if name not in settling:
            state.update(name, _ended(registry.target(name)))
    log_if_changed()


def _ended(target: str):
    def change(current: State) -> State:
        if current.kind != Kind.PENDING:
            return current
        if target in sys.modules:
            return State(Kind.FAILED, f"{target} was imported but the patch never ran")
        return State(Kind.NOT_LOADED, f"{target} never imported")

    return change


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
    """A forked child: new locks (the store's, wrapping's, and wrapt's hook lock
    where a thread the child does not have held it); what another thread of
    the parent was installing is rolled back here; the child logs its own
    line, unless it was forked only to exec another program (``forked_to_exec``)."""
    global _logged, _silent
    state.after_fork_in_child()
    wrapping = sys.modules.get("kimi_hotfix.runtime.wrapping")
    if wrapping is not None:
        wrapping.after_fork_in_child()
    _wrapt.after_fork_in_child()
    _silent = forked_to_exec()
    me = threading.get_ident()
    for name, token in state.settling().items():
        if token.thread == me:
            continue  # this thread forked from inside the settle (patch code forking)
        state.drop_settling(name)
        _uninstall(token.records)
        state.put(name, State(Kind.FAILED, "was being applied by another thread when this "
                                           "process forked; rolled back here"))
        if not _silent:
            messages.emit(messages.FORK_INTERRUPTED, name)
    _logged = None
    log_if_changed()
