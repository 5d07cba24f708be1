"""One child interpreter of a real vLLM venv computes everything the tests read.

    python [-O|-OO] tests/real/child.py '{"no_source": false, "fail_mla_ctor": false}'

Importing vLLM costs seconds per process, so each (release, flags, seed,
environment) configuration runs this script once and the tests assert on its
output: one ``KIMI_JSON:`` line on stdout holding a section per topic. Sections:

  cli       (spec "cli": true) ``python -m kimi_hotfix check`` run first, before
            anything else is imported: what that command prints (fd 1) and its
            exit status; its stderr is the start of this process's stderr
  process   versions, -O, hash seed, the shim's states, who armed it
  wrapped   what carries the shim's marker (layers, the core's records)
  kv        the Kimi-K3 grouping probe (target + draft merge, layer sets)
  battery   every merge classmethod, toggled on and off, plus undo/reapply
  plans     CUDA-graph capture plans, as installed and, where the patch is not
            applied, with it toggled on
  kda       KDA metadata builds, likewise
  check     ``check --json`` through the CLI (fd 1 captured), states around it
  pickling  pickle, cloudpickle, copy and deepcopy of each wrapped callable
  merge_work how often dataclasses.fields/replace run in one patched merge
  failures  each patch's own code made to fail (logged once; strict raises)
  o_parity  (spec "o_parity": true, run with KIMI_HOTFIX=0) the -O hazards -O
            parity covers, without and with it (child_o_parity.py); last,
            since it builds a gloo world

Before each section the child writes ``KIMI_SECTION:<name>`` on stderr, so a
test can read what was logged at start-up (imports and arming) apart from what
the sections' toggling logs. With spec "threads": true the targets are imported
by three threads at once after ``import vllm`` (test_processes.py). With spec
"late": true the shim's bootstrap is shadowed (an APM launcher's sitecustomize
first on PYTHONPATH), every target is imported first, and vLLM's own plugin
loader arms the shim afterwards (test_launcher.py).

No ``assert`` here: the child may run under -O. Every fact comes from the real
vLLM in this process; the stand-ins are never imported.
"""

import json
import os
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SPEC = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
OUT = {"sections": {}, "timings": {}}


def _capture(run):
    """``run()`` with fd 1 captured: (its result, what a shell would see on stdout)."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 1)
        try:
            result = run()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        tmp.seek(0)
        return result, tmp.read().decode()


def _cli_check():
    """``python -m kimi_hotfix check``, as that command runs it: its __main__."""
    import runpy

    argv, sys.argv = sys.argv, ["-m", "check"]
    try:
        runpy.run_module("kimi_hotfix", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code
    finally:
        sys.argv = argv
    return None


if SPEC.get("cli"):  # first: nothing of the shim's or vLLM's imported yet
    _t = time.perf_counter()
    try:
        _rc, _text = _capture(_cli_check)
        OUT["sections"]["cli"] = {"rc": _rc, "stdout": _text}
    except BaseException:
        OUT["sections"]["cli"] = {"error": traceback.format_exc()[-4000:]}
    OUT["timings"]["cli"] = round(time.perf_counter() - _t, 3)

sys.path.append(os.path.join(REPO, "tests", "standins"))  # mechanics (after start-up)
import cases  # noqa: E402  (tests/real, this script's directory)

if SPEC.get("no_source"):  # these vLLM modules shipped as bytecode only: no source lines
    import linecache

    _getlines = linecache.getlines
    _HIDDEN = ("vllm/models/kimi_k3/nvidia/kda_metadata.py", "vllm/distributed/parallel_state.py",
               "vllm/config/vllm.py")

    def _hidden(filename, module_globals=None):
        if filename.replace(os.sep, "/").endswith(_HIDDEN):
            return []
        return _getlines(filename, module_globals)

    linecache.getlines = _hidden

_ctor = {}
if SPEC.get("fail_mla_ctor"):  # a later vLLM whose spec constructor the probe cannot call
    import wrapt

    def _break_ctor(module):
        cls = module.MLAAttentionSpec
        _ctor["original"] = vars(cls)["__init__"]

        def __init__(self, *args, **kwargs):
            raise TypeError("MLAAttentionSpec.__init__() missing 1 required argument: 'new_field'")

        cls.__init__ = __init__

    _ctor["break"] = _break_ctor
    wrapt.register_post_import_hook(_break_ctor, "vllm.v1.kv_cache_interface")

t0 = time.perf_counter()
import importlib  # noqa: E402

THREAD_ERRORS = []
META_PATH_REMOVALS = []
if SPEC.get("threads"):  # vLLM first, then three targets imported by three threads at once
    import threading

    # setuptools' first import (torch.utils.cpp_extension, below cudagraph_utils) inserts
    # and then removes a finder at sys.meta_path[0] in place: a thread walking the list
    # then can skip PathFinder and fail to find a module that exists (CPython gh-130094,
    # fixed by walking a copy in 3.14 and 3.13's later releases; tests/unit/
    # test_meta_path_race.py). Not the shim's: it runs here, before vLLM and the threads, and
    # any removal from sys.meta_path while they import is recorded (none expected).
    import setuptools  # noqa: F401
    import vllm  # noqa: F401  (arms the shim; threads racing vLLM's own first import is another matter)

    class _Recording(list):
        def _removed(self, how):
            META_PATH_REMOVALS.append(f"{how} in {threading.current_thread().name}: "
                                      + "".join(traceback.format_stack(limit=8)[:-2])[-1500:])

        def remove(self, value):
            self._removed("remove")
            return super().remove(value)

        def pop(self, *args):
            self._removed("pop")
            return super().pop(*args)

        def clear(self):
            self._removed("clear")
            return super().clear()

        def __delitem__(self, key):
            self._removed("del")
            return super().__delitem__(key)

        def __setitem__(self, key, value):
            self._removed("slice assignment")
            return super().__setitem__(key, value)

    _recording = sys.meta_path = _Recording(sys.meta_path)
    _barrier = threading.Barrier(3)

    def _load(name):
        _barrier.wait()
        try:
            importlib.import_module(name)
        except BaseException:  # the whole traceback: a rare failure must be diagnosable
            THREAD_ERRORS.append(traceback.format_exc()[-4000:])

    _threads = [threading.Thread(target=_load, args=(t,)) for t in cases.TARGETS[:3]]
    for _thread in _threads:
        _thread.start()
    for _thread in _threads:
        _thread.join()
    if sys.meta_path is not _recording:
        META_PATH_REMOVALS.append("sys.meta_path was rebound while the threads imported")
    sys.meta_path = list(sys.meta_path)
for _target in cases.TARGETS:
    importlib.import_module(_target)
IMPORT_SECONDS = time.perf_counter() - t0
LATE = None
if SPEC.get("late"):  # the bootstrap shadowed by an APM launcher's sitecustomize (first on
    # PYTHONPATH): every target is imported before anything of the shim, then vLLM's own
    # plugin loader arms it, through the dist-info beside the package, as in an EngineCore
    LATE = {"apm_sitecustomize": os.environ.get("STANDIN_APM_RAN"),
            "bootstrap_loaded": "kimi_hotfix_sitecustomize" in sys.modules,
            "armed_before": "kimi_hotfix.runtime.core" in sys.modules,  # (cases.py loads the registry)
            "targets_imported_before": [t for t in cases.TARGETS if t in sys.modules]}
    from vllm.plugins import load_general_plugins

    load_general_plugins()
if "original" in _ctor:
    sys.modules["vllm.v1.kv_cache_interface"].MLAAttentionSpec.__init__ = _ctor["original"]

import vllm  # noqa: E402
from vllm.models.kimi_k3.nvidia import kda_metadata  # noqa: E402
from vllm.v1 import kv_cache_interface as kvi  # noqa: E402
from vllm.v1.worker.gpu import cudagraph_utils  # noqa: E402

if "kimi_hotfix" not in sys.modules:
    sys.path.append(REPO)
import kimi_hotfix  # noqa: E402
from kimi_hotfix.runtime import core  # noqa: E402

import mechanics  # noqa: E402


def section(name, when=True):
    def run(fn):
        if not when or name not in SPEC.get("sections", [name]):
            return fn
        print(f"KIMI_SECTION:{name}", file=sys.stderr, flush=True)
        t = time.perf_counter()
        try:
            OUT["sections"][name] = fn()
        except BaseException:
            OUT["sections"][name] = {"error": traceback.format_exc()[-4000:]}
        OUT["timings"][name] = round(time.perf_counter() - t, 3)
        return fn

    return run


def states():
    return {name: {"kind": s.kind.value, "text": str(s)} for name, s in core.states().items()}


def build_kind():
    obj = vars(kda_metadata.KimiK3KDAMetadataBuilder)["build"]
    if not core.is_wrapped(obj):
        return "vllm"
    return "inline" if type(obj).__name__ == "function" else "wrapt"  # wrapt proxies __class__


@section("process")
def process():
    sc = sys.modules.get("kimi_hotfix_sitecustomize")
    return {
        "vllm": vllm.__version__, "python": ".".join(map(str, sys.version_info[:3])),
        "optimize": sys.flags.optimize, "hashseed": os.environ.get("PYTHONHASHSEED"),
        "armed": core.current_config() is not None, "states": states(),
        "armed_by": core.armed_by(), "bootstrap_loaded": sc is not None,
        "kimi_hotfix_file": kimi_hotfix.__file__, "import_seconds": round(IMPORT_SECONDS, 2),
        "kv_cache_interface_file": kvi.__file__,
        "mla_ctor_broken_at_import": "original" in _ctor,
        "thread_import_errors": THREAD_ERRORS,
        "meta_path_removals": META_PATH_REMOVALS,
        "late": LATE,
        "o_parity": str(core.parity_state()), "o_parity_mode": core.parity_mode(),
        "plain_modules": sorted(n for n, m in list(sys.modules.items())
                                if n.startswith("vllm") and type(getattr(getattr(
                                    m, "__spec__", None), "loader", None)).__name__ == "PlainLoader"),
    }


@section("wrapped")
def wrapped():
    layers = {}
    for target in cases.TARGETS:
        layers.update(mechanics.wrapped_layers(sys.modules[target]))
    merges = {c.__name__: core.is_wrapped(vars(c)["merge"]) for c in vars(kvi).values()
              if isinstance(c, type) and "merge" in vars(c) and issubclass(c, kvi.KVCacheSpec)}
    return {"layers": layers, "recorded": mechanics.recorded(core), "merge": merges,
            "capture": core.is_wrapped(vars(cudagraph_utils.CudaGraphManager)["_init_candidates"]),
            "build": core.is_wrapped(vars(kda_metadata.KimiK3KDAMetadataBuilder)["build"]),
            "build_kind": build_kind()}


@section("kv")
def kv():
    from kimi_hotfix.patches.kv_spec_merge import probe

    return {"merge": probe.mla_merge_target_draft(),
            "groupings": {name: probe.grouping(name) for name in probe.LAYER_SETS},
            "probe": probe.run().as_dict()}


def _plans():
    from kimi_hotfix.patches.capture_workspace import probe

    return {cases.key(s): probe.capture_plan(**s) for s in cases.PLANS + cases.PLANS_OFF}


def _kdas():
    from kimi_hotfix.patches.kda_overlong_rows import probe

    return {cases.key(s): probe.kda_build(**s) for s in cases.KDA_OVERLONG + cases.KDA_WITHIN}


def _installed_and_forced(name, compute):
    """``compute()`` as the shim left vLLM, and again with patch ``name`` toggled on
    where the shim decided it is not needed (applied, toggling on changes nothing;
    disabled, no test reads it)."""
    out = {"installed": compute()}
    if core.states()[name].kind.value in ("not_needed", "not_affected"):
        from kimi_hotfix.tools.preflight import toggled  # check's own toggle
        with toggled(name, True) as state:
            out.update(forced=compute(), forced_state=str(state))
    return out


@section("plans")
def plans():
    return _installed_and_forced("capture_workspace", _plans)


@section("kda")
def kda():
    return _installed_and_forced("kda_overlong_rows", _kdas)


@section("battery")
def battery():
    import child_battery

    return child_battery.run(core, kvi)


@section("check")
def check():
    from kimi_hotfix.tools import cli
    before = {name: str(s) for name, s in core.states().items()}
    rc, text = _capture(lambda: cli.main(["check", "--json"]))
    after = {name: str(s) for name, s in core.states().items()}
    return {"rc": rc, "stdout": text, "states_before": before, "states_after": after}


@section("pickling")
def pickling():
    """What pickle, cloudpickle, copy and deepcopy do with each callable a patch
    wraps, as code reaches it (through its class or module): "same" (the very
    object back), "other" (another object), "error: Type" (issue 20 item 12)."""
    import copy
    import pickle

    import cloudpickle

    ways = {"pickle": lambda o: pickle.loads(pickle.dumps(o)),
            "cloudpickle": lambda o: cloudpickle.loads(cloudpickle.dumps(o)),
            "copy": copy.copy, "deepcopy": copy.deepcopy}
    found = {"MLAAttentionSpec.merge": kvi.MLAAttentionSpec.merge,
             "CudaGraphManager._init_candidates": cudagraph_utils.CudaGraphManager._init_candidates,
             "KimiK3KDAMetadataBuilder.build": kda_metadata.KimiK3KDAMetadataBuilder.build}
    import wrapt

    def outcome(way, obj):  # "same": the very object; "equal": == only (wrapt's
        try:  # proxies compare the wrapped object, so an unwrapped copy is "equal")
            back = way(obj)
        except Exception as exc:
            return f"error: {type(exc).__name__}", None
        return "same" if back is obj else "equal" if back == obj else "other", core.is_wrapped(back)

    out = {}
    for name, obj in found.items():
        row = {"wrapped": core.is_wrapped(obj)}
        for how, way in ways.items():
            row[how], row[how + "_wrapped"] = outcome(way, obj)
        out[name] = row
    # the control: a bare wrapt proxy around the same callable, as wrapt makes it
    bare = wrapt.FunctionWrapper(kvi.FullAttentionSpec.merge, lambda f, i, a, k: f(*a, **k))
    out["<wrapt.FunctionWrapper>"] = {how: outcome(way, bare)[0] for how, way in ways.items()}
    return out


@section("merge_work")
def merge_work():
    """The per-call work of ``MLAAttentionSpec.merge`` as code reaches it, against
    vLLM's own merge under it (issue 20 item 13): how often ``dataclasses.fields``
    and ``dataclasses.replace`` run in one call on 61 equal specs without the
    draft capability, after a first call (what is cached per class is built)."""
    import dataclasses

    import torch

    from kimi_hotfix.runtime import wrapping
    cls = kvi.MLAAttentionSpec
    own = wrapping.vllm_own(cls, "merge").__get__(None, cls)
    specs = [cls(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16) for _ in range(61)]
    out = {"wrapped": core.is_wrapped(vars(cls)["merge"])}
    calls = {"fields": 0, "replace": 0}
    saved = {name: getattr(dataclasses, name) for name in calls}

    def counting(name):
        def count(*args, **kwargs):
            calls[name] += 1
            return saved[name](*args, **kwargs)
        return count

    for way, merge in (("patched", cls.merge), ("own", own)):
        merge(specs)  # the first call builds what is cached
        for name in calls:
            calls[name] = 0
            setattr(dataclasses, name, counting(name))
        try:
            merge(specs)
        finally:
            for name, fn in saved.items():
                setattr(dataclasses, name, fn)
        out[way] = dict(calls)
    return out


@section("failures")
def failures():
    import child_failures

    return child_failures.run(core)


@section("o_parity", when=SPEC.get("o_parity"))
def o_parity():
    import child_o_parity

    return child_o_parity.run()


# -- last: sections that leave the process changed (plugins loaded, patches undone) --


@section("plugins", when=SPEC.get("plugins"))
def plugins():
    """vLLM's own plugin loader, as every vLLM process runs it at start, after the
    bootstrap armed the shim (PYTHONPATH: the dist-info beside the package carries
    the entry point): once, whatever arms twice (test_plugin.py)."""
    from vllm.plugins import load_general_plugins

    before = {"armed_by": core.armed_by(), "wrapped": mechanics.report()["wrapped"]}
    load_general_plugins()
    return mechanics.report(before=before, capability=mechanics.mla_capability(kvi),
                            vllm_own_merge_capability=mechanics.mla_capability(kvi, original=True))


@section("strict_cannot_tell", when="original" in _ctor and not sys.flags.optimize
         and not core.current_config().strict)
def strict_cannot_tell():
    """kv_spec_merge's check on the real vLLM whose spec constructor fails (the
    "ctor" children), decided again in strict mode: KimiHotfixError (what the
    "ctor_strict" child's import raised; the import's part is tests/unit's)."""
    import child_failures

    from kimi_hotfix.runtime import state
    from kimi_hotfix.runtime.base import KimiHotfixError, Kind, State

    cls = kvi.MLAAttentionSpec
    own = vars(cls)["__init__"]
    core.undo("kv_spec_merge")  # (earlier sections may have decided it again, unbroken)
    state.put("kv_spec_merge", State(Kind.PENDING))  # decided afresh, as at the import
    _ctor["break"](kvi)
    try:
        child_failures.strict(core, lambda: core.settle("kv_spec_merge", kvi))
    except KimiHotfixError as exc:
        return f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    finally:
        cls.__init__ = own
    return f"did not raise: {core.states()['kv_spec_merge']}"


@section("coexist", when=SPEC.get("coexist"))
def coexist():
    """Another library wraps what the shim wrapped, then undo, reapply, undo
    (test_processes.py, order "after")."""
    import other_library

    return other_library.phases(core, first=False)


def _misfit(config_class):
    """validate_block_size on a DCP8 config whose interleave does not fit the block."""
    config = config_class()
    config.parallel_config.decode_context_parallel_size = 8
    config.cache_config.block_size = 64
    config.parallel_config.cp_kv_cache_interleave_size = 128
    try:
        config.validate_block_size()
    except AssertionError as exc:
        return f"AssertionError: {exc}"
    return "accepted"


@section("reimport", when=SPEC.get("reimport"))
def reimport():
    """importlib.reload of kv_cache_interface and a fresh import of
    vllm.config.vllm (what runs before the states are read, and after), then
    undo (test_processes.py)."""
    from kimi_hotfix.runtime import parity
    def show():
        states = core.states()
        kv = sys.modules["vllm.v1.kv_cache_interface"]
        config = sys.modules["vllm.config.vllm"]
        return {"kv_spec_merge": str(states["kv_spec_merge"]),
                "merge_wrapped": core.is_wrapped(vars(kv.MLAAttentionSpec)["merge"]),
                "o_parity": str(core.parity_state()),
                "kv_plain": parity.runs_plain(kv), "config_plain": parity.runs_plain(config),
                "interleave_misfit": _misfit(config.VllmConfig)}

    old_class = kvi.MLAAttentionSpec
    out = {"before": show()}
    importlib.reload(kvi)
    # what vLLM runs now, before anything reads the states: the fix, beside vLLM's own merge
    out["reloaded_unread"] = {"capability": mechanics.mla_capability(kvi),
                              "vllm_own": mechanics.mla_capability(kvi, original=True)}
    out["reloaded"] = show()
    del sys.modules["vllm.config.vllm"]
    importlib.import_module("vllm.config.vllm")  # a fresh import of the module
    out["reimported_unread"] = parity.runs_plain(sys.modules["vllm.config.vllm"])
    out["reimported"] = show()
    out["old_class_wrapped"] = core.is_wrapped(vars(old_class)["merge"])
    core.undo()
    out["undone"] = show()
    out["old_class_wrapped_after_undo"] = core.is_wrapped(vars(old_class)["merge"])
    return out

OUT["cpu"] = round(sum(os.times()[:4]), 2)  # CPU seconds so far, with waited-for children
print("KIMI_JSON:" + json.dumps(OUT, default=repr), flush=True)
