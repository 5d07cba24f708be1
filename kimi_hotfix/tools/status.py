"""``python -m kimi_hotfix status``: what the shim does in THIS interpreter.

Imports no vLLM, torch or wrapt (package metadata and import specs only): the
interpreter and its flags, the installed vLLM, the toggles, whether the
sitecustomize bootstrap ran here (and which one it chained), the vLLM plugin,
and per patch its state before vLLM loads, how it will decide, and what the
version string alone suggests. Patches supply their own texts.
"""

from __future__ import annotations

import os
import sys

from kimi_hotfix import __version__
from kimi_hotfix.runtime import versions
from kimi_hotfix.runtime.base import Kind, State, describe
from kimi_hotfix.tools import about

PLUGIN_GROUP = "vllm.general_plugins"
PLUGIN_NAME = "kimi_hotfix"
ALIAS = "kimi_hotfix_sitecustomize"  # the root sitecustomize.py registers itself here


def _compiled(package_dir):
    """True if ``package_dir`` holds a ``_wrappers`` extension this interpreter can load."""
    from importlib.machinery import EXTENSION_SUFFIXES

    try:
        names = os.listdir(package_dir)
    except OSError:
        return False
    return any("_wrappers" + suffix in names for suffix in EXTENSION_SUFFIXES)


def _vendored_version():
    """The version in the dist-info pip installed next to the private copy."""
    from kimi_hotfix.runtime._wrapt import VENDOR_DIR

    try:
        infos = sorted(n for n in os.listdir(VENDOR_DIR)
                       if n.startswith("wrapt-") and n.endswith(".dist-info"))
    except OSError:
        return None
    for info in infos:
        try:
            with open(os.path.join(VENDOR_DIR, info, "METADATA"), encoding="utf-8") as f:
                for line in f:
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            continue
    return None


def find_wrapt() -> dict:
    """Which wrapt ``kimi_hotfix.runtime._wrapt.load()`` would return, without importing it:
    ``{"source": "vendored" | "top-level" | None, "module", "path", "version",
    "compiled"}``."""
    from kimi_hotfix.runtime._wrapt import VENDORED, vendored_dir

    vendored = vendored_dir()
    if vendored is not None:
        return {"source": "vendored", "module": VENDORED, "path": vendored,
                "version": _vendored_version(), "compiled": _compiled(vendored)}
    none = {"source": None, "module": None, "path": None, "version": None, "compiled": None}
    spec = versions.find_spec("wrapt")  # a top-level name: imports nothing
    if spec is None:
        return none
    locations = list(spec.submodule_search_locations or [])
    path = locations[0] if locations else (os.path.dirname(spec.origin) if spec.origin else None)
    try:
        from importlib.metadata import version

        dist_version = version("wrapt")
    except Exception:  # no or broken dist-info must not break status
        dist_version = None
    return {"source": "top-level", "module": "wrapt", "path": path,
            "version": dist_version, "compiled": _compiled(path) if path else None}


def _wrapt_info():
    """The wrapt the shim would use (the bundle's private copy, else the
    top-level one), found without importing it."""
    found = find_wrapt()
    return {"installed": found["source"] is not None, "version": found["version"],
            "source": found["source"], "path": found["path"]}


def _plugin_entry(pythonpath_shims=None):
    """The ``vllm.general_plugins`` entry point named kimi_hotfix that vLLM's
    loader would call (the first distribution on sys.path that has one), as
    ``(entry point, its dist-info directory)``; ``(None, None)`` where there is
    none. Searched as a vLLM process started like this one would search: on
    sys.path without this command's own first entry. ``pythonpath_shims``: the
    shim directories such a process has on sys.path (from PYTHONPATH); a
    dist-info in another shim directory is on this interpreter's path only
    (``sys.path.insert``) and is passed over. Raises ``PluginMetadataError``
    where the loader itself would fail: a distribution whose entry_points.txt
    cannot be parsed makes ``importlib.metadata.entry_points()`` raise in vLLM's
    plugin loader too."""
    from importlib import metadata

    try:  # sys.path[0] is this command's own entry (its script's directory, the
        # working directory of -m, the checkout ``python DIR/kimi_hotfix`` puts first)
        dists = list(metadata.distributions(path=sys.path[1:]))
    except Exception:  # a path entry importlib cannot read: vLLM's loader fails the same way
        return None, None
    seen = set()
    for dist in dists:
        try:
            name = getattr(dist, "_normalized_name", None) or (
                dist.metadata["Name"] or "").lower().replace("-", "_")
            eps = dist.entry_points
        except Exception as exc:
            raise PluginMetadataError(_dist_dir(dist), exc) from exc
        home = os.path.dirname(_dist_dir(dist))
        if pythonpath_shims is not None and _is_shim_dir(home) and home not in pythonpath_shims:
            continue
        if name in seen:  # importlib.metadata.entry_points() keeps the first (3.10+)
            continue
        seen.add(name)
        for ep in eps:
            if ep.group == PLUGIN_GROUP and ep.name == PLUGIN_NAME:
                return ep, _dist_dir(dist)
    return None, None


class PluginMetadataError(Exception):
    def __init__(self, where, exc):
        super().__init__(f"{where}: {describe(exc)}")
        self.where, self.cause = where, describe(exc)


def _dist_dir(dist) -> str:
    path = getattr(dist, "_path", None)  # PathDistribution: the dist-info directory
    return os.path.abspath(str(path)) if path is not None else "?"


def _first_sitecustomize():
    """The file of the first ``sitecustomize`` on the path site.py searched."""
    from importlib.machinery import PathFinder

    try:
        spec = PathFinder.find_spec("sitecustomize", sys.path[1:])
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None else None


def _is_shim_dir(path) -> bool:
    return os.path.isfile(os.path.join(path, "sitecustomize.py")) and os.path.isdir(
        os.path.join(path, "kimi_hotfix"))


def _python_info():
    flags = sys.flags
    level = flags.optimize
    info = {
        "executable": sys.executable,
        "version": sys.version.split()[0],
        "implementation": sys.implementation.name,
        "optimize": level,
        "optimize_flag": versions.optimize_flag(level),
        "PYTHONOPTIMIZE": os.environ.get("PYTHONOPTIMIZE"),
        "no_site": bool(flags.no_site),  # -S
        "isolated": bool(flags.isolated),  # -I (implies -E, -s, -P)
        "ignore_environment": bool(flags.ignore_environment),  # -E
    }
    notes = []
    if level:
        notes.append(
            f"optimize level {level}: assert statements are stripped"
            + (" and docstrings too" if level > 1 else "")
            + " (patches decide for it: see the patches)"
        )
    if info["PYTHONOPTIMIZE"] and flags.ignore_environment:
        notes.append("PYTHONOPTIMIZE is set but ignored here (-E/-I)")
    if flags.no_site:
        notes.append(
            "-S: site.py does not run, so no sitecustomize runs at all: the PYTHONPATH "
            "shim cannot load in this interpreter (site-packages is not on sys.path "
            "either; the vLLM plugin can arm it only if vLLM is importable and loads "
            "its plugins)"
        )
    if flags.isolated or flags.ignore_environment:
        which = "-I" if flags.isolated else "-E"
        notes.append(
            f"{which}: PYTHON* variables are ignored, PYTHONPATH included, so the shim "
            "directory is not on sys.path and its sitecustomize cannot load; only the "
            "pip-installed vLLM plugin can arm it (KIMI_HOTFIX_* variables are still read)"
        )
    info["notes"] = notes
    return info


def _shim_info(python):
    site = sys.modules.get(ALIAS)
    pythonpath = [] if python["ignore_environment"] else [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
    ]
    shim_dirs = [os.path.abspath(p) for p in pythonpath if _is_shim_dir(p)]
    other = sys.modules.get("sitecustomize")
    other_file = getattr(other, "__file__", None) if other is not None else None
    ran = []  # every sitecustomize that ran in this interpreter, in order: the first
    # on the path site.py searched (without this command's own sys.path[0]), which may
    # have chained the bootstrap (ddtrace-run's does), then what the bootstrap chained
    if not python["no_site"]:
        ran = [_first_sitecustomize()]
        if site is not None:
            ran += [getattr(site, "LOADED_FROM", None), *(getattr(site, "CHAINED", []) or [])]
        elif other_file:
            ran += [other_file]
    # shadowed: the shim's directory is on PYTHONPATH, but another sitecustomize
    # ran instead of its bootstrap and did not chain it (an APM launcher's)
    shadowed_by = other_file if site is None and shim_dirs and other_file else None
    info = {
        "sitecustomize_loaded": site is not None,
        "loaded_from": getattr(site, "LOADED_FROM", None),
        "chained": list(getattr(site, "CHAINED", []) or []),
        "copies": list(getattr(site, "COPIES", []) or []),  # other copies of the bootstrap, skipped
        "pythonpath_shim_dirs": shim_dirs,
        "sitecustomize_module": other_file,  # the module site.py imported last
        "sitecustomize_ran": list(dict.fromkeys(os.path.abspath(f) for f in ran if f)),
        "shadowed_by": shadowed_by,
    }
    if site is not None:
        why = f"loaded by this interpreter from {info['loaded_from']}"
    elif python["no_site"]:
        why = "not loaded: -S (no sitecustomize runs)"
    elif python["isolated"] or python["ignore_environment"]:
        why = "not loaded: PYTHONPATH is ignored (-I/-E)"
    elif shadowed_by:
        why = (f"SHADOWED: {shim_dirs[0]} is on PYTHONPATH, but {shadowed_by} ran as "
               "sitecustomize instead and does not run the next one (an APM launcher, such "
               "as opentelemetry-instrument, puts its own first)")
    elif shim_dirs:
        why = f"not loaded although {shim_dirs[0]} is on PYTHONPATH"
    else:
        why = "not loaded: the kimi-hotfix directory is not on PYTHONPATH"
    info["why"] = why
    return info


def _plugin_info(shim):
    """The ``vllm.general_plugins`` entry point: pip-installed, or the dist-info
    beside the package in a shim directory on PYTHONPATH (the checkout, the
    bundle). ``shim``: ``_shim_info``'s report."""
    broken = None
    try:
        ep, where = _plugin_entry(shim["pythonpath_shim_dirs"])
    except PluginMetadataError as exc:
        ep, where, broken = None, exc.where, exc.cause
    allowed = os.environ.get("VLLM_PLUGINS")
    home = os.path.dirname(where) if ep is not None else None
    info = {
        "installed": ep is not None,
        "group": PLUGIN_GROUP,
        "name": PLUGIN_NAME,
        "value": getattr(ep, "value", None),
        "dist_info": where,  # the one that cannot be read, where metadata_error
        # "pythonpath": the dist-info beside a shim directory (kimi_hotfix/ and
        # sitecustomize.py); "installed": pip's layout
        "source": None if ep is None else "pythonpath" if _is_shim_dir(home) else "installed",
        "metadata_error": broken,
        "VLLM_PLUGINS": allowed,
    }
    # vLLM loads every plugin when VLLM_PLUGINS is unset, else only those listed.
    allowed_names = None if allowed is None else allowed.split(",")
    info["loads"] = ep is not None and (allowed_names is None or PLUGIN_NAME in allowed_names)
    if broken:
        info["why"] = ("vLLM's plugin loader will raise: the package metadata below cannot "
                       f"be read (importlib.metadata.entry_points() fails: {broken})")
    elif ep is None:
        info["why"] = "not installed (pip install the package to get it)"
    elif not info["loads"]:
        info["why"] = f"installed, but VLLM_PLUGINS={allowed!r} does not list {PLUGIN_NAME}"
    elif info["source"] == "pythonpath":
        info["why"] = ("vLLM's plugin loader arms the shim in the processes that load plugins "
                       "(the API server, engine cores, workers, LLM()) from the dist-info below")
    else:
        info["why"] = "installed: vLLM arms the shim in every process it starts"
    return info


def _arms(cfg, shim, plugin, wrapt, vllm_version, broken=()) -> tuple:
    """(whether the shim arms when vLLM is imported in a process started like
    this interpreter, why): ``status``'s gate and ``check``'s deployment view.
    ``broken``: the shim's own files that cannot load (``_broken``)."""
    via = (["sitecustomize"] if shim["sitecustomize_loaded"] else []) + (
        ["vLLM plugin"] if plugin["loads"] else []
    )
    if broken:
        more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
        return False, (f"BROKEN: the shim's own files: {broken[0]['module']} cannot load "
                       f"({broken[0]['error']}){more}; reinstall or remount the shim")
    if not cfg.enabled:
        return False, "OFF: KIMI_HOTFIX turns the shim off"
    if not via:
        return False, f"INACTIVE: sitecustomize {shim['why']}; no vLLM plugin that loads"
    if not wrapt["installed"]:
        return False, "INACTIVE: wrapt is not installed (pip install wrapt, or use the bundle)"
    if vllm_version is None:
        return False, f"loaded (via {' and '.join(via)}), idle: vLLM is not installed here"
    if via == ["vLLM plugin"]:  # no bootstrap: nothing arms at ``import vllm``
        shadowed = f"; the bootstrap is shadowed by {shim['shadowed_by']}" if shim.get(
            "shadowed_by") else ""
        return True, ("arms when vLLM loads its plugins (via vLLM plugin" + shadowed + "): "
                      "servers, engine cores, workers and LLM() load them; a script that "
                      "only imports vLLM modules runs unpatched")
    return True, f"arms when vLLM is imported (via {' and '.join(via)})"


def deployment() -> dict:
    """``{"active": bool, "reason": str, "enabled": bool}``: would the shim arm
    in a process started like this one (the sitecustomize loaded here, or the
    vLLM plugin)? Not whether something (``check``) armed it here by hand.
    ``enabled``: KIMI_HOTFIX does not turn it off."""
    from kimi_hotfix.runtime import config, registry
    python = _python_info()
    cfg = config.parse(registry.names())
    shim = _shim_info(python)
    active, reason = _arms(cfg, shim, _plugin_info(shim), _wrapt_info(),
                           versions.installed_vllm()[0])
    return {"active": active, "reason": reason, "enabled": cfg.enabled}


# what a vLLM process loads of the shim (at arming, at the targets' imports, at
# prometheus_client's), besides the patch modules
RUNTIME = tuple(f"kimi_hotfix.runtime.{m}" for m in ("core", "metrics", "scrape", "patching", "outcome",
                                                     "wrapping", "importwatch", "parity"))


def _broken(plugin) -> list:
    """The shim's own modules that a vLLM process loads and that do not load
    here, loaded as the shim loads them (imports no vLLM): the core and what it
    imports, the /metrics exporter, each patch module (and what it imports),
    and the plugin's module where the plugin is installed, or the shim's own
    dist-info where vLLM's plugin loader cannot read it.
    [{"module", "error"}]; empty for a healthy install."""
    import importlib

    found = []
    for name in RUNTIME:
        try:
            importlib.import_module(name)
        except Exception as exc:
            found.append({"module": name, "error": describe(exc)})
    registry = sys.modules.get("kimi_hotfix.runtime.registry")
    if registry is not None and "kimi_hotfix.runtime.patching" in sys.modules:
        found += [{"module": p.module, "error": p.error} for p in registry.unloadable().values()]
    if plugin["installed"]:
        module, _, attrs = plugin["value"].partition(":")
        try:
            found_obj = importlib.import_module(module.strip())
            for attr in filter(None, attrs.strip().split(".")):
                found_obj = getattr(found_obj, attr)
        except Exception as exc:
            found.append({"module": plugin["value"], "error": describe(exc)})
    elif plugin["metadata_error"] and os.path.basename(plugin["dist_info"]).startswith(
            "kimi_hotfix-"):  # our own dist-info: vLLM's plugin loader will raise
        found.append({"module": plugin["dist_info"], "error": plugin["metadata_error"]})
    bootstrap = _failed_bootstrap()
    if bootstrap is not None:
        found.insert(0, bootstrap)
    return found


def _tools_broken() -> list:
    """The tools' packages (what status and check load, never a vLLM process)
    whose ``__init__.py`` is gone: Python loads them as namespace packages and
    runs on, so status says so (exit 1) without changing the gate."""
    return [{"module": name, "error": f"{name.replace('.', '/')}/__init__.py is missing: an "
                                      "incomplete copy of the shim"}
            for name, module in list(sys.modules.items())
            if (name == "kimi_hotfix.tools" or name.startswith("kimi_hotfix.tools."))
            and hasattr(module, "__path__") and getattr(module, "__file__", None) is None]


def _failed_bootstrap():
    """The shim's sitecustomize.py on PYTHONPATH where site.py ran, but neither
    it nor any other sitecustomize loaded: it failed at start-up (site.py
    printed "Error in sitecustomize"). None otherwise."""
    flags = sys.flags
    if ALIAS in sys.modules or "sitecustomize" in sys.modules or flags.no_site \
            or flags.ignore_environment:
        return None
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        path = os.path.join(entry, "sitecustomize.py")
        if entry and os.path.isfile(path) and os.path.isdir(os.path.join(entry, "kimi_hotfix")):
            try:
                with open(path, "rb") as f:
                    compile(f.read(), path, "exec")
                error = ("it failed at start-up (site.py printed 'Error in sitecustomize'; "
                         "PYTHONVERBOSE=1 shows its traceback)")
            except (OSError, SyntaxError, ValueError) as exc:
                error = describe(exc)
            return {"module": os.path.abspath(path), "error": error}
    return None


def status_report() -> dict:
    """Everything ``status`` prints. Imports no vLLM, torch or wrapt. Where the
    shim's own files cannot load, the report says which (``broken``), every
    patch they take down reads ``failed``, and ``status`` exits 1."""
    python = _python_info()
    vllm_version, vllm_dist = versions.installed_vllm()
    shim = _shim_info(python)
    plugin = _plugin_info(shim)
    broken = _broken(plugin)
    core, registry, config = (sys.modules.get(f"kimi_hotfix.runtime.{m}")
                              for m in ("core", "registry", "config"))
    names = registry.names() if registry is not None else ()
    cfg = config.parse(names, switches=("o_parity",)) if config is not None else None
    toggles = {
        "enabled": cfg.enabled,
        "disabled": sorted(cfg.disabled),
        "forced": sorted(cfg.forced),
        "strict": cfg.strict,
        "log_level": cfg.log_level,
        "pod_files": cfg.pod_files,
        "set": dict(cfg.raw),
        "warnings": list(cfg.warning_texts),
    } if cfg is not None else {"enabled": None, "disabled": [], "forced": [], "strict": None,
                               "log_level": None, "pod_files": None, "set": {}, "warnings": []}
    wrapt = _wrapt_info()
    patches = []
    usable = registry is not None and "kimi_hotfix.runtime.patching" in sys.modules  # the patch API loads
    parity = None
    if usable:
        try:
            parity = _parity_entry(core, cfg, broken, python["optimize"], vllm_version)
        except Exception as exc:  # its metadata (kimi_hotfix.tools.parity_probe) cannot load
            if not any(b["module"] == "kimi_hotfix.runtime.parity" for b in broken):  # named already
                broken.append({"module": "kimi_hotfix.tools.parity_probe", "error": describe(exc)})
    unreadable = _tools_broken()  # the tools' files only (and about.py below): vLLM still arms
    for name, patch in (registry.patches().items() if usable else ()):
        info = about.of(name)  # what the tools say about it (its about.py)
        if isinstance(info, about.Unknown):
            unreadable.append({"module": f"kimi_hotfix.patches.{name}.about", "error": info.why})
        if core is None:  # nothing can arm: every patch fails with the cause
            first = broken[0]
            state = State(Kind.FAILED, f"the shim cannot arm: {first['module']} cannot load "
                                       f"({first['error']})")
        else:
            state = core.initial_state(name, cfg)
        if state.kind == Kind.PENDING and not wrapt["installed"]:
            state = State(Kind.FAILED, "wrapt is not installed")
        if state.kind != Kind.PENDING:
            decision = str(state)
        elif name in cfg.forced:
            decision = f"forced (KIMI_HOTFIX_FORCE): applied when vLLM imports {patch.target}"
        else:
            decision = f"decided when vLLM imports {patch.target}: {info.decides}"
        needed, why = info.expect(vllm_version, python["optimize"])
        patches.append({
            "name": name, "kind": state.kind.value, "state": str(state), "target": patch.target,
            "wraps": list(patch.wraps), "wraps_note": info.wraps_note,
            "upstream": info.upstream, "fixed_in": info.fixed_in,
            "summary": info.summary, "symptoms": [s for row in info.symptom_rows for s in row],
            "decision": decision,
            "expected_needed": needed,  # an expectation from the version string only
            "expectation": why,
        })
    active, reason = _arms(cfg, shim, plugin, wrapt, vllm_version, broken)
    return {
        "kimi_hotfix": {
            "version": __version__,
            "path": os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        },
        "active": active,  # the gate: False makes ``status`` exit 3
        "active_reason": reason,
        "python": python,
        "vllm": {"installed": vllm_version is not None, "version": vllm_version,
                 "distribution": vllm_dist},
        "wrapt": wrapt,
        "toggles": toggles,
        "shim": shim,
        "plugin": plugin,
        "o_parity": parity,  # -O parity: armed by the shim, not a patch (kimi_hotfix.runtime.parity)
        "patches": patches,
        "broken": broken + unreadable,
    }


def _parity_entry(core, cfg, broken, optimize, vllm_version):
    """-O parity (kimi_hotfix.runtime.parity: armed by core, not a registry patch), as
    the patches are listed (its metadata: kimi_hotfix.tools.parity_probe, which raises
    where it cannot load)."""
    from kimi_hotfix.tools.parity_probe import ABOUT, PROBE

    if core is None:
        first = broken[0]
        state = State(Kind.FAILED, f"the shim cannot arm: {first['module']} cannot load "
                                   f"({first['error']})")
    else:
        state = core.initial_state(PROBE.name, cfg)
        if state.kind == Kind.PENDING and not optimize:
            state = State(Kind.NOT_AFFECTED, "python without -O keeps vLLM's asserts")
    decision = (str(state) if state.kind != Kind.PENDING else
                "when the shim arms (as vLLM is imported): vLLM's modules load with plain "
                "Python's bytecode")
    needed, why = ABOUT.expect(vllm_version, optimize)
    return {"name": PROBE.name, "kind": state.kind.value, "state": str(state),
            "target": PROBE.target, "wraps": [], "wraps_note": "", "upstream": ABOUT.upstream,
            "fixed_in": ABOUT.fixed_in, "summary": ABOUT.summary,
            "symptoms": [s for row in ABOUT.symptom_rows for s in row], "decision": decision,
            "expected_needed": needed, "expectation": why}


def _onoff(value):
    return "yes" if value else "no"


def _flag(value):
    return "?" if value is None else "on" if value else "off"


def print_status(report, out=None):
    out = out or sys.stdout
    w = out.write
    py = report["python"]
    opt = f"optimize {py['optimize']}" + (f" ({py['optimize_flag']})" if py["optimize"] else "")
    popt = py["PYTHONOPTIMIZE"]
    w(f"kimi-hotfix {report['kimi_hotfix']['version']} status ({report['kimi_hotfix']['path']})\n")
    w(f"  active     {report['active_reason']}\n")
    for item in report["broken"]:
        _wrapped(w, "  BROKEN     ", f"{item['module']}: {item['error']}", " " * 13)
    w(f"  python     {py['version']} {py['executable']}, {opt}, "
      f"PYTHONOPTIMIZE={popt if popt is not None else 'unset'}\n")
    w(f"  flags      -S {_onoff(py['no_site'])}   -I {_onoff(py['isolated'])}   "
      f"-E {_onoff(py['ignore_environment'])}\n")
    for note in py["notes"]:
        _wrapped(w, "  note       ", note, " " * 13)
    v = report["vllm"]
    missing = "not found" + (" (-S: site-packages is not on sys.path)" if py["no_site"] else "")
    found = f"{v['version']} (distribution {v['distribution']}; package metadata, not imported)"
    w(f"  vllm       {found if v['installed'] else missing}\n")
    wr = report["wrapt"]
    no_wrapt = "NOT found: the shim cannot wrap anything" + (" (-S)" if py["no_site"] else "")
    private = " (the bundle's private copy; the container's own wrapt is untouched)"
    w(f"  wrapt      {(wr['version'] or 'installed') if wr['installed'] else no_wrapt}"
      f"{private if wr['source'] == 'vendored' else ''}\n")
    shim = report["shim"]
    w(f"  shim       {shim['why']}\n")
    ran = ", ".join(shim["sitecustomize_ran"]) or "none"
    w(f"  site       sitecustomize that ran here: {ran}\n")  # paths: never wrapped
    if shim["sitecustomize_loaded"]:
        chained = ", ".join(shim["chained"]) or "none found later on sys.path"
        w(f"  chained    {chained}\n")
        for copy in shim["copies"]:
            w(f"  copy       {copy} (another copy of the shim's bootstrap: not chained)\n")
    pl = report["plugin"]
    _wrapped(w, "  plugin     ", f"{pl['group']}:{pl['name']} {pl['why']}", " " * 13)
    if pl["dist_info"]:  # a path on a line of its own: the wrap above is the same anywhere
        w(f"{' ' * 13}{pl['dist_info']}\n")
    t = report["toggles"]
    w(f"  toggles    KIMI_HOTFIX={_flag(t['enabled'])}  "
      f"disable={','.join(t['disabled']) or '-'}  force={','.join(t['forced']) or '-'}  "
      f"strict={_flag(t['strict'])}  log={t['log_level'] or '?'}  "
      f"pod-files={_flag(t['pod_files'])}\n")
    for warning in t["warnings"]:
        w(f"  WARNING    {warning}\n")
    if not report["patches"]:
        w("  patches    none can be listed: the shim's own files cannot load (above)\n")
        return
    w("  patches    here: what this interpreter does; expect: from the version string only\n")
    shown = ([report["o_parity"]] if report.get("o_parity") else []) + report["patches"]
    width = max(len(p["name"]) for p in shown)
    pad = " " * (4 + width + 2)
    for p in shown:
        _wrapped(w, f"    {p['name']:<{width}}  ", p["summary"], pad)
        _wrapped(w, f"{pad}state   ", p["state"], pad + " " * 8)
        if p["decision"] != p["state"]:
            _wrapped(w, f"{pad}here    ", p["decision"], pad + " " * 8)
        _wrapped(w, f"{pad}expect  ", p["expectation"], pad + " " * 8)


def _wrapped(w, first, text, indent, width=110):
    import textwrap

    lines = textwrap.wrap(text, width, initial_indent=first, subsequent_indent=indent)
    w("\n".join(lines or [first]) + "\n")
