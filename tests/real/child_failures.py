"""Each patch's own code made to fail, on the real vLLM (child side).

With each patch toggled on, the helper its wrapper calls is replaced by one
that raises; the calls then show what vLLM ran instead (and, in strict mode,
KimiHotfixError). The log lines are on stderr after ``KIMI_SECTION:failures``.
Runs inside child.py; no ``assert`` (the child may run under -O)."""

import traceback

SEED = {"max_num_seqs": 48, "num_spec": 8}


def broken(*args, **kwargs):
    raise RuntimeError("injected failure in the patch code")


def _outcome(call):
    try:
        return ["ok", call()]
    except Exception as exc:
        last = traceback.extract_tb(exc.__traceback__)[-1]
        return [type(exc).__name__, str(exc)[:300], last.filename, last.line]


def _swapped(module, attr, fn):
    """Run ``fn`` with ``module.attr`` replaced by ``broken``."""
    saved = getattr(module, attr)
    setattr(module, attr, broken)
    try:
        return fn()
    finally:
        setattr(module, attr, saved)


def kda(core):
    from kimi_hotfix.patches import kda_overlong_rows as patch
    from kimi_hotfix.patches.kda_overlong_rows import probe

    within = ([9] * 4, None, [8] * 4, [50] * 4)

    def calls():
        builder = probe.make_builder(**SEED)
        batches = [within, ([10] * 4,)] * 3  # within capacity, over-long
        return [_outcome(lambda b=b: probe.serialize_metadata(builder.build(*probe.build_args(*b))))
                for b in batches]

    def own():  # the within-capacity batch through vLLM's own build, nothing of the shim's
        builder = probe.make_builder(**SEED)
        return _outcome(lambda: probe.serialize_metadata(builder.build(*probe.build_args(*within))))

    from kimi_hotfix.tools.preflight import toggled  # check's own toggle
    with toggled(patch.PATCH.name, True):
        result = _swapped(patch, "route_overlong_rows", calls)
    from kimi_hotfix.tools.preflight import toggled  # check's own toggle
    with toggled(patch.PATCH.name, False):
        unpatched = own()
    return {"calls": [c[:2] if c[0] == "ok" else c for c in result], "own_within": unpatched[:2]}


def kv(core):
    import torch
    from vllm.v1 import kv_cache_interface as kvi

    from kimi_hotfix.patches import kv_spec_merge as patch

    cls = kvi.MLAAttentionSpec
    shape = dict(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    target, draft = cls(**shape), cls(**shape, non_causal_multi_token_decode=True)

    def calls():
        own = vars(cls)["merge"]
        while core.is_wrapped(own):
            own = own.__wrapped__
        own = own.__get__(None, cls)  # vLLM's own merge, as this interpreter compiled it
        out = []
        for i in range(10):
            specs = [target, target] if i % 2 else [target, draft]
            out.append({"patched": _outcome(lambda s=specs: repr(cls.merge(s)))[:2],
                        "vllm_own": _outcome(lambda s=specs: repr(own(s)))[:2]})
        return out

    from kimi_hotfix.tools.preflight import toggled  # check's own toggle
    with toggled(patch.PATCH.name, True):
        return _swapped(patch, "_with_group_capability", calls)


def capture(core):
    from kimi_hotfix.patches import capture_workspace as patch
    from kimi_hotfix.patches.capture_workspace import probe

    def plan():
        result = probe.capture_plan(**SEED)
        return {k: result[k] for k in ("largest_mixed", "capture_descs", "candidates")}

    from kimi_hotfix.tools.preflight import toggled  # check's own toggle
    with toggled(patch.PATCH.name, False):
        own = plan()
    from kimi_hotfix.tools.preflight import toggled  # check's own toggle
    with toggled(patch.PATCH.name, True):
        failing = _outcome(lambda: _swapped(patch, "clamped_view", plan))
        read_only = _outcome(lambda: _read_only_manager(plan))
        counted = core.states()[patch.PATCH.name].as_dict()["failures"]
        own_raise = _vllm_raises()
        own_raise["failures_counted"] = (core.states()[patch.PATCH.name].as_dict()["failures"]
                                         - counted)
    from kimi_hotfix.tools.preflight import toggled  # check's own toggle
    with toggled(patch.PATCH.name, False):
        own_raise_unpatched = _vllm_raises()
    return {"vllm_own": own, "failing": failing, "read_only": read_only,
            "view_writes": _view_writes(patch),
            "vllm_raises": {"patched": own_raise, "unpatched": own_raise_unpatched}}


def _vllm_raises():
    """vLLM's own ``_init_candidates`` raises part-way: the LoRA cases are a
    list that raises on its third pass (``__init__``'s dispatch map, the
    descriptor loop, then the candidate table, after ``_capture_descs`` is
    filled). What reaches the caller, how many passes ran, the plan left."""
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager

    from kimi_hotfix.patches import _recoverssm as probing
    from kimi_hotfix.patches.capture_workspace import probe

    error = ValueError("raised by vLLM's own _init_candidates")

    class Cases(list):
        passes = 0

        def __iter__(self):
            Cases.passes += 1
            if Cases.passes >= 3:
                raise error
            return super().__iter__()

    mode = probing.graph_mode(probe.DEFAULT_MODE)
    config = probing.vllm_config(**SEED)
    probing.set_capture_sizes(config, mode)
    managers = []

    class Manager(CudaGraphManager):  # keeps the instance vLLM's __init__ was building
        def __init__(self, *args, **kwargs):
            managers.append(self)
            super().__init__(*args, **kwargs)

    with probing.cpu_graph_stubs():
        try:
            Manager(config, probing.device(), mode, 1 + SEED["num_spec"],
                    lora_capture_cases=Cases([0]))
            raised = None
        except Exception as exc:
            raised = exc
    (manager,) = managers
    return {
        "raised_same_object": raised is error,
        "raised": None if raised is None else f"{type(raised).__name__}: {raised}",
        "passes": Cases.passes,
        "plan": [len(getattr(manager, "_capture_descs", {})),
                 len(getattr(manager, "_candidates", {}))],
        "capture_modes": sorted(m.name for m in getattr(manager, "_capture_descs", {})),
    }


def _read_only_manager(plan):
    """A manager whose compilation_config cannot be re-assigned once set: the
    patch's swap fails inside the wrapper."""
    from vllm.v1.worker.gpu import cudagraph_utils

    base = cudagraph_utils.CudaGraphManager

    class Frozen(base):
        def __setattr__(self, name, value):
            if name == "compilation_config" and "compilation_config" in vars(self):
                raise AttributeError("compilation_config is read-only here")
            super().__setattr__(name, value)

    cudagraph_utils.CudaGraphManager = Frozen  # the probe looks the class up at call time
    try:
        return plan()
    finally:
        cudagraph_utils.CudaGraphManager = base


def _view_writes(patch):
    """What writing to the clamped view does to the shared config."""
    from kimi_hotfix.patches import _recoverssm

    shared = _recoverssm.vllm_config().compilation_config
    before = list(shared.cudagraph_capture_sizes or [])
    view = patch.ClampedCompilationConfig(shared, [1, 2])
    view.cudagraph_capture_sizes = [4]
    view.max_cudagraph_capture_size = 4
    return {"view": [view.cudagraph_capture_sizes, view.max_cudagraph_capture_size],
            "shared_sizes_same": list(shared.cudagraph_capture_sizes or []) == before,
            "shared_max": shared.max_cudagraph_capture_size}


def strict(core, fn):
    """``fn()`` in strict mode: this process's configuration with strict on, as
    KIMI_HOTFIX_STRICT=1 gives it (parsed once at arming: tests/unit checks the
    variable), put back after. It saves a process of its own (issue 30)."""
    import dataclasses

    from kimi_hotfix.runtime import state
    cfg = state.config()
    state.configure(dataclasses.replace(cfg, strict=True), {})
    try:
        return fn()
    finally:
        state.configure(cfg, {})


def run(core):
    out = {"kda_overlong_rows": kda(core), "kv_spec_merge": kv(core),
           "capture_workspace": capture(core)}
    out["states_after"] = {name: s.as_dict() for name, s in core.states().items()}
    # the router failing in strict mode (what the "strict" child showed)
    out["kda_overlong_rows_strict"] = strict(core, lambda: kda(core))
    return out
