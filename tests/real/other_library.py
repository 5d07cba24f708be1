"""Another library's instrumentation, as APM agents install it: a functools.wraps
wrapper (this file) on a module function, a wrapt FunctionWrapper on a classmethod
(test_processes.py, the coexistence test). ``phases()`` is what the harness child
runs after the other library wrapped: before the shim settled (``first``, the
``late`` child: the hooks below are registered before vLLM is imported, and the
shim arms after, through vLLM's plugin loader) or after it (``after``, the
PYTHONOPTIMIZE=1 child). No ``assert``: it runs under -O."""

import functools

import wrapt

CALLS = {"getter": 0, "merge": 0}


def wrap_getter(module):
    original = module.get_inner_dp_world_group

    @functools.wraps(original)
    def get_inner_dp_world_group(*args, **kwargs):
        CALLS["getter"] += 1
        return original(*args, **kwargs)

    module.get_inner_dp_world_group = get_inner_dp_world_group


def wrap_merge(module):
    def merge(wrapped, instance, args, kwargs):
        CALLS["merge"] += 1
        return wrapped(*args, **kwargs)

    wrapt.wrap_function_wrapper(module, "MLAAttentionSpec.merge", merge)


def register_first():
    """The hooks, registered before vLLM (and the shim's settling) run."""
    wrapt.register_post_import_hook(wrap_getter, "vllm.distributed.parallel_state")
    wrapt.register_post_import_hook(wrap_merge, "vllm.v1.kv_cache_interface")


def _phase(core, ps, kvi, capability_merge):
    before = dict(CALLS)
    try:
        getter = f"returned {ps.get_inner_dp_world_group()!r}"
    except AssertionError:
        getter = "AssertionError"
    states = core.states()
    outer_getter = ps.get_inner_dp_world_group
    below_getter = outer_getter.__closure__[outer_getter.__code__.co_freevars.index("original")]
    outer_merge = vars(kvi.MLAAttentionSpec)["merge"]
    layers = {  # outermost first: who is on the attribute, and what it calls
        "getter": [outer_getter.__code__.co_filename.rpartition("/")[2],
                   type(below_getter.cell_contents).__name__],
        "merge": [type(outer_merge).__name__, type(outer_merge.__wrapped__).__name__]}
    return {"getter": getter, "merge": capability_merge(kvi), "layers": layers,
            "calls": {k: CALLS[k] - before[k] for k in before},
            "kv_spec_merge": str(states["kv_spec_merge"]),
            "o_parity": str(core.parity_state())}


def phases(core, first):
    """applied, undone, reapplied, undone again; ``first``: the hooks ran at import,
    else the other library wraps now, what the shim wrapped."""
    import vllm.distributed.parallel_state as ps
    import vllm.v1.kv_cache_interface as kvi

    from kimi_hotfix.patches.kv_spec_merge import capability_merge

    if not first:
        wrap_getter(ps)
        wrap_merge(kvi)
    out = {"applied": _phase(core, ps, kvi, capability_merge)}
    core.undo()
    out["undone"] = _phase(core, ps, kvi, capability_merge)
    core.reapply()
    out["reapplied"] = _phase(core, ps, kvi, capability_merge)
    core.undo()
    out["undone_again"] = _phase(core, ps, kvi, capability_merge)
    return out
