"""The fault matrix on the real vLLM: every kind of process vLLM runs in.

- -O, -OO and PYTHONOPTIMIZE=1: patched, one marked layer per target, one
  summary line that names the level, no warning;
- multiprocessing spawn, fork and forkserver children import vLLM themselves
  and are patched (under -O: the child's merge keeps the DSpark capability
  while vLLM's own merge, called in the same child, drops it);
- three threads importing three target modules at once: one wrap each;
- wrapt missing (a venv that hides it): one warning, the shim inactive, vLLM
  works (strict mode failing the import is the shim's own mechanics:
  tests/unit/test_faults.py);
- KIMI_HOTFIX_DISABLE=*: nothing wrapped, the -O bug is back;
- an exception inside kv_spec_merge's own code: logged once, saying what runs;
- a reload and a re-import settle again; another library's wrappers keep running.
Where a case is one process of vLLM with some environment, it is a
configuration of harness.PLAN (tests/real/child.py): the threads are
PYTHONOPTIMIZE's run, KIMI_HOTFIX_DISABLE=* is the unpatched -O seed-1 run on
0.29.0; their start-up log is read apart from what the child's sections log
after it. A claim that needs no process of its own rides at the end of one
(harness.child_spec): the reload in the -O child, the other library wrapping
after the shim in PYTHONOPTIMIZE's. Cases without vLLM (stand-ins: missing
targets, the chained sitecustomize, garbage in the toggles, one at a time and
all at once) are in tests/unit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness import child, venv_python
from helpers import (
    PATCHES,
    REPO,
    STANDINS,
    hermetic_env,
    json_lines,
    line_states,
    run_python,
    summaries,
    warning_lines,
)
from standins.venvs import layered_venv, site_dirs, visible

HERE = Path(__file__).resolve().parent

PRELUDE = f"import sys; sys.path.append({str(STANDINS)!r}); import mechanics\n"
CAPABILITY = "non_causal_multi_token_decode"
KV_REPORT = (
    "import vllm.v1.kv_cache_interface as kv\n"
    + PRELUDE
    + "mechanics.emit(mechanics.report(capability=mechanics.mla_capability(kv),\n"
    "    vllm_own_merge_capability=mechanics.mla_capability(kv, original=True)))\n"
)


def one_layer_each(wrapped, recorded):
    return bool(wrapped) and all(v["layers"] == 1 for v in wrapped.values()) and {
        k: v["patch"] for k, v in wrapped.items()} == recorded


@pytest.mark.releases("0.29.0")
@pytest.mark.parametrize("config, level", [("on:O:0", 1), ("on:OO:3", 2),
                                           ("pyoptimize:plain:1", 1)],
                         ids=["-O", "-OO", "PYTHONOPTIMIZE=1"])
def test_optimized_python_is_patched(release, config, level):
    name, opt, seed = config.split(":")
    run = child(release, name, opt, int(seed))
    assert run["process"]["optimize"] == level
    assert run.kinds == {p: "applied" for p in PATCHES}
    wrapped = run["wrapped"]
    assert one_layer_each(wrapped["layers"], wrapped["recorded"])
    assert run["kv"]["merge"]["non_causal_multi_token_decode"] is True
    # vLLM's own merge, same process: plain under -O parity, its assert refuses the pair
    assert run["battery"]["original_capability_merge"].startswith("AssertionError: All attention")
    assert run["process"]["o_parity"].startswith("applied (package"), run["process"]["o_parity"]
    (lines,) = summaries(run.stderr).values()  # one process, a line per change
    assert line_states(lines[0]) == dict.fromkeys(PATCHES, "pending")
    settled = next(line for line in lines if line_states(line) == dict.fromkeys(PATCHES, "applied"))
    assert f"python -{'O' * level}, -O parity: package)" in settled, run.stderr
    assert warning_lines(run.stderr) == []


CHILD_SCRIPT = """
import json, multiprocessing as mp, os, sys
sys.path.append(%(standins)r)
import mechanics


def child(queue):
    import vllm.v1.kv_cache_interface as kv
    import vllm.v1.worker.gpu.cudagraph_utils
    import vllm.models.kimi_k3.nvidia.kda_metadata
    queue.put(json.dumps(mechanics.report(
        capability=mechanics.mla_capability(kv),
        vllm_own_merge_capability=mechanics.mla_capability(kv, original=True),
    ), default=repr))


if __name__ == "__main__":
    ctx = mp.get_context(sys.argv[1])
    queue = ctx.SimpleQueue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    result = json.loads(queue.get())
    proc.join()
    mechanics.emit({"child": result, "parent": {
        "pid": os.getpid(), "vllm_loaded": "vllm" in sys.modules,
        "exitcode": proc.exitcode, "start_method": ctx.get_start_method()}})
"""


@pytest.mark.releases("0.29.0", "0.29.0-py3.12")
@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_multiprocessing_children_are_patched(tmp_path, release, method):
    script = tmp_path / "parent.py"
    script.write_text(CHILD_SCRIPT % {"standins": str(STANDINS)})
    proc = run_python([str(script), method], python=venv_python(release), flags=["-O"])
    out = json_lines(proc.stdout)[0]
    parent, kid = out["parent"], out["child"]
    assert parent["start_method"] == method and parent["exitcode"] == 0
    assert parent["vllm_loaded"] is False  # the child imported vLLM itself
    assert kid["pid"] != parent["pid"] and kid["optimize"] == 1
    assert kid["bootstrap_loaded"] is True and kid["armed_by"] == ["sitecustomize"]
    assert {v["patch"] for v in kid["wrapped"].values()} == set(PATCHES)
    assert one_layer_each(kid["wrapped"], kid["recorded"])
    assert kid["capability"] is True and kid["vllm_own_merge_capability"] == "AssertionError"
    lines = summaries(proc.stderr)
    assert list(lines) == [kid["pid"]], proc.stderr  # the child logged, with its own pid
    assert line_states(lines[kid["pid"]][-1]) == dict.fromkeys(PATCHES, "applied")


@pytest.mark.releases("0.29.0")
def test_threads_importing_vllm_at_once_wrap_once(release):
    """Three threads import three target modules at once, so their hooks settle
    concurrently (harness.PLAN's PYTHONOPTIMIZE run; tests/real/child.py,
    spec "threads"). ``vllm`` itself is imported first: threads racing
    through vLLM's own first import can be handed a half-initialized vLLM module by
    CPython's deadlock avoidance (``cannot import name 'init_logger' from partially
    initialized module 'vllm.logger'``), a property of vLLM's import graph, not of
    the shim. Arming while another thread is mid-import of a target is
    tests/unit/test_bootstrap.py::test_arming_while_another_thread_imports_a_target.
    setuptools' first import removes a finder from sys.meta_path in place, which
    can make another thread's import of an existing module fail (``No module named
    'vllm.utils.gpu_sync_debug'``, seen once here; CPython gh-130094, shim or not:
    tests/unit/test_meta_path_race.py): the child imports setuptools before its
    threads and records any removal from sys.meta_path while they import."""
    run = child(release, "pyoptimize", "plain", 1)
    assert run["process"]["meta_path_removals"] == []
    assert run["process"]["thread_import_errors"] == []
    assert run.kinds == {p: "applied" for p in PATCHES}
    wrapped = run["wrapped"]
    assert one_layer_each(wrapped["layers"], wrapped["recorded"])
    (lines,) = summaries(run.start_stderr).values()
    assert line_states(lines[-1]) == dict.fromkeys(PATCHES, "applied")


@pytest.fixture(scope="module")
def no_wrapt_python(tmp_path_factory):
    """A venv that sees the 0.29.0 vLLM venv's packages, except wrapt."""
    base = venv_python("0.29.0")
    dest = tmp_path_factory.mktemp("no-wrapt") / "venv"
    python = layered_venv(dest, base, site_dirs(base), hide=("wrapt", "wrapt-*"))
    # it sees vLLM and torch, not wrapt (found or not, nothing imported)
    assert visible(python, ["vllm", "torch", "wrapt"]) == {"vllm": True, "torch": True,
                                                          "wrapt": False}
    return python


@pytest.mark.releases("0.29.0")
def test_wrapt_missing_one_warning_shim_inactive_vllm_works(release, no_wrapt_python):
    code = KV_REPORT.replace("mechanics.report(", "mechanics.report(same=repr(kv.MLAAttentionSpec"
                             ".merge([kv.MLAAttentionSpec(block_size=64, num_kv_heads=1, "
                             "head_size=576, dtype=__import__('torch').bfloat16)] * 2)), ")
    proc = run_python(["-c", code], python=no_wrapt_python, flags=["-O"])
    out = json_lines(proc.stdout)[0]
    assert out["wrapped"] == {} and out["recorded"] == {}
    assert set(out["states"].values()) == {"failed: wrapt is not installed"}
    assert out["same"].startswith("MLAAttentionSpec(")  # vLLM works
    # no patch without wrapt; -O parity needs none: vLLM's merge runs plain (refuses the pair)
    assert out["capability"] == out["vllm_own_merge_capability"] == "AssertionError"
    warnings = warning_lines(proc.stderr)
    assert len(warnings) == 1 and "wrapt is not installed" in warnings[0], proc.stderr
    (lines,) = summaries(proc.stderr).values()  # failed from the start: one line
    assert lines == [lines[0]] and lines[0].endswith(
        " | ".join(f"{p}: failed: wrapt is not installed" for p in PATCHES))
    proc = run_python(["-m", "kimi_hotfix", "status", "--json"], python=no_wrapt_python,
                      cwd=REPO, check=False)
    status = json.loads(proc.stdout)
    assert proc.returncode == 3 and status["active"] is False
    assert status["active_reason"].startswith("INACTIVE: wrapt is not installed")


@pytest.mark.releases("0.29.0")
def test_disable_star_leaves_vllm_unwrapped(release):
    run = child(release, "disable", "O", 1)
    assert run["wrapped"]["layers"] == {} and run["wrapped"]["recorded"] == {}
    assert set(run.states.values()) == {"disabled (KIMI_HOTFIX_DISABLE)"}
    assert run["kv"]["merge"][CAPABILITY] is False  # the -O bug: the draft lost it
    assert run["battery"]["original_capability_merge"] is False  # vLLM's own, same process
    (lines,) = summaries(run.start_stderr).values()
    assert lines == [lines[0]] and lines[0].endswith(
        " | ".join(f"{p}: disabled (KIMI_HOTFIX_DISABLE)" for p in PATCHES))
    assert warning_lines(run.start_stderr) == []


@pytest.mark.releases("0.29.0")
@pytest.mark.parametrize("opt", ["plain", "O"])
def test_kv_helper_failure_says_what_runs_instead(release, opt):
    """The capability helper raises: the merge that runs is vLLM's own without
    the group capability, which is plain Python's merge: under -O too, since
    -O parity loaded it plain (not -O's stripped merge), and the log says so."""
    run, plain = child(release, "on", opt), child(release, "on", "plain")
    calls = run["failures"]["kv_spec_merge"]
    assert [c["patched"] for c in calls] == [c["vllm_own"] for c in plain["failures"]["kv_spec_merge"]]
    failures = [w for w in warning_lines(run.failures_stderr) if "kv_spec_merge wrapper" in w]
    assert len(failures) == 1, run.failures_stderr
    assert "vLLM's own merge runs without the group capability" in failures[0]
    assert run.failures_stderr.count("RuntimeError: injected failure in the patch code") >= 2


# cloudpickle pickles what isinstance() calls a function by value unless looking
# it up by module and qualified name gives the very object back. A class hands
# out a new bound wrapper for a plain function at each access, so cloudpickle
# rebuilds these from their code: vLLM's own function, without the fix.
CLOUDPICKLE_BY_VALUE = ("CudaGraphManager._init_candidates",)


@pytest.mark.releases("0.29.0")
def test_patched_callables_pickle_and_copy_wherever_vllms_own_do(release):
    """Issue 20 item 12: wrapt's proxies refuse pickling (NotImplementedError:
    the control row, a bare wrapt.FunctionWrapper around one of the same
    callables); the shim's wrappers pickle, cloudpickle, copy and deepcopy
    wherever vLLM's own callables do, and what comes back is still wrapped,
    except cloudpickle's by-value copies (CLOUDPICKLE_BY_VALUE, docs/limits).
    "equal" (== only) is not "same": wrapt's proxies compare the object they
    wrap, so an unwrapped copy would read "equal" too (issue 30 item 2); each
    result's wrapped-ness is recorded."""
    ours, own = child(release, "on", "O")["pickling"], child(release, "off", "O")["pickling"]
    control = "<wrapt.FunctionWrapper>"
    assert ours.pop(control) == own.pop(control) == dict.fromkeys(
        ("pickle", "cloudpickle", "copy", "deepcopy"), "error: NotImplementedError"), ours
    assert set(ours) == set(own) and len(ours) == 3
    # under -O on 0.29.0 every patch applies: each of the three callables is wrapped
    assert all(row["wrapped"] for row in ours.values()), ours
    for name, row in ours.items():
        assert not own[name]["wrapped"], own
        for how in ("pickle", "cloudpickle", "copy", "deepcopy"):
            assert not own[name][how].startswith("error"), (name, how, own)
            if how == "cloudpickle" and name in CLOUDPICKLE_BY_VALUE:
                assert (row[how], row[how + "_wrapped"]) == ("other", False), (name, row)
                continue
            assert row[how] in ("same", "equal") and row[how + "_wrapped"] is True, (name, how, row)
            if how in ("copy", "deepcopy"):  # copies are the object itself, as for functions
                assert row[how] == "same", (name, how, row)


@pytest.mark.releases("0.29.0")
def test_a_reloaded_or_reimported_module_is_settled_again_never_stale(release):
    """Issue 20 item 5: after ``importlib.reload`` (kv_cache_interface) or a
    fresh import (vllm.config.vllm) the classes are vLLM's own again;
    the patch settles again on them during that import (issue 29), so vLLM
    runs the fix before anything reads the states (the merge keeps the draft
    capability that vLLM's own merge, under -O, drops), the state says so,
    ``applied`` is never stale; undo() puts back the old objects too."""
    out = child(release, "on", "O")["reimport"]  # the child's last section (harness.child_spec)
    # vLLM's own merge, reloaded under -O parity: plain code, its assert refuses the pair
    assert out["reloaded_unread"] == {"capability": True, "vllm_own": "AssertionError"}, out
    assert out["reimported_unread"] is True  # the fresh import loaded plain too
    refused = ("AssertionError: Block_size(64) should be greater than or equal to and divisible "
               "by cp_kv_cache_interleave_size (128).")
    for phase in ("before", "reloaded", "reimported"):
        seen = out[phase]
        assert seen["merge_wrapped"] and seen["kv_plain"] and seen["config_plain"], (phase, seen)
        assert seen["kv_spec_merge"].startswith("applied"), (phase, seen)
        assert seen["o_parity"].startswith("applied (package"), (phase, seen)
        assert seen["interleave_misfit"] == refused, (phase, seen)
    assert "re-imported" in out["reloaded"]["kv_spec_merge"], out["reloaded"]
    assert out["old_class_wrapped"] is True  # what old code still holds stays patched
    assert out["undone"]["kv_spec_merge"].startswith("disabled (undone")
    assert not out["undone"]["merge_wrapped"] and out["old_class_wrapped_after_undo"] is False


COEXIST_FIRST = """
import json, sys
import other_library
other_library.register_first()  # before vLLM arms the shim: these hooks run before the shim's
import vllm
import vllm.distributed.parallel_state
import vllm.v1.kv_cache_interface
from kimi_hotfix.runtime import core
print("KIMI_JSON:" + json.dumps(other_library.phases(core, first=True)))
"""


@pytest.mark.releases("0.29.0")
@pytest.mark.parametrize("order", ["first", "after"])
def test_other_instrumentation_keeps_running_and_the_states_stay_true(release, order):
    """Issue 20 items 4 and 6: another library wraps the getter (functools.wraps,
    in its own file) and MLAAttentionSpec.merge (wrapt), before the shim settles
    or after. kv_spec_merge's decision reads vLLM's own merge beneath the wrapper
    (applied, not "not needed") and installs beneath it (``layers``: the other
    library's wrapper stays on the attribute and calls the shim's); the getter
    is vLLM's own function under the other library's, with plain Python's code
    (-O parity loaded its module), so both run on every call: -O gets plain
    Python's behaviour (the getter raises, the merge keeps the draft capability)
    and the other library counts every call. undo() takes kv_spec_merge out
    from under the other wrapper (vLLM's own merge is back: plain, it refuses
    the pair) and parity's finder off; the modules parity loaded keep plain
    bytecode (the getter still raises) and parity's state says so; the other
    library still runs; reapply and undo again stay true."""
    if order == "first":  # a process of its own: the hooks go in before vLLM is imported
        env = hermetic_env()
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE)])  # tests/real/other_library.py
        proc = run_python(["-c", COEXIST_FIRST], python=venv_python(release), flags=["-O"], env=env)
        (out,) = json_lines(proc.stdout)
        stderr = proc.stderr
    else:  # the PYTHONOPTIMIZE=1 child's last section (harness.child_spec)
        run = child(release, "pyoptimize", "plain", 1)
        out, stderr = run["coexist"], run.section_stderr("coexist")
    patched = {"getter": "AssertionError", "merge": "any"}
    unpatched = {"getter": "AssertionError", "merge": "rejects"}  # vLLM's own, plain code
    beneath = {"getter": ["other_library.py", "function"],
               "merge": ["FunctionWrapper", "KimiHotfixWrapper"]}
    alone = {"getter": ["other_library.py", "function"], "merge": ["FunctionWrapper", "classmethod"]}
    for name, expect in (("applied", patched), ("undone", unpatched), ("reapplied", patched),
                         ("undone_again", unpatched)):
        seen = out[name]
        assert {k: seen[k] for k in expect} == expect, (name, seen)
        # the other library's wrapper stays outermost; the shim's is the one beneath it
        assert seen["layers"] == (beneath if expect is patched else alone), (name, seen)
        assert seen["calls"]["getter"] == 1 and seen["calls"]["merge"] >= 1, (name, seen)
        merge_state, parity_state = seen["kv_spec_merge"], seen["o_parity"]
        if expect is patched:
            assert merge_state.startswith("applied") and "not needed" not in merge_state, (name, seen)
            assert parity_state.startswith("applied (package"), (name, seen)
        else:
            assert merge_state == "disabled (undone)", (name, seen)
            assert parity_state.startswith("disabled (undone; ") and "keep plain bytecode" in \
                parity_state, (name, seen)
    assert "could not restore" not in stderr, stderr
