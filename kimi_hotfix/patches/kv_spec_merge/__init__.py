"""kv_spec_merge: KV-cache spec merges that survive ``python -O`` (Kimi-K3 DSpark/DCP).

Why: vLLM 0.29.0 (PR #54277) keeps the causal Kimi-K3 target MLA layers and the
non-causal DSpark draft MLA layers apart with an ``assert`` in
``MLAAttentionSpec.merge`` and then takes ``non_causal_multi_token_decode`` from
``set.pop()``. Optimized Python (``-O``, the nightly containers) strips the
assert: the groups collapse, the draft loses its capability flag and CUDA-graph
replay hits an illegal memory access (issue #54649). Every release up to 0.33.0
still guards ``FullAttentionSpec``/``MLAAttentionSpec``/``SlidingWindowMLASpec``/
``RSWASpec``/``SinkFullAttentionSpec.merge`` with bare asserts, so ``-O`` merges
MLA specs that differ in ``cache_dtype_str`` (value picked by ``set.pop()``, i.e.
by PYTHONHASHSEED) or dies with ``AttributeError: 'MambaSpec' object has no
attribute 'cache_dtype_str'`` when MLA layers precede a Mamba/KDA layer.

What it changes: every ``merge`` classmethod defined in
``vllm.v1.kv_cache_interface`` whose source holds an ``assert`` is recompiled from
vLLM's own source with each ``assert cond, msg`` rewritten to
``if not cond: raise AssertionError(msg)`` (compiled with ``optimize=0``), so the
checks, and the planner's ``except AssertionError`` fallbacks, behave the same
with and without ``-O``, and no value is popped from an unchecked set. Because the
code is vLLM's own, fields that a later release adds are checked too. For specs
that carry ``non_causal_multi_token_decode``, the flag is merged as a group
capability, ``any(...)``, the maintainers' semantics (PR #55234): each spec is
given the group's value before the (hardened) merge runs. The physical cache
layout is untouched.

Upstream: PR #55234 (vLLM 0.30.0) fixed the capability merge and the base
``KVCacheSpec.merge`` guard; the other bare asserts are still there in 0.33.0.

Needed when (``check``): under ``-O``, some merge in the module still guards with
``assert`` (a source check, decided on its own: a failing behaviour probe cannot
hide it); or ``MLAAttentionSpec.merge`` does not merge a causal and a
non-causal MLA spec into one spec with the capability on (a behaviour probe on
real specs). A check that cannot run (no source under ``-O``, a spec that cannot
be built) cannot tell: the shim applies the patch and warns. On a vLLM whose
merge has the capability semantics, without ``-O``, it is not needed and
changes nothing. It goes away when vLLM's merges raise explicitly (the fix in
upstream/ of this repository): then the source check finds no assert.
"""

from __future__ import annotations

import dataclasses
import weakref

from kimi_hotfix import base, hardening, patching, recompile, versions, wrapping

CAPABILITY = "non_causal_multi_token_decode"
ASSERTS_MEASURED_UP_TO = "0.33.0"  # every release up to this one guards merges with assert


def has_assert(func) -> bool:
    """Does ``func``'s code hold an ``assert`` (PatchError without source)?"""
    return recompile.asserts_in(recompile.function_ast(func)) > 0


def harden(func):
    """Recompile vLLM's ``func`` with its asserts turned into explicit raises
    (``optimize=0``: the raises stay under ``-O``)."""
    return hardening.harden(func)


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


def asserted_merges(module) -> list:
    """Names of the classes whose own merge guards with ``assert`` (source check;
    PatchError where a source is unavailable)."""
    return [c.__name__ for c in merge_classes(module) if has_assert(own_merge(c))]


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
    import torch

    shape = dict(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    target, draft = mla(**shape), mla(**shape, **{CAPABILITY: True})
    try:
        merged = mla.merge([target, draft])
    except AssertionError:
        return "rejects"
    return "any" if getattr(merged, CAPABILITY, False) is True else "drops"


class KVSpecMergePatch(patching.Patch):
    name = "kv_spec_merge"
    target = "vllm.v1.kv_cache_interface"
    wraps = ("KVCacheSpec.merge", "FullAttentionSpec.merge", "MLAAttentionSpec.merge",
             "SlidingWindowMLASpec.merge", "RSWASpec.merge", "SinkFullAttentionSpec.merge")
    wraps_note = ("every merge classmethod of the module that guards with assert or carries "
                  "the draft capability; those above in 0.29.0 to 0.33.0")
    upstream = "PR #55234 (issue #54649)"
    fixed_in = "0.30.0"
    symptoms = (
        ("illegal memory access in CUDA-graph replay (DSpark/DCP draft, python -O)",
         "AttributeError: 'MambaSpec' object has no attribute 'cache_dtype_str'",
         "MLA layers with different cache_dtype_str merged (python -O; varies with "
         "PYTHONHASHSEED)"),
        # measured on a served hybrid model (tests/e2e); by the planner's code, any model
        # whose layers mix sliding-window and full attention (Gemma-2/3, gpt-oss style)
        ("AttributeError: 'SlidingWindowSpec' object has no attribute 'attention_chunk_size'",
         "at engine start-up, then Engine core initialization failed (python -O; a model mixing "
         "sliding-window and full-attention layers, full layer first)",
         "sliding layer first (python -O): no error, one KV-cache group, another KV cache size, "
         "greedy text departs from plain Python's after the window"),
    )
    summary = "merge checks raise AssertionError under -O; the draft capability merges with any()"
    decides = ("under -O: a source check for merges still guarded by assert; and a "
               "behaviour probe: MLAAttentionSpec.merge(target, draft) keeps the capability")
    probe_title = "vLLM's planner groups Kimi-K3 MLA target + DSpark draft + KDA layers"
    asserts_measured_up_to = ASSERTS_MEASURED_UP_TO
    fixed_in_text = (f"{fixed_in} (the capability); the -O asserts: not fixed in any release "
                     f"up to {ASSERTS_MEASURED_UP_TO}")

    def check(self, module, optimize):
        merge_classes(module)  # PatchError where the merges are not there at all
        if optimize:
            try:
                guarded = asserted_merges(module)
            except base.PatchError as exc:  # no source: the -O fix cannot be ruled out
                return patching.cannot_tell(f"under -O: {exc}")
            if guarded:
                return patching.needed(f"-O strips the asserts of {', '.join(guarded)}.merge")
        merge = capability_merge(module)  # raising: core reports "cannot tell"
        if merge in ("drops", "rejects"):
            return patching.needed(f"MLAAttentionSpec.merge {merge} the DSpark draft capability")
        live = "no merge relies on assert" if optimize else "asserts are live without -O"
        if merge == "absent":
            return patching.absent(f"no MLA draft capability in this vLLM; {live}")
        return patching.fixed(f"MLAAttentionSpec.merge keeps the draft capability; {live}")

    def apply(self, module, ctx):
        plan = []
        for cls in merge_classes(module):
            if wrapping.owner_of(vars(cls)["merge"]) == self.name:
                continue  # applied already (another copy of the shim)
            func = own_merge(cls)
            hardened, capability = has_assert(func), _has_capability(cls)
            if hardened or capability:
                plan.append((cls, harden(func) if hardened else func, hardened, capability))
        # Recompile everything first, then wrap: a failure leaves vLLM untouched.
        for cls, impl, hardened, capability in plan:
            ctx.wrap(cls, "merge", _make_wrapper(impl, hardened, capability, ctx))


    def expect(self, version, optimize):
        if version is None:
            return super().expect(version, optimize)
        if not optimize:
            needed, text = super().expect(version, optimize)
            if not versions.at_least(version, "0.29.0"):
                needed, text = False, f"not needed: vLLM {version} merges the capability with any()"
            return needed, text + "; under -O it is needed while the merges guard with assert"
        return self.expect_optimized(version, "a spec merge")

    def probe(self):
        return patching.run_probe(self)  # probe.py, beside this file


def _make_wrapper(impl, hardened: bool, capability: bool, ctx):
    instead = (("the rebuilt merge (asserts as explicit raises)" if hardened
                else "vLLM's own merge") + " runs without the group capability")

    def merge_wrapper(wrapped, instance, args, kwargs):
        cls = instance  # the class the classmethod was looked up on
        try:
            if not isinstance(cls, type):
                cls = type(instance)
            if capability:
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
