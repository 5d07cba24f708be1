"""Why a thread's import of an existing module can fail with ModuleNotFoundError,
shim or no shim (issue 30 item 10).

The real tier once saw ``No module named 'vllm.utils.gpu_sync_debug'`` in one of
three threads importing vLLM modules at once. The cause is not the shim:

- CPython's ``importlib._bootstrap._find_spec`` walks the live ``sys.meta_path``
  list, one finder at a time (3.9 to 3.13.0; CPython gh-130094, PR #130101, walks
  a copy since 3.14, backported to 3.13 by PR #155915; 3.11 and 3.12 keep the
  live walk);
- setuptools' ``_distutils_hack.ensure_local_distutils``, run by the first
  ``import setuptools`` of a process (vLLM 0.29.0: ``cudagraph_utils`` ->
  ``breakable_cudagraph`` -> ``pynccl_allocator`` -> ``torch.utils.cpp_extension``),
  does ``sys.meta_path.insert(0, DISTUTILS_FINDER)`` ... ``sys.meta_path.remove
  (DISTUTILS_FINDER)`` in place. The removal shifts every later finder down by
  one: a walk in another thread that stands on the finder before ``PathFinder``
  (``FrozenImporter``) at that moment steps past ``PathFinder``, no finder finds
  the module, and that thread's import fails. The shim's finder (wrapt's) is
  neither the mutator nor needed for it.

Made deterministic here, with stand-ins and no vLLM: thread B's walk is parked
(``sys.settrace``) on the finder before ``PathFinder`` while the main thread
runs setuptools' two lines; the same failure with and without the shim armed,
none without the two lines, none with ``_find_spec`` walking a copy (what
gh-130094 does). The real vLLM and setuptools, by hand: tests/real/meta_path_race.py.
tests/real/test_processes.py's threaded child imports setuptools before its
threads and holds them to no removal from sys.meta_path while they import.
"""

from __future__ import annotations

import os

import pytest

from helpers import REPO, VLLM_COMPLETE, hermetic_env, json_lines, run_python

RACE = r'''
import _imp, ast, contextlib, importlib, json, os, sys, threading
import _frozen_importlib as _bootstrap
from importlib.machinery import BuiltinImporter, PathFinder

class DistutilsMetaFinder:  # setuptools' finder: its .pth puts it on sys.meta_path
    def find_spec(self, fullname, path=None, target=None):
        return None

DISTUTILS_FINDER = DistutilsMetaFinder()
sys.meta_path.insert(sys.meta_path.index(BuiltinImporter), DISTUTILS_FINDER)  # where the .pth puts it
import wrapt  # another library's post-import hook (an APM's): wrapt's finder is there before vLLM
wrapt.register_post_import_hook(lambda module: None, "kimi_unrelated_module")

def walk_in_place():
    """Does _find_spec walk sys.meta_path itself (a removal under the walk skips)?"""
    asked = []
    class Remover:
        def find_spec(self, fullname, path=None, target=None):
            if fullname == "kimi_probe_absent":
                sys.meta_path.remove(dummy)
    class Recorder:
        def find_spec(self, fullname, path=None, target=None):
            asked.append(fullname)
    dummy, saved = DistutilsMetaFinder(), sys.meta_path
    sys.meta_path = [dummy, Remover(), Recorder()] + saved
    try:
        importlib.import_module("kimi_probe_absent")
    except ModuleNotFoundError:
        pass
    sys.meta_path = saved
    return not asked

def find_spec_on_a_copy():
    """_find_spec as gh-130094 made it: walk a copy of sys.meta_path."""
    with open(os.path.join(os.path.dirname(importlib.__file__), "_bootstrap.py")) as file:
        text = file.read()
    source = next(ast.get_source_segment(text, node) for node in ast.parse(text).body
                  if isinstance(node, ast.FunctionDef) and node.name == "_find_spec")
    fixed = source.replace("meta_path = sys.meta_path\n", "meta_path = list(sys.meta_path)\n", 1)
    if fixed == source:
        return None  # this CPython already walks a copy
    namespace = {}
    exec(compile(fixed, "<gh-130094>", "exec"), vars(_bootstrap), namespace)
    return namespace["_find_spec"]

def race(name, mutate):
    """Thread B imports ``name``; its walk of sys.meta_path is parked just after
    asking the finder before PathFinder (import lock released, next finder not
    taken yet) while ``mutate()`` runs in this thread."""
    before_path = sys.meta_path[sys.meta_path.index(PathFinder) - 1]
    started, parked, resumed = threading.Event(), threading.Event(), threading.Event()
    out = {"parked_in": getattr(before_path, "__name__", type(before_path).__name__)}

    def in_find_spec(frame, event, arg):
        if event == "line" and frame.f_locals.get("finder") is before_path and not _imp.lock_held():
            sys.settrace(None)
            parked.set()
            resumed.wait(30)
            return None
        return in_find_spec

    def tracer(frame, event, arg):
        if frame.f_code.co_name == "_find_spec" and frame.f_locals.get("name") == name:
            return in_find_spec
        return None

    def importer():
        started.wait(30)
        sys.settrace(tracer)
        try:
            importlib.import_module(name)
            out["import"] = "ok"
        except BaseException as exc:
            out["import"] = f"{type(exc).__name__}: {exc}"
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=importer)
    thread.start()
    with mutate():
        started.set()
        out["parked"] = parked.wait(30)
    resumed.set()
    thread.join(30)
    return out

@contextlib.contextmanager
def distutils_shim():  # _distutils_hack.shim(), as ensure_local_distutils runs it
    sys.meta_path.insert(0, DISTUTILS_FINDER)
    yield
    sys.meta_path.remove(DISTUTILS_FINDER)

@contextlib.contextmanager
def nothing():
    yield

@contextlib.contextmanager
def import_vllm():  # the bootstrap's trigger fires, arms the shim and leaves sys.meta_path
    yield
    import vllm  # noqa: F401

out = {"walk_in_place": walk_in_place()}
out["arming"] = race("victim_pkg.arming", import_vllm)  # the stand-in vLLM: arms the shim if on
out["armed"] = "kimi_hotfix.runtime.core" in sys.modules
out["meta_path"] = [getattr(f, "__name__", type(f).__name__) for f in sys.meta_path]
out["race"] = race("victim_pkg.race", distutils_shim)
out["control"] = race("victim_pkg.control", nothing)
copied = find_spec_on_a_copy()
if copied is not None:
    _bootstrap._find_spec, original = copied, _bootstrap._find_spec
    out["copied"] = race("victim_pkg.copied", distutils_shim)
    _bootstrap._find_spec = original
else:
    out["copied"] = race("victim_pkg.copied", distutils_shim)
print("KIMI_JSON:" + json.dumps(out))
'''


@pytest.mark.parametrize("shim", [True, False], ids=["shim", "no-shim"])
def test_meta_path_removal_under_another_threads_walk_fails_its_import(tmp_path, shim):
    package = tmp_path / "victim_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("arming", "race", "control", "copied"):
        (package / f"{name}.py").write_text("HERE = True\n")
    env = hermetic_env(shim=shim)
    env["PYTHONPATH"] = os.pathsep.join(([str(REPO)] if shim else [])
                                        + [str(VLLM_COMPLETE), str(tmp_path)])
    proc = run_python(["-c", RACE], env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json_lines(proc.stdout)[0]
    assert out["armed"] is shim
    # as in a vLLM process (a virtualenv may add its own finder)
    assert out["meta_path"][0] == "ImportHookFinder" and "DistutilsMetaFinder" in out["meta_path"]
    assert out["meta_path"][-3:] == ["BuiltinImporter", "FrozenImporter", "PathFinder"]
    assert out["race"]["parked_in"] == "FrozenImporter", out
    assert all(out[case]["parked"] for case in ("arming", "race", "control", "copied")), out
    # the failure the real tier saw, on every CPython that walks the live list, shim or not
    missing = "ModuleNotFoundError: No module named 'victim_pkg.race'"
    assert out["race"]["import"] == (missing if out["walk_in_place"] else "ok")
    assert out["control"]["import"] == "ok"  # parking alone breaks nothing
    assert out["copied"]["import"] == "ok"  # walking a copy (gh-130094) fixes it
    # the shim's own change to sys.meta_path, the trigger leaving it as vLLM is
    # imported, rebinds a new list (sitecustomize.retire): a walk in another
    # thread goes on over the old one and finds its module (removed in place,
    # the trigger took PathFinder's turn: ModuleNotFoundError, as above)
    assert out["arming"]["import"] == "ok"
