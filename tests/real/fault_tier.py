"""The fault tier, generated from the tree (issue 20: "a fault in the shim never
takes vLLM down"). Stdlib only: the driver (fault_child.py) imports it inside
the interpreters it runs, the tests and scripts/docs outside.

Cases. For every file of the shim (``sitecustomize.py`` and every ``.py`` under
``kimi_hotfix/`` but the bundle's private wrapt under ``_vendor/``, third-party
code) that a process loads, each fault of ``FAULTS`` in a copy of the deployed
tree (hard links to a compiled master, the faulted file replaced):

  missing  the file and its bytecode removed (an ``__init__.py``: the package
           becomes a namespace package, as in an incomplete copy)
  syntax   a line that does not compile appended
  raise    ``raise RuntimeError("kimi-hotfix fault injected: <file> ...")``
           inserted before the module's first statement of its own

"Loads" is measured, not listed: the driver first runs each mode healthy and
records which files of the tree a vLLM process loaded and which files
``python -m kimi_hotfix status`` loaded; a file either loads is a case. So a
new module is covered without a new test, and a file neither loads (the
probes, the audit, ``check``) is reported as such.

Modes (how the tree is deployed): ``pythonpath`` (the checkout on PYTHONPATH,
its sitecustomize run as site.py runs it), ``bundle`` (scripts/bundle's
directory, with its private wrapt and checked-hash bytecode) and ``plugin``
(``pip install``'s layout, armed by vLLM's own ``load_general_plugins()``).

Targets and cost (``plan``). Each case is a fork of a driver that loaded what
does not depend on the case (the stdlib, wrapt; for vLLM, its dependencies),
so a case costs the imports of the shim and of vLLM's own modules, not an
interpreter and torch:

- ``standin``: the stand-in vLLM (the "complete" tree, tests/standins/vllm_tree.py): through
  ``pythonpath`` in plain Python every file x every fault, and strict mode for
  one fault per file; otherwise (``pythonpath`` under -O, the ``bundle`` with
  its bytecode and private wrapt, plain and -O) one fault per file, rotating,
  and strict mode for another fault on every other file. The breadth: the
  shim's containment is its own, whatever vLLM is (the package holds no
  assert, so -O changes none of its paths).
- ``real``: vLLM 0.29.0, plain and -O. Through the ``plugin``, under -O one
  fault per file, rotating, and strict mode for another on every other file;
  in plain Python every other file, strict on every other of those (that
  driver imports the cheap targets only): only the real vLLM has the plugin
  loader, and a plugin case imports no vLLM module (the driver imported vLLM
  before forking). Under -O, through ``pythonpath``
  and the ``bundle``, every third file, alternating mode, rotating the fault,
  strict on every other: such a case imports vLLM's own modules (about 0.3 s;
  the targets whose import is cheap: the KV-cache interface, VllmConfig,
  parallel_state), after its driver loaded vLLM's dependencies once (as the
  plain driver measured them; about 6 s).

``python -m kimi_hotfix status`` runs in every non-strict case of the plain
drivers (its report does not depend on the optimize level).
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

FAULTS = ("missing", "syntax", "raise")
MODES = ("pythonpath", "bundle", "plugin")
MARK = "kimi-hotfix fault injected"
# the file each mode's host loads itself, before any shim code runs (its
# errors are the host's to report: site.py, vLLM's plugin loader)
ENTRY = {"pythonpath": ("sitecustomize.py",), "bundle": ("sitecustomize.py",),
         "plugin": ("kimi_hotfix/__init__.py", "kimi_hotfix/plugin.py")}
SKIPPED_DIRS = ("kimi_hotfix/_vendor/",)
# what ``python -m kimi_hotfix`` runs before any code of status can report:
# where one cannot run, Python's own error (naming it) is all there is
STATUS_ENTRY = ("kimi_hotfix/__init__.py", "kimi_hotfix/__main__.py")
# files whose absence the shim allows by design: a patch that is one module has
# no covers.py (kimi_hotfix/tools/audit/reviewed.py); missing, nothing is broken
OPTIONAL = re.compile(r"kimi_hotfix/patches/[^/]+/covers\.py$")


# -- the file list and the faults ------------------------------------------------


def shim_files(tree) -> list:
    """Every file of the shim in a deployed tree, relative, sorted."""
    tree = Path(tree)
    files = [p.relative_to(tree).as_posix() for p in (tree / "kimi_hotfix").rglob("*.py")]
    files = [f for f in files if "__pycache__" not in f and not f.startswith(SKIPPED_DIRS)]
    if (tree / "sitecustomize.py").is_file():
        files.append("sitecustomize.py")
    return sorted(files)


def dotted(rel: str) -> str:
    parts = rel[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def signatures(rel: str) -> tuple:
    """Patterns that name the cause of a fault in ``rel``: its module, its
    path, or Python's "cannot import name 'metrics' from 'kimi_hotfix'"."""
    parent, _, last = dotted(rel).rpartition(".")
    return (re.escape(dotted(rel)) + r"(?![\w.])", re.escape(rel) + r"(?![\w.])",
            rf"cannot import name '{re.escape(last)}' from [^()]*'{re.escape(parent)}'")


def names_cause(text: str, rel: str) -> bool:
    return any(re.search(pattern, text) for pattern in signatures(rel))


def link_tree(master, dest, rel=None) -> None:
    """A copy of ``master`` to fault ``rel`` in, cheaply: symbolic links to
    the master's entries, except along ``rel``'s path, whose directories (and
    their ``__pycache__``) are real and hold links to each other entry. Python
    names the files by the path it found them through (``dest``); it writes
    bytecode only for the file the fault rewrites, in a real directory of
    ``dest``: the master is never written."""
    master, dest = Path(master), Path(dest)
    along = Path(rel).parts[:-1] if rel else ()
    here, there = master, dest
    for depth in range(len(along) + 1):
        there.mkdir(parents=True, exist_ok=True)
        keep = along[depth] if depth < len(along) else None
        for entry in here.iterdir():
            if entry.name == keep:
                continue
            if entry.name == "__pycache__" and keep is None:
                (there / "__pycache__").mkdir()
                for pyc in entry.iterdir():
                    (there / "__pycache__" / pyc.name).symlink_to(pyc)
                continue
            (there / entry.name).symlink_to(entry)
        if keep is None:
            break
        here, there = here / keep, there / keep


def _bytecode(path: Path) -> list:
    cache = path.parent / "__pycache__"
    return sorted(cache.glob(path.stem + ".*.pyc")) if cache.is_dir() else []


def raise_at_import(source: str, rel: str) -> str:
    """``source`` with a raise before its first statement of its own (after the
    docstring and ``from __future__`` imports, which must come first)."""
    body = ast.parse(source).body
    first = next((node for i, node in enumerate(body)
                  if not (i == 0 and isinstance(node, ast.Expr)
                          and isinstance(node.value, ast.Constant))
                  and not (isinstance(node, ast.ImportFrom) and node.module == "__future__")),
                 None)
    lines = source.splitlines(keepends=True)
    at = first.lineno - 1 if first is not None else len(lines)
    line = f'raise RuntimeError("{MARK}: {rel} raises at import")\n'
    return "".join(lines[:at] + [line] + lines[at:])


def inject(tree, rel: str, fault: str) -> None:
    """Fault ``rel`` in a tree made by ``link_tree(master, tree, rel)``."""
    path = Path(tree) / rel
    source = path.read_text()
    for pyc in _bytecode(path):
        pyc.unlink()  # a link: the master's bytecode stays
    path.unlink()
    if fault == "missing":
        return
    if fault == "syntax":
        source += f"\n)(  # {MARK}: a syntax error\n"
    elif fault == "raise":
        source = raise_at_import(source, rel)
    else:
        raise ValueError(fault)
    path.write_text(source)


# -- which cases run where -----------------------------------------------------------


def case_id(mode, rel, fault, strict):
    return f"{mode}:{rel}:{fault}" + (":strict" if strict else "")


def plan(target: str, opt: str, mode: str, files: list) -> list:
    """[(rel, fault, strict)] for one driver: ``files`` are those a process
    loaded in that mode (vLLM or status). See the module docstring."""
    shift = 0 if opt == "plain" else 1
    cases = []
    for i, rel in enumerate(files):
        rotating = FAULTS[(i + shift) % len(FAULTS)]
        other = i % 2 == 1
        if target == "standin" and mode == "pythonpath" and opt == "plain":
            cases += [(rel, fault, False) for fault in FAULTS] + [(rel, rotating, True)]
        elif target == "standin" or (mode == "plugin" and opt == "O"):
            cases.append((rel, rotating, False))
            if other:
                cases.append((rel, FAULTS[(i + shift + 1) % len(FAULTS)], True))
        elif mode == "plugin" and i % 2 == 0:  # real, plain: every other file
            cases.append((rel, rotating, i % 4 == 2))
        elif opt == "O" and i % 3 == 0 and (i // 3) % 2 == (mode == "bundle"):
            cases.append((rel, rotating, (i // 6) % 2 == 1))  # real PYTHONPATH and bundle
    return cases


def plan_text(target: str) -> str:
    """The plan in words, for docs/fault-matrix.md (markdown)."""
    doc = __doc__.split("Targets and cost (``plan``).")[1]
    item = doc.split(f"- ``{target}``:")[1].split("\n- ``")[0].split("\n\n")[0]
    return " ".join(item.split()).replace("``", "`")


# -- what a case must show -------------------------------------------------------------

WARNING = re.compile(r"kimi-hotfix\[\d+\] (WARNING|ERROR) ")


def outcome(case: dict, baseline: dict) -> str:
    """How the shim met the fault, from the case's own run (the tests check that
    each outcome is a true one): ``unused`` the vLLM process did not load the
    file; ``absent`` the bootstrap is gone, so no shim at all; ``host`` the
    host loads the file itself and reported the error (site.py, vLLM's plugin
    loader); ``inactive`` the core could not load: one INACTIVE line; ``contained``
    the core runs: each patch reads as in the healthy run or ``failed`` with
    the cause."""
    rel, mode = case["rel"], case["mode"]
    if rel not in baseline["loaded"]:
        return "unused"
    if rel == "sitecustomize.py" and case["fault"] == "missing":
        return "absent"
    if rel in ENTRY[mode] and case["states"] is None and "inactive: cannot load" not in case["stderr"]:
        return "host"
    if case["states"] is None:
        return "inactive"
    return "contained"


def problems(case: dict, baseline: dict, status: bool = True) -> list:
    """What is wrong with one non-strict case, against the healthy run of the
    same mode: [] when vLLM imports and works, every state is true, the cause
    is logged (or, where the host loads the file, reported by the host), and
    ``status`` reports it and exits non-zero."""
    rel, found = case["rel"], []
    how = outcome(case, baseline)
    if case["import_error"]:
        found.append(f"vLLM's import failed: {case['import_error']}")
    if case["works"] != baseline["works"]:
        found.append(f"vLLM does not work as in the healthy run: {case['works']} != {baseline['works']}")
    warnings = [line for line in case["stderr"].splitlines() if WARNING.search(line)]
    if how == "unused":
        if case["states"] != baseline["states"]:
            found.append(f"states changed by a file the process never loaded: {case['states']}")
        if warnings:
            found.append(f"lines logged for a file the process never loaded: {warnings}")
    elif how == "absent":
        if case["states"] is not None or warnings:
            found.append("the bootstrap is gone, yet the shim ran")
    elif how == "host":  # (vLLM logs to stdout)
        if not names_cause(case["stderr"] + case.get("stdout", ""), rel):
            found.append("the host's error does not name the cause")
        if case["states"] is not None:
            found.append("the host could not load the shim, yet it has states")
    elif how == "inactive":
        inactive = [line for line in warnings if "inactive: cannot load kimi_hotfix.runtime.core" in line]
        if len(inactive) != 1 or not names_cause(inactive[0], rel):
            found.append(f"not one INACTIVE line naming the cause: {inactive}")
    else:
        failed = 0
        for name, text in case["states"].items():
            if text == baseline["states"].get(name):
                continue
            if text.startswith("failed: ") and names_cause(text, rel):
                failed += 1
                continue
            found.append(f"{name} reads {text!r} (healthy: {baseline['states'].get(name)!r})")
        named = [line for line in warnings if names_cause(line, rel)]
        if not named:
            found.append("no line names the cause")
        if not failed and not named:
            found.append("nothing says a shim file is broken")
    if status:
        found += status_problems(case, how)
    return found


def status_problems(case: dict, how: str) -> list:
    status, rel = case.get("status"), case["rel"]
    if status is None:
        return ["status did not run"]
    found = []
    if case["fault"] == "missing" and OPTIONAL.match(rel):
        # the same gate as without the fault: 0 (arms), 3 where the stand-in vLLM is not installed
        ok = status["rc"] in (0, 3) and "BROKEN" not in status["stdout"]
        return [] if ok else [f"status fails without an optional file: {status}"]
    if how == "absent":  # no bootstrap: status says the shim is not on PYTHONPATH
        if "not loaded" not in status["stdout"]:
            found.append(f"status does not say the bootstrap is not loaded:\n{status['stdout']}")
        return found  # its exit code is issue 21's gate (INACTIVE)
    if rel in STATUS_ENTRY and status["rc"] != 0 and names_cause(status["stderr"], rel) \
            and not status["stdout"]:
        return found  # python -m runs these before any status code: Python's own error
    if status["rc"] != 1:
        found.append(f"status exits {status['rc']}, not 1 (the shim's own files are broken)")
    if not names_cause(status["stdout"], rel):
        found.append(f"status does not name the cause:\n{status['stdout'][-1500:]}")
    if "Traceback" in status["stderr"]:
        found.append(f"status crashed:\n{status['stderr'][-1500:]}")
    return found


def strict_problems(case: dict, baseline: dict) -> list:
    """A strict case: the host's import (or vLLM's plugin loading) raised, with
    the cause, except where no shim code ran (``absent``, ``host``)."""
    how = outcome(case, baseline)
    error = case["import_error"] or ""
    if how in ("absent", "host", "unused"):
        return [f"raised although no shim code could: {error}"] if error else []
    if not error:
        return ["strict mode: the import did not raise"]
    if not names_cause(error + case.get("import_traceback", ""), rel=case["rel"]):
        return [f"strict mode raised without the cause: {error}"]
    return []


# -- the deployed trees ----------------------------------------------------------------


def build_masters(repo: Path, python: str, root: Path, modes) -> dict:
    """{mode: a compiled tree as that mode deploys it}, built with ``python``
    (its bytecode, plain and -O, is what every case's hard links share)."""
    import shutil
    import subprocess

    version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KIMI_HOTFIX", "PYTHON"))}
    env["PIP_ROOT_USER_ACTION"] = "ignore"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_vendor")
    masters = {}
    for mode in modes:
        dest = root / mode
        if mode == "pythonpath":
            shutil.copytree(repo / "kimi_hotfix", dest / "kimi_hotfix", ignore=ignore)
            shutil.copy2(repo / "sitecustomize.py", dest / "sitecustomize.py")
        elif mode == "bundle":
            out = subprocess.run([python, str(repo / "scripts" / "bundle"), "--python-version",
                                  version, "--interpreter", python, "--no-tarball", "--out",
                                  str(root / "bundles")], env=env, capture_output=True,
                                 text=True)
            if out.returncode != 0:
                raise RuntimeError(f"scripts/bundle failed:\n{out.stderr[-3000:]}")
            dest = Path(out.stdout.split()[-1])
        elif mode == "plugin":
            src = root / "plugin-src"
            shutil.copytree(repo, src, ignore=shutil.ignore_patterns(
                ".git", "tests", "bench", "docs", "upstream", "locks", "__pycache__", "build",
                "*.egg-info", "bundle*", "_vendor"))
            out = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps",
                                  "--no-build-isolation", "--no-index", "--target", str(dest),
                                  str(src)], env=env, capture_output=True, text=True)
            if out.returncode != 0:
                raise RuntimeError(f"pip install --target failed:\n{out.stderr[-3000:]}")
        subprocess.run([python, "-m", "compileall", "-q", "-o", "0", "-o", "1", str(dest)],
                       env=env, capture_output=True, check=True)
        masters[mode] = str(dest)
    return masters


# -- docs/fault-matrix.md ---------------------------------------------------------------

BEGIN, END = "<!-- fault-tier -->", "<!-- /fault-tier -->"
SHOWN = {"unused": "status only: not loaded by vLLM processes", "absent": "no shim: no bootstrap",
         "host": "the host reports it ({host}); vLLM unpatched",
         "inactive": "INACTIVE line; every patch off", "contained": "{failed}"}
HOSTS = {"pythonpath": "site.py", "bundle": "site.py", "plugin": "vLLM's plugin loader"}


def _cell(cases) -> str:
    texts: dict = {}
    for case in cases:
        healthy = case["_baselines"][case["mode"]]
        how = outcome(case, healthy)
        failed = sorted(n for n, t in (case["states"] or {}).items()
                        if t.startswith("failed") and t != healthy["states"].get(n))
        text = SHOWN[how].format(host=HOSTS[case["mode"]], failed=(
            "failed: " + ", ".join(failed) if failed else "patches unaffected; a line names it"))
        texts.setdefault(text, set()).add(case["fault"])
    return "<br>".join(f"{text} ({', '.join(f for f in FAULTS if f in faults)})"
                       for text, faults in sorted(texts.items()))


def render_matrix(runs: list) -> str:
    """The generated part of docs/fault-matrix.md, from the drivers' results."""
    lines = ["The fault tier (`tests/real/test_fault_tier.py`, generated from the tree by",
             "`tests/real/fault_tier.py`): each file of the shim that a process loads, made",
             "missing, given a syntax error, made to raise at import. In every case vLLM",
             "imports and works, each state is the healthy one or `failed` with the cause,",
             "a line names the cause, `status` names it and exits 1, strict mode raises",
             "(except where the host loads the file before any shim code runs). Where:", ""]
    for target in ("standin", "real"):
        lines.append(f"- **{target}**: {plan_text(target)}")
    lines += ["", "`python -m kimi_hotfix status` runs in every non-strict case of the plain "
              "drivers (its report does not depend on the optimize level)."]
    counts = ", ".join(f"{r['target']} {'-O' if r['opt'] == 'O' else 'plain'}: "
                       f"{len(r['cases'])}" for r in runs)
    lines += ["", f"Cases per driver: {counts}; {sum(len(r['cases']) for r in runs)} in all.",
              "", "| file | PYTHONPATH | bundle | plugin |", "|---|---|---|---|"]
    by_file: dict = {}
    for run in runs:
        for case in run["cases"]:
            if not case["strict"]:
                by_file.setdefault(case["rel"], {}).setdefault(case["mode"], []).append(
                    dict(case, _baselines=run["baselines"]))
    for rel in sorted(by_file):
        cells = []
        for mode in MODES:
            cases = by_file[rel].get(mode, [])
            cells.append(_cell(cases) if cases else "-")
        lines.append(f"| `{rel}` | " + " | ".join(cells) + " |")
    every = sorted(set().union(*(set(f["all"]) for r in runs for f in r["files"].values())))
    never = [rel for rel in every if rel not in by_file]
    lines += ["", "Not loaded by a vLLM process nor by `status` (no case: a fault there cannot "
              "reach either): " + ", ".join(f"`{rel}`" for rel in never) + ".", ""]
    return "\n".join(lines)


def render_into(text: str, runs: list) -> str:
    head, _, rest = text.partition(BEGIN + "\n")
    _, _, tail = rest.partition(END)
    return head + BEGIN + "\n" + render_matrix(runs) + END + tail


# -- running the drivers -------------------------------------------------------------------

DRIVERS = (("real", "plain"), ("standin", "plain"), ("real", "O"), ("standin", "O"))
DRIVER_MODES = {("standin", "plain"): ("pythonpath", "bundle"),
                ("standin", "O"): ("pythonpath", "bundle"),
                ("real", "plain"): ("plugin",),
                ("real", "O"): ("pythonpath", "bundle", "plugin")}


def run_driver(python: str, masters: dict, target: str, opt: str, work, standin, env,
               deps=None) -> dict:
    """One driver (fault_child.py) in ``python``: its result. ``deps``: vLLM's
    dependencies, as another driver measured them (saves a vLLM import)."""
    import json
    import subprocess

    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    config = {"target": target, "opt": opt, "masters": masters, "work": str(work),
              "standin": str(standin), "modes": list(DRIVER_MODES[target, opt]),
              "out": str(work / "result.json"), "deps": deps,
              "standins": str(Path(__file__).resolve().parents[1] / "standins"),
              "fork_safety": (target, opt) == ("real", "O")}
    (work / "config.json").write_text(json.dumps(config))
    flags = ["-O"] if opt == "O" else []
    driver = Path(__file__).resolve().parent / "fault_child.py"
    proc = subprocess.run([python, *flags, str(driver), str(work / "config.json")], env=env,
                          cwd=str(work), capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0 or not (work / "result.json").exists():
        raise RuntimeError(f"the fault driver {target} {opt} exited {proc.returncode}:\n"
                           f"{proc.stderr[-6000:]}")
    return json.loads((work / "result.json").read_text())
