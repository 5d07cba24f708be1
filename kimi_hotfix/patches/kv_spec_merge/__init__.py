"""kv_spec_merge: the DSpark draft capability survives the KV-cache spec merge (Kimi-K3 DSpark/DCP).

Why: vLLM 0.29.0 (PR #54277) keeps the causal Kimi-K3 target MLA layers and the
non-causal DSpark draft MLA layers apart with an ``assert`` in
``MLAAttentionSpec.merge`` and then takes ``non_causal_multi_token_decode`` from
``set.pop()``. Optimized Python (``-O``, the nightly containers) strips the
assert: the groups collapse, the draft loses its capability flag and CUDA-graph
replay hits an illegal memory access (issue #54649). With the assert live
(plain Python, or ``-O`` with the shim's -O parity) the merge refuses the pair
and the planner falls back to separate groups, which is not what the
maintainers chose either.

What it changes: ``merge`` of every spec class of ``vllm.v1.kv_cache_interface``
that carries the capability field (``MLAAttentionSpec``; its subclasses inherit
the wrapper) is wrapped: the flag is merged as a group capability,
``any(...)``, the maintainers' semantics (PR #55234): each spec is given the
group's value before vLLM's own merge runs, so the target and its draft merge
into one spec with the capability on, and each call's
``CommonAttentionMetadata.causal`` picks causal or non-causal at run time. The
physical cache layout is untouched. The merges' other asserts are -O parity's
(kimi_hotfix.runtime.parity): with it in force they run as in plain Python.

Upstream: PR #55234 (vLLM 0.30.0) merges the capability with ``any()``.

Needed when (``check``): ``MLAAttentionSpec.merge`` does not merge a causal and
a non-causal MLA spec into one spec with the capability on (a behaviour probe
on two real specs: it "drops" the flag, as 0.29.0 under bare ``-O``, or
"rejects" the pair, as 0.29.0 with its assert live). No MLA spec with the
field: not affected (0.28.0). A merge that keeps it: not needed (0.30.0 on).
"""

from __future__ import annotations

import dataclasses
import weakref

from kimi_hotfix.runtime import base, patching, wrapping

CAPABILITY = "non_causal_multi_token_decode"


def merge_classes(module):
    """Classes of ``module`` that define their own ``merge`` classmethod."""
    spec_base = getattr(module, "KVCacheSpec", None)
    if spec_base is None:
        raise base.PatchError("vllm.v1.kv_cache_interface.KVCacheSpec not found")
    found = [
        obj for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, spec_base)
        and obj.__module__ == module.__name__ and isinstance(vars(obj).get("merge"), classmethod)
    ]
    if not found:
        raise base.PatchError("no merge classmethods found in vllm.v1.kv_cache_interface")
    return found


def own_merge(cls):
    """vLLM's own merge function of ``cls`` (beneath any other library's wrapper)."""
    found = wrapping.vllm_own(cls, "merge")
    if not isinstance(found, classmethod):
        raise base.PatchError(f"{cls.__name__}.merge is wrapped by another library down to "
                              f"{type(found).__name__}, not vLLM's classmethod")
    return found.__func__


def _has_capability(cls) -> bool:
    """Is the draft capability a dataclass field of ``cls``? Cached per class:
    the merge wrapper asks for every spec it changes, on every call."""
    known = _CAPABLE.get(cls)
    if known is None:
        known = dataclasses.is_dataclass(cls) and any(
            f.name == CAPABILITY for f in dataclasses.fields(cls))
        _CAPABLE[cls] = known
    return known


_CAPABLE: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def capability_merge(module) -> str:
    """How the installed MLAAttentionSpec.merge treats a Kimi-K3 target + DSpark
    draft pair (two real specs): "absent" (no such spec or field), "any" (one
    spec, capability on), "drops" or "rejects" (AssertionError). Raises where the
    specs cannot be built."""
    mla = getattr(module, "MLAAttentionSpec", None)
    if mla is None or not _has_capability(mla):
        return "absent"
    torch = vars(module).get("torch")  # the module's own torch (vLLM's imports it)
    if torch is None:
        import torch

    shape = dict(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    target, draft = mla(**shape), mla(**shape, **{CAPABILITY: True})
    try:
        merged = mla.merge([target, draft])
    except AssertionError:
        return "rejects"
    return "any" if getattr(merged, CAPABILITY, False) is True else "drops"


class KVSpecMergePatch(patching.Patch):
    wraps = ("MLAAttentionSpec.merge",)

    def decide(self, module, optimize):
        merge_classes(module)  # PatchError where the merges are not there at all
        merge = capability_merge(module)  # raising: core reports "cannot tell"
        if merge == "absent":
            return patching.absent("no MLA draft capability in this vLLM")
        if merge in ("drops", "rejects"):
            return patching.needed(f"MLAAttentionSpec.merge {merge} the DSpark draft capability")
        return patching.fixed("MLAAttentionSpec.merge keeps the draft capability (any())")

    def apply(self, module, ctx):
        plan = []
        for cls in merge_classes(module):
            if wrapping.owner_of(vars(cls)["merge"]) == self.name:
                continue  # applied already (another copy of the shim)
            if _has_capability(cls):
                plan.append((cls, own_merge(cls)))
        for cls, impl in plan:  # every merge found first: a failure leaves vLLM untouched
            ctx.wrap(cls, "merge", _make_wrapper(impl, ctx))


def _make_wrapper(impl, ctx):
    instead = "vLLM's own merge runs without the group capability"

    def merge_wrapper(wrapped, instance, args, kwargs):
        cls = instance  # the class the classmethod was looked up on
        try:
            if not isinstance(cls, type):
                cls = type(instance)
            args, kwargs = _with_group_capability(args, kwargs)
        except Exception as exc:
            ctx.failed(exc, instead)
        return impl(cls, *args, **kwargs)

    merge_wrapper.__qualname__ = f"kimi_hotfix.kv_spec_merge[{impl.__qualname__}]"
    return merge_wrapper


def _with_group_capability(args, kwargs):
    """The specs with the group's capability (any member's) on every member
    that has the field. Where no member has it on, nothing changes: the specs
    pass as they are, with no copy (the common case, one scan)."""
    specs = args[0] if args else kwargs["specs"]
    group = any(getattr(spec, CAPABILITY, False) for spec in specs)
    if not group:
        return args, kwargs
    same = [
        dataclasses.replace(spec, **{CAPABILITY: group})
        if getattr(spec, CAPABILITY, group) != group and _has_capability(type(spec))
        else spec
        for spec in specs
    ]
    if args:
        return (same, *args[1:]), kwargs
    return args, {**kwargs, "specs": same}


PATCH = KVSpecMergePatch()
