"""Child-side helpers for the mechanics tests (imported inside subprocesses).

A child appends this directory to ``sys.path`` *after* start-up (so it never
shadows anything the bootstrap sees), imports this module and prints
``report(...)`` as one ``KIMI_JSON:`` line for the test to read.

``wrapped_layers`` walks every class of the given modules and counts, for each
attribute that carries the shim's marker, how many marked wrapper layers are
stacked on it (following ``__wrapped__``): the idempotence tests require 1.
"""

import json
import sys

JSON_MARK = "KIMI_JSON:"


def wrapped_layers(module):
    """{"Class.attr": {"patch": name, "layers": n}} for marked attributes."""
    from kimi_hotfix.runtime.wrapping import MARKER

    found = {}
    owners = [(module.__name__, module)] + [
        (cname, cls) for cname, cls in sorted(vars(module).items())
        if isinstance(cls, type) and cls.__module__ == module.__name__]
    for oname, owner in owners:  # module-level functions, then each class's attributes
        for attr, value in list(vars(owner).items()):
            layers, obj = 0, value
            while getattr(obj, MARKER, None) is not None:
                layers += 1
                obj = obj.__wrapped__
            if layers:
                found[f"{oname}.{attr}"] = {"patch": getattr(value, MARKER), "layers": layers}
    return found


def recorded(core=None):
    """{"Class.attr": patch} from the shim's own undo records."""
    from kimi_hotfix.runtime import state
    return {
        f"{rec.owner.__name__}.{rec.attr}": name
        for name, recs in state.all_records().items()
        for rec in recs
    }


def report(**extra):
    """State of the shim in this process, for every loaded target module."""
    from kimi_hotfix.runtime import core, registry
    wrapped = {}
    for patch in registry.patches().values():
        module = sys.modules.get(patch.target)
        if module is not None:
            wrapped.update(wrapped_layers(module))
    sc = sys.modules.get("kimi_hotfix_sitecustomize")
    out = {
        "pid": __import__("os").getpid(),
        "optimize": sys.flags.optimize,
        "states": {name: str(state) for name, state in core.states().items()},
        "kinds": {name: state.kind.value for name, state in core.states().items()},
        "armed_by": core.armed_by(),
        "wrapped": wrapped,
        "recorded": recorded(core),
        "bootstrap_loaded": sc is not None,
        "bootstrap_armed": getattr(sc, "ARMED", None),
        "chained": list(getattr(sc, "CHAINED", [])) if sc else [],
        "trigger_in_meta_path": any(
            type(f).__name__ == "VllmImportTrigger" for f in sys.meta_path
        ),
        "kimi_hotfix_file": sys.modules["kimi_hotfix"].__file__,
    }
    out.update(extra)
    return out


def emit(obj):
    print(JSON_MARK + json.dumps(obj, default=repr), flush=True)


def mla_capability(kv, original=False):
    """Real vLLM: merge a Kimi-K3 target MLA spec with a DSpark draft spec and
    return the merged capability flag (or the exception's type name).

    ``original=True`` calls vLLM's own merge (the raw classmethod under the
    shim's wrapper, if any): the unpatched behaviour in this very interpreter,
    i.e. the bug's reproduction next to the fix."""
    import torch

    cls = kv.MLAAttentionSpec
    merge = cls.merge
    if original:
        raw = vars(cls)["merge"]
        while hasattr(raw, "_self_kimi_hotfix_patch"):
            raw = raw.__wrapped__
        merge = raw.__get__(None, cls)
    shape = dict(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    target = cls(**shape)
    draft = cls(**shape, non_causal_multi_token_decode=True)
    try:
        return merge([target, draft]).non_causal_multi_token_decode
    except Exception as exc:  # 0.29.0 without -O: the assert rejects the pair
        return type(exc).__name__
