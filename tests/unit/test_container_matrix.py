"""The container matrix (issue 36 item 4): the fix stays on whatever bytecode,
write access, optimize level and start a container gives vLLM's code.

The fault tier asks what happens when the shim's own files break; this asks the
same of the container around vLLM. Cells are generated from the tables below,
the full product, and each cell has one expected outcome, computed by
``expected`` from the rules Python itself follows (which ``.pyc`` it runs:
kimi_hotfix.runtime.bytecode) and from what -O parity promises:

- plain Python: vLLM's asserts are live; parity reads ``not affected``;
- under -O (``-O``, ``-OO``, ``PYTHONOPTIMIZE``), armed before vLLM's modules
  run (the bootstrap; a fork, a spawn or an exec of an armed process arms the
  same way): ``applied (package...)``, and the getter raises as plain Python's
  would: the plain ``.pyc`` where Python's rule accepts it, else the source;
- armed late (vLLM's plugin loader, the module already imported): ``applied
  (late...)``, the module's functions given plain code in place, since the
  ``.py`` is the running code's source by Python's rule; except where Python
  ran an unchecked-hash ``.pyc`` of another source (a reproducible build's
  bytecode beside a changed source): that module keeps its ``-O`` code, really
  unpatched, and parity reads ``partial`` naming it;
- where Python may not write bytecode (``PYTHONDONTWRITEBYTECODE``, a tree on a
  read-only mount, as a pod's read-only root), no ``.pyc`` appears: the shim
  writes none either; where it may, parity leaves the plain ``.pyc`` plain
  Python would leave (valid by Python's rule), and nothing else.

The stand-in is the inner-DP getter of ``vllm.distributed.parallel_state``
(asserts; plain Python raises, -O returns None). Its tree, per cell, carries
the bytecode state of the table; one driver interpreter per (optimize,
writability) forks a child per cell (tests/standins/matrix_driver.py). The
whole product runs on the tier's first Python (3.11); on the others, every
bytecode state under -O, started directly (their bytecode formats differ).
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import py_compile
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kimi_hotfix.runtime import bytecode as pyc_rule

from helpers import REPO, STANDINS, hermetic_env

NEW = "inner dp world group is not initialized"
OLD = "inner dp world group is not initialized (as built)"
SOURCE = '''"""Stand-in (shim mechanics only, NOT vLLM): a group getter that guards with assert."""

_INNER_DP_WORLD = None


def get_inner_dp_world_group():
    assert _INNER_DP_WORLD is not None, {message!r}
    return _INNER_DP_WORLD
'''
CHECKED, UNCHECKED, TIMESTAMP = (py_compile.PycInvalidationMode.CHECKED_HASH,
                                 py_compile.PycInvalidationMode.UNCHECKED_HASH,
                                 py_compile.PycInvalidationMode.TIMESTAMP)
# bytecode state -> (levels compiled, invalidation mode, what the source is then)
BYTECODE = {
    "none": ((), TIMESTAMP, "same"),
    "fresh": ((0, 1, 2), TIMESTAMP, "same"),
    "stale-mtime": ((0, 1, 2), TIMESTAMP, "touched"),  # a copy, a layer rebuild: a later mtime
    "stale-size": ((0, 1, 2), TIMESTAMP, "resized"),  # the same mtime, another length
    "precompiled-O": ((1, 2), TIMESTAMP, "same"),  # compileall -o 1 -o 2: no plain .pyc
    "checked-hash": ((0, 1, 2), CHECKED, "same"),
    "unchecked-hash": ((0, 1, 2), UNCHECKED, "same"),
    "unchecked-hash-stale": ((0, 1, 2), UNCHECKED, "changed"),  # built from another source
}
WRITABILITY = ("writable", "dont-write", "read-only")
OPTIMIZE = {"plain": ([], {}), "-O": (["-O"], {}), "-OO": (["-OO"], {}),
            "PYTHONOPTIMIZE": ([], {"PYTHONOPTIMIZE": "1"})}
STARTS = ("direct", "exec", "fork", "spawn", "late")
FULL = sys.version_info[:2] == (3, 11)


def cells():
    if FULL:
        return list(itertools.product(BYTECODE, WRITABILITY, OPTIMIZE, STARTS))
    return [(b, "dont-write", "-O", "direct") for b in BYTECODE]


def expected(bytecode, writability, optimize, start) -> dict:
    """The one outcome of a cell, by Python's rule and parity's promise."""
    ran_built = bytecode == "unchecked-hash-stale"  # Python runs that .pyc, not the source
    plain = f"AssertionError: {OLD if ran_built else NEW}"
    if optimize == "plain":
        return {"o_parity": "not affected", "guard": plain}
    if start == "late":
        if ran_built:  # the .py is not the running code's source: -O's code stays
            return {"o_parity": "applied (partial", "guard": "returned None",
                    "named": "vllm.distributed.parallel_state"}
        return {"o_parity": "applied (late", "guard": plain}
    return {"o_parity": "applied (package", "guard": plain, "loader": "PlainLoader"}


def build(master: Path, bytecode: str) -> None:
    levels, mode, then = BYTECODE[bytecode]
    package = master / "vllm" / "distributed"
    package.mkdir(parents=True)
    for init in (master / "vllm" / "__init__.py", package / "__init__.py"):
        init.write_text("")
    path = package / "parallel_state.py"
    built = OLD if then == "changed" else NEW
    path.write_text(SOURCE.format(message=built) + ("# resized\n" if then == "resized" else ""))
    past = time.time() - 3600
    os.utime(path, (past, past))
    for level in levels:
        py_compile.compile(str(path), doraise=True, optimize=level, invalidation_mode=mode)
    if then in ("resized", "changed"):
        path.write_text(SOURCE.format(message=NEW))
        os.utime(path, (past, past))  # resized: the same mtime, another size
    elif then == "touched":
        os.utime(path, (past + 1800, past + 1800))  # later than the .pyc records, before the run


def pycs(tree: Path) -> set:
    return {str(p.relative_to(tree)) for p in tree.rglob("*.pyc")}


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    masters = {}
    for bytecode in BYTECODE:
        masters[bytecode] = root / "masters" / bytecode
        build(masters[bytecode], bytecode)
    plans, results = {}, {}
    for n, (bytecode, writability, optimize, start) in enumerate(cells()):
        tree = root / ("ro-cells" if writability == "read-only" else "cells") / str(n)
        shutil.copytree(masters[bytecode], tree, copy_function=shutil.copy2)
        work = root / "work" / str(n)
        work.mkdir(parents=True)
        key = (bytecode, writability, optimize, start)
        plans.setdefault((writability, optimize), []).append(
            {"tree": str(tree), "start": start, "result": str(work / "result.json")})
        results[key] = (tree, work, pycs(tree))
    started = time.monotonic()
    cpu_before = os.times()
    for (writability, optimize), plan_cells in plans.items():
        flags, extra = OPTIMIZE[optimize]
        tmp = root / "tmp" / f"{writability}-{optimize}"
        tmp.mkdir(parents=True)
        env = hermetic_env(TMPDIR=str(tmp), **extra)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(STANDINS)])
        if writability == "dont-write":
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        plan = root / f"plan-{writability}-{optimize}.json"
        plan.write_text(json.dumps({"cells": plan_cells, "standins": str(STANDINS)}))
        cmd = [sys.executable, *flags, str(STANDINS / "matrix_driver.py"), str(plan)]
        if writability == "read-only":  # the trees on a read-only mount (the tests run as root)
            ro = str(root / "ro-cells")
            cmd = ["unshare", "--mount", "--", "sh", "-c",
                   'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" && exec "$@"', ro, *cmd]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
    cpu_after = os.times()
    cpu = (cpu_after[2] - cpu_before[2]) + (cpu_after[3] - cpu_before[3])
    print(f"\ncontainer matrix: {len(results)} cells, {len(plans)} driver interpreters, "
          f"{sum(1 for k in results if k[3] in ('exec', 'spawn'))} more (exec and spawn cells); "
          f"{time.monotonic() - started:.1f} s wall, {cpu:.1f} CPU-s")
    out = {}
    for key, (tree, work, before) in results.items():
        result = Path(work / "result.json")
        got = json.loads(result.read_text()) if result.exists() else {"error": "no result"}
        err = Path(str(result) + ".err")
        got["stderr"] = err.read_text() if err.exists() else ""
        got["new_pycs"] = sorted(pycs(tree) - before)
        source = tree / "vllm" / "distributed" / "parallel_state.py"
        got["plain_pyc_valid"] = pyc_rule.cached(str(source), 0).used
        out[key] = got
    return out


@pytest.mark.parametrize("cell", cells(), ids=lambda c: "/".join(c))
def test_cell(matrix, cell):
    got, want = matrix[cell], expected(*cell)
    assert "error" not in got, got
    assert got["guard"] == want["guard"], got
    assert got["o_parity"].startswith(want["o_parity"]), got
    if "named" in want:
        assert want["named"] in got["o_parity"] and "kept -O's code" in got["o_parity"], got
    if "loader" in want:
        assert got["loader"] == want["loader"], got
    bytecode, writability, optimize, start = cell
    if writability != "writable":  # Python may not write: neither does the shim
        assert got["new_pycs"] == [], got
    elif optimize != "plain" and start != "late":  # parity loaded it, as plain Python would
        assert got["plain_pyc_valid"] is True, got
        assert not [p for p in got["new_pycs"] if "parallel_state" in p and "opt-" in p], got
    assert "Traceback" not in got["stderr"], got["stderr"]


def test_the_matrix_is_the_whole_product():
    """Every row of every table is a cell (the first Python: the full product)."""
    if FULL:
        assert len(cells()) == len(BYTECODE) * len(WRITABILITY) * len(OPTIMIZE) * len(STARTS)
    assert {c[0] for c in cells()} == set(BYTECODE)
    assert importlib.util.MAGIC_NUMBER  # the bytecode's own version: each Python builds its trees
