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

Needed when: the installed ``MLAAttentionSpec.merge`` does not merge a causal and a
non-causal MLA spec into one spec with the capability on (a behaviour probe), or
the interpreter runs with ``-O`` and some merge in the module still guards with an
``assert`` (a source check). On a vLLM whose merge already has the capability
semantics and that runs without ``-O``, the patch is not needed and changes
nothing. Without source files, the version string decides (fixed in 0.30.0).
"""

from __future__ import annotations

import ast
import dataclasses
import sys

from kimi_hotfix import core, recompile

CAPABILITY = "non_causal_multi_token_decode"


class _AssertToRaise(ast.NodeTransformer):
    """``assert test, msg`` -> ``if not test: raise AssertionError(msg)``."""

    def visit_Assert(self, node):
        raise_exc = ast.Raise(
            exc=ast.Call(
                func=ast.Name(id="AssertionError", ctx=ast.Load()),
                args=[node.msg] if node.msg is not None else [],
                keywords=[],
            ),
            cause=None,
        )
        check = ast.If(
            test=ast.UnaryOp(op=ast.Not(), operand=node.test), body=[raise_exc], orelse=[]
        )
        return ast.copy_location(check, node)


def has_assert(func) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(recompile.function_ast(func)))


def harden(func):
    """Recompile vLLM's ``func`` with its asserts turned into explicit raises
    (``optimize=0``: the raises stay under ``-O``)."""
    return recompile.recompile(func, _AssertToRaise().visit, optimize=0)


def merge_classes(module):
    """Classes of ``module`` that define their own ``merge`` classmethod."""
    base = getattr(module, "KVCacheSpec", None)
    if base is None:
        raise core.PatchError("vllm.v1.kv_cache_interface.KVCacheSpec not found")
    found = []
    for obj in vars(module).values():
        if (
            isinstance(obj, type)
            and issubclass(obj, base)
            and obj.__module__ == module.__name__
            and isinstance(vars(obj).get("merge"), classmethod)
        ):
            found.append(obj)
    if not found:
        raise core.PatchError("no merge classmethods found in vllm.v1.kv_cache_interface")
    return found


def _has_capability(cls) -> bool:
    return dataclasses.is_dataclass(cls) and any(
        f.name == CAPABILITY for f in dataclasses.fields(cls)
    )


def probe_capability_merge(module) -> tuple[bool, str]:
    """Does the installed MLAAttentionSpec.merge merge target + draft with the
    capability on? Builds two real specs (Kimi-K3 MLA shape) and merges them."""
    import torch

    mla = getattr(module, "MLAAttentionSpec", None)
    if mla is None or not _has_capability(mla):
        return True, "no MLA capability field in this vLLM"
    shape = dict(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    target = mla(**shape)
    draft = mla(**shape, **{CAPABILITY: True})
    try:
        merged = mla.merge([target, draft])
    except AssertionError:
        return False, "MLAAttentionSpec.merge rejects target + draft"
    if getattr(merged, CAPABILITY, False) is not True:
        return False, "MLAAttentionSpec.merge drops the draft capability"
    return True, "MLAAttentionSpec.merge has the capability semantics"


class KVSpecMergePatch(core.Patch):
    name = "kv_spec_merge"
    target = "vllm.v1.kv_cache_interface"
    wraps = (
        "KVCacheSpec.merge",
        "FullAttentionSpec.merge",
        "MLAAttentionSpec.merge",
        "SlidingWindowMLASpec.merge",
        "RSWASpec.merge",
        "SinkFullAttentionSpec.merge",
        "(every other merge with an assert)",
    )
    upstream = "vllm-project/vllm PR #55234 (issue #54649)"
    fixed_in = "0.30.0"
    summary = "merge checks raise AssertionError under -O; draft capability merges with any()"
    decides = (
        "behaviour probe: MLAAttentionSpec.merge(target, draft) keeps the capability; "
        "source check: under -O, any merge still guarded by assert"
    )

    def check(self, module):
        try:
            classes = merge_classes(module)
            with_asserts = [c.__name__ for c in classes if has_assert(vars(c)["merge"].__func__)]
        except core.PatchError as exc:
            return self.version_fallback(str(exc))
        capability_ok, why = probe_capability_merge(module)
        if sys.flags.optimize and with_asserts:
            return True, f"-O strips the asserts of {', '.join(with_asserts)}.merge"
        if not capability_ok:
            return True, why
        if sys.flags.optimize:
            return False, f"{why}; no merge relies on assert"
        return False, f"{why}; asserts are live without -O"

    def apply(self, module, wrap):
        plan = []
        for cls in merge_classes(module):
            func = vars(cls)["merge"].__func__
            if core.is_wrapped(vars(cls)["merge"]):
                continue
            needs_hardening = has_assert(func)
            capability = _has_capability(cls)
            if needs_hardening or capability:
                impl = harden(func) if needs_hardening else func
                plan.append((cls, impl, capability))
        # Recompile everything first, then wrap: a failure leaves vLLM untouched.
        for cls, impl, capability in plan:
            wrap(cls, "merge", _make_wrapper(impl, capability))


def _make_wrapper(impl, capability: bool):
    def merge_wrapper(wrapped, instance, args, kwargs):
        # ``instance`` is the class the classmethod was looked up on.
        cls = instance if isinstance(instance, type) else type(instance)
        if capability:
            try:
                args, kwargs = _with_group_capability(args, kwargs)
            except Exception as exc:
                core.wrapper_failed(PATCH.name, exc)
        return impl(cls, *args, **kwargs)

    merge_wrapper.__qualname__ = f"kimi_hotfix.kv_spec_merge[{impl.__qualname__}]"
    return merge_wrapper


def _with_group_capability(args, kwargs):
    specs = args[0] if args else kwargs["specs"]
    group = any(getattr(spec, CAPABILITY, False) for spec in specs)
    same = [
        dataclasses.replace(spec, **{CAPABILITY: group})
        if _has_capability(type(spec)) and getattr(spec, CAPABILITY) != group
        else spec
        for spec in specs
    ]
    if args:
        return (same, *args[1:]), kwargs
    return args, {**kwargs, "specs": same}


PATCH = KVSpecMergePatch()
