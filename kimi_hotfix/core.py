"""Arming, the patch registry, per-patch state, wrapping and undo.

Loaded only when vLLM is imported (or by the CLI / plugin). ``arm()`` parses the
environment, imports wrapt and registers one wrapt post-import hook per patch on
the exact vLLM module the patch targets; wrapt runs the hook at once when that
module is already loaded. Each hook decides, from what the installed vLLM does or
contains, whether its patch is needed, then wraps vLLM's methods with
``wrapt.FunctionWrapper`` objects that carry a marker, so a second arming (the
module re-run, the vLLM plugin after sitecustomize, a second copy of the
package) never wraps twice.

Failure containment: a hook or wrapper error is logged once and vLLM's original
behaviour stays in place; the host's import never fails because of us, unless
KIMI_HOTFIX_STRICT=1 asks for a hard failure. One summary line per process names
every patch and its state; it is logged as soon as no patch waits for its module,
or at exit for modules the process never imported.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import re
import sys
import threading
from dataclasses import dataclass

from kimi_hotfix import __version__
from kimi_hotfix import config as _config_mod
from kimi_hotfix.patches import PATCH_MODULES

log = logging.getLogger("kimi_hotfix")

MARKER = "_self_kimi_hotfix_patch"  # attribute on our wrapt wrappers

PENDING = "pending"
APPLIED = "applied"
NOT_NEEDED = "not needed: upstream fixed"
DISABLED = "disabled"
FAILED = "failed"
UNDONE = "undone"


class KimiHotfixError(RuntimeError):
    """Raised only in strict mode, when a patch that should apply cannot."""


class PatchError(Exception):
    """A patch cannot apply to the installed vLLM; the message says why."""


class Patch:
    """One hotfix. Subclasses live one per module under kimi_hotfix.patches."""

    name = ""
    target = ""  # module whose import triggers the patch
    wraps: tuple = ()  # qualified names wrapped inside ``target``
    upstream = ""  # upstream PR / issue
    fixed_in = ""  # first vLLM release that carries the fix
    summary = ""  # what the patch changes, one line
    decides = ""  # how it decides it is (no longer) needed, one line

    def check(self, module) -> tuple[bool, str]:
        """Return (needed, reason) for the loaded ``module``."""
        raise NotImplementedError

    def apply(self, module, wrap):
        """Wrap vLLM's methods with ``wrap(owner, attr, wrapper)`` (or
        ``wrap(owner, attr, replacement=function)``). May return a short note
        for the state (e.g. which way it applied); None for plain "applied"."""
        raise NotImplementedError

    def version_fallback(self, what: str) -> tuple[bool, str]:
        """Decide from the version string alone, when code cannot tell."""
        version = vllm_version()
        if version is None:
            return True, f"{what}; vLLM version unknown, assuming needed"
        fixed = version_at_least(version, self.fixed_in)
        return (not fixed), f"{what}; by version {version} vs fixed in {self.fixed_in}"


@dataclass
class _Record:
    owner: object
    attr: str
    original: object  # the raw class/module __dict__ entry
    wrapper: object


_lock = threading.RLock()
_patches: dict = {}
_config = None
_states: dict = {}
_records: dict = {}
_armed_by: list = []
_hooks_registered = False
_summary_logged = False
_wrapper_failures: set = set()
_log_handler = None
_forced_at_runtime: set = set()  # core.force(): preflight applies unneeded patches


def patches() -> dict:
    """name -> Patch, in a fixed order. Importing them imports no vLLM."""
    if not _patches:
        for modname in PATCH_MODULES:
            module = importlib.import_module(f"kimi_hotfix.patches.{modname}")
            _patches[module.PATCH.name] = module.PATCH
    return _patches


def patch_names() -> tuple:
    return tuple(patches())


# -- versions ---------------------------------------------------------------

_VERSION_RE = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?(.*)$")


def parse_version(text: str):
    """(major, minor, micro, is_prerelease) or None. 0.29.1.dev3+gabc is a
    pre-release of 0.29.1, i.e. older than 0.29.1 and than 0.30.0."""
    match = _VERSION_RE.match(text or "")
    if not match:
        return None
    major, minor, micro, rest = match.groups()
    pre = bool(re.match(r"^[.\-_]?(dev|rc|a|b|alpha|beta|pre)", rest or ""))
    return int(major), int(minor), int(micro or 0), pre


def version_at_least(version: str, release: str) -> bool:
    have, want = parse_version(version), parse_version(release)
    if have is None or want is None:
        return False
    if have[:3] != want[:3]:
        return have[:3] > want[:3]
    return not have[3]


def vllm_version():
    module = sys.modules.get("vllm")
    version = getattr(module, "__version__", None)
    if isinstance(version, str) and version:
        return version
    try:
        from importlib.metadata import PackageNotFoundError, version as dist_version
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    try:
        return dist_version("vllm")
    except PackageNotFoundError:
        return None
    except Exception:
        return None


# -- logging ----------------------------------------------------------------


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at emit time."""

    def __init__(self):
        logging.Handler.__init__(self)

    @property
    def stream(self):
        return sys.stderr


def _setup_logging(level: str) -> None:
    global _log_handler
    if _log_handler is None:
        _log_handler = _StderrHandler()
        _log_handler.setFormatter(
            logging.Formatter("%(asctime)s kimi-hotfix[%(process)d] %(levelname)s %(message)s")
        )
        log.addHandler(_log_handler)
        log.propagate = False
    log.setLevel(getattr(logging, level, logging.INFO))


def _optimize_label() -> str:
    level = sys.flags.optimize
    return "python" if level == 0 else "python -" + "O" * level


def summary_line() -> str:
    parts = [f"{name}: {_states.get(name, 'not armed')}" for name in patches()]
    return (
        f"kimi-hotfix {__version__} (vllm {vllm_version() or 'not installed'}, "
        f"{_optimize_label()}): " + " | ".join(parts)
    )


def _maybe_log_summary(at_exit: bool = False) -> None:
    global _summary_logged
    with _lock:
        if _summary_logged or _config is None:
            return
        if not at_exit and any(s == PENDING for s in _states.values()):
            return
        if at_exit:
            for name, state in _states.items():
                if state == PENDING:
                    _states[name] = f"not loaded ({patches()[name].target} never imported)"
        _summary_logged = True
        log.info("%s", summary_line())


def _after_fork_in_child() -> None:
    global _summary_logged
    _summary_logged = False
    _maybe_log_summary()


# -- arming -----------------------------------------------------------------


def arm(source: str = "api") -> dict:
    """Read the environment and register the post-import hooks, once per process.

    Returns the current states. Never raises, except in strict mode.
    """
    try:
        return _arm(source)
    except KimiHotfixError:
        raise
    except Exception:
        log.warning("kimi-hotfix: arming failed; vLLM runs unpatched", exc_info=True)
        return dict(_states)


def _arm(source: str) -> dict:
    global _config, _hooks_registered
    with _lock:
        _armed_by.append(source)
        if _config is not None:
            return dict(_states)
        names = patch_names()
        cfg = _config_mod.parse(names)
        _config = cfg
        _setup_logging(cfg.log_level)
        for warning in cfg.warnings:
            log.warning("%s", warning)
        for name in names:
            if not cfg.enabled:
                _states[name] = f"{DISABLED} (KIMI_HOTFIX={os.environ.get('KIMI_HOTFIX')})"
            elif name in cfg.disabled:
                _states[name] = f"{DISABLED} (KIMI_HOTFIX_DISABLE)"
            else:
                _states[name] = PENDING
        atexit.register(_maybe_log_summary, True)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_after_fork_in_child)
        pending = [n for n in names if _states[n] == PENDING]
        if pending:
            try:
                import wrapt
            except ImportError as exc:
                for name in pending:
                    _states[name] = f"{FAILED}: wrapt is not installed"
                log.warning(
                    "wrapt is not installed: kimi-hotfix is inactive "
                    "(pip install wrapt, or use the drop-in bundle)"
                )
                if cfg.strict:
                    raise KimiHotfixError("wrapt is not installed") from exc
                _maybe_log_summary()
                return dict(_states)
            _hooks_registered = True
            for name in pending:
                target = patches()[name].target
                module = sys.modules.get(target)
                if module is not None and getattr(module.__spec__, "_initializing", False):
                    _settle_when_imported(name, module)
                else:
                    wrapt.register_post_import_hook(_make_hook(name), target)
        _maybe_log_summary()
        return dict(_states)


def _settle_when_imported(name: str, module) -> None:
    """``module`` is half-executed: another thread is importing it right now (it
    got there while vllm/__init__ ran, before the hooks existed), or this thread
    is, further up the stack. wrapt would run the hook on it at once; instead a
    helper thread, which holds no import lock and so cannot deadlock, waits for
    that import to finish (its module lock), then settles the patch."""

    def wait():
        importlib._bootstrap._lock_unlock_module(module.__name__)
        if sys.modules.get(module.__name__) is module:
            _make_hook(name)(module)
        else:  # that import failed: patch a later, successful one
            import wrapt

            wrapt.register_post_import_hook(_make_hook(name), module.__name__)

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


def _settle(name: str, module) -> None:
    with _lock:
        if _states.get(name) not in (PENDING, UNDONE):
            return
        patch = patches()[name]
        forced = name in _config.forced or name in _forced_at_runtime
        try:
            needed, reason = patch.check(module)
        except Exception as exc:
            needed, reason = patch.version_fallback(f"probe failed ({type(exc).__name__}: {exc})")
        if not needed and not forced:
            _states[name] = f"{NOT_NEEDED} ({reason})"
        else:
            records: list = []
            try:
                note = patch.apply(module, _recorder(name, records))
            except Exception as exc:
                _restore(records)
                why = str(exc) if isinstance(exc, PatchError) else f"{type(exc).__name__}: {exc}"
                _states[name] = f"{FAILED}: {why}"
                log.warning(
                    "kimi-hotfix: %s could not apply (%s); vLLM unchanged",
                    name,
                    why,
                    exc_info=not isinstance(exc, PatchError),
                )
                if _config.strict:
                    raise KimiHotfixError(f"{name}: {why}") from exc
            else:
                _records[name] = records
                state = APPLIED
                if not records:
                    state += " (already wrapped by another arming)"
                elif not needed:
                    state += f" (forced; {reason})"
                if note and records:
                    state += f" ({note})"
                _states[name] = state
    _maybe_log_summary()


def _recorder(name: str, records: list):
    import wrapt

    def wrap(owner, attr: str, wrapper=None, *, replacement=None):
        """Put ``wrapper(wrapped, instance, args, kwargs)`` around ``owner.attr``
        (a ``wrapt.FunctionWrapper``), or install ``replacement``, a function
        standing in for the original (per-step hot paths, where a wrapper's
        extra frame costs too much). Either is marked and recorded for undo;
        the replacement's ``__wrapped__`` is the original."""
        if attr not in vars(owner):
            raise PatchError(f"{getattr(owner, '__qualname__', owner)}.{attr} is not defined there")
        original = vars(owner)[attr]
        if getattr(original, MARKER, None) is not None:
            return None  # wrapped already, by this or another copy of the shim
        if (wrapper is None) == (replacement is None):
            raise PatchError("wrap() takes a wrapper or a replacement")
        if replacement is None:
            proxy = wrapt.FunctionWrapper(original, wrapper)
        else:
            proxy = replacement
            proxy.__wrapped__ = original
        setattr(proxy, MARKER, name)
        setattr(owner, attr, proxy)
        records.append(_Record(owner, attr, original, proxy))
        return proxy

    return wrap


def _restore(records: list) -> None:
    for rec in reversed(records):
        if vars(rec.owner).get(rec.attr) is rec.wrapper:
            setattr(rec.owner, rec.attr, rec.original)
    records.clear()


def wrapper_failed(name: str, exc: BaseException) -> None:
    """Called by a wrapper whose own code failed; logs once per patch."""
    with _lock:
        first = name not in _wrapper_failures
        _wrapper_failures.add(name)
    if first:
        log.warning(
            "kimi-hotfix: %s wrapper failed (%s: %s); vLLM's original behaviour is used",
            name,
            type(exc).__name__,
            exc,
            exc_info=exc,
        )
    if _config is not None and _config.strict:
        raise KimiHotfixError(f"{name} wrapper failed: {exc}") from exc


def undo(name=None) -> dict:
    """Restore vLLM's original methods for one patch (or all)."""
    with _lock:
        for patch_name in [name] if name else list(_records):
            records = _records.pop(patch_name, [])
            _restore(records)
            if patch_name in _states and _states[patch_name].startswith(APPLIED):
                _states[patch_name] = UNDONE
        return dict(_states)


def reset(name: str, state: str) -> str:
    """Undo ``name`` and put back an earlier ``state`` string (and forget a
    runtime ``force``): for a caller that toggled a patch the shim had not
    applied (``check``) and must leave the process as it found it."""
    with _lock:
        _restore(_records.pop(name, []))
        _forced_at_runtime.discard(name)
        if name in _states:
            _states[name] = state
        return _states.get(name, state)


def reapply(name=None) -> dict:
    """Apply again, after undo, the patches whose module is loaded."""
    for patch_name in [name] if name else list(patches()):
        if _states.get(patch_name) == UNDONE:
            module = sys.modules.get(patches()[patch_name].target)
            if module is not None:
                _settle(patch_name, module)
    return dict(_states)


def force(name: str) -> str:
    """Apply ``name`` now even where vLLM looks fixed (``check --with``); its
    module must be loaded. Returns the new state."""
    with _lock:
        if _config is None:
            arm("force")
        _forced_at_runtime.add(name)
        if _states.get(name, "").startswith(APPLIED):
            return _states[name]
        _states[name] = UNDONE
    module = sys.modules.get(patches()[name].target)
    if module is not None:
        _settle(name, module)
    return _states[name]


def states() -> dict:
    with _lock:
        if _config is None:
            return {name: "not armed" for name in patch_names()}
        return dict(_states)


def is_wrapped(obj) -> bool:
    return getattr(obj, MARKER, None) is not None


def armed_by() -> list:
    return list(_armed_by)


def current_config():
    return _config
