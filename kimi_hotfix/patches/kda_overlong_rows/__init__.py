"""kda_overlong_rows: route over-long KDA rows out of RecoverSSM's speculative set.

Why: with RecoverSSM on, ``KimiK3KDAMetadataBuilder.build`` (vLLM 0.29.0, 0.30.0)
treats every active decode row as a speculative row and raises ``ValueError: KDA
RecoverSSM speculative decode query length exceeds its activation capacity
(k + 1)`` when a row holds more than ``num_spec + 1`` tokens. CUDA-graph capture
(see capture_workspace) and eager dummy runs (adaptive verification profiling
probes batches above the capture limit) build such rows, so 0.30.0, which fixed
the capture plan, still crashes at startup.

What it changes: when a batch holds a row longer than ``num_spec + 1`` tokens,
exactly the speculative rows among those are marked non-speculative before
vLLM's own code runs (their ``num_decode_draft_tokens_cpu`` entry becomes -1 and
their ``is_prefilling`` entry True, on copies), so they take the non-speculative
(prefill) path, as vLLM 0.31.0 does, instead of raising.

How: ``build`` runs every engine step, and any wrapper's extra Python frame
costs it several microseconds (bench/kda_fast_path.py). So ``build`` is
recompiled from vLLM's own source (kimi_hotfix/recompile.py, after checking that
the source matches the running code) with one guard inserted before its first
statement:

    try:
        if self.use_recoverssm and common_attn_metadata.max_query_len > self.num_spec + 1:
            common_attn_metadata, num_decode_draft_tokens_cpu = <route>(...)
    except Exception as exc:
        <log once, keep vLLM's inputs; strict mode raises>

The fast path is an int comparison (no tensor is touched) in vLLM's own frame;
the rest of the body is vLLM's, compiled like the running interpreter compiles
it (asserts stay asserts under ``-O``, exactly as unpatched). Where the source is
unavailable or does not match, a ``wrapt`` wrapper does the same (slower).

Upstream: vllm-project/vllm PR #55774 follow-up, released in 0.31.0
(``spec_sequence_masks_cpu &= query_lens <= num_spec + 1``).

Needed when (``check``): the installed ``build`` has a RecoverSSM path
(``use_recoverssm``) and does not route rows by ``<= self.num_spec + 1`` (source
check). Not affected where the builder has no RecoverSSM path (0.28.0); not
needed once it routes them itself (0.31.0). Where the source is unavailable it
cannot tell: the shim applies it (the wrapt fallback) and warns.
"""

from __future__ import annotations

import ast
import inspect
import re

from kimi_hotfix import base, core, recompile

_ROUTES = re.compile(r"<=\s*self\.num_spec\s*\+\s*1")
_PARAMS = (
    "common_prefix_len",
    "common_attn_metadata",
    "num_accepted_tokens",
    "num_decode_draft_tokens_cpu",
    "fast_build",
)
# what the inserted guard needs from build's signature (after self)
_GUARD_PARAMS = ("common_attn_metadata", "num_decode_draft_tokens_cpu")
_GUARD = """
try:
    if self.use_recoverssm and common_attn_metadata.max_query_len > self.num_spec + 1:
        common_attn_metadata, num_decode_draft_tokens_cpu = _kimi_hotfix_route(
            self, common_attn_metadata, num_decode_draft_tokens_cpu
        )
except Exception as _kimi_hotfix_exc:
    _kimi_hotfix_failed(_kimi_hotfix_exc)
"""

# True: install the recompiled build (the default); False: the wrapt wrapper,
# which is what happens anyway where vLLM's source cannot be used (tests flip it).
INLINE = True


def route_overlong_rows(builder, metadata, draft):
    """(metadata, draft) with the speculative rows longer than num_spec + 1
    marked non-speculative; the inputs themselves when no such row exists.

    Runs on every step with some row over k + 1 tokens (any long prefill
    chunk). The test is plain Python on ``tolist()`` copies of three small CPU
    tensors: inside the real builder that measured about half the cost of the
    same test in torch ops, and a third of numpy views (bench/kda_fast_path.py,
    part 3). Tensors are built only when a row must move."""
    if draft is None or metadata.is_prefilling is None:
        return metadata, draft  # no speculative set: nothing can overflow
    starts = metadata.query_start_loc_cpu.tolist()
    capacity = builder.num_spec + 1
    # speculative rows as vLLM 0.29 counts them: a draft, or an active decode;
    # an ordinary prefill chunk (no draft, prefilling) already takes that path
    over = [
        end - start > capacity and (drafted >= 0 or not prefilling)
        for start, end, drafted, prefilling in zip(
            starts, starts[1:], draft.tolist(), metadata.is_prefilling.tolist()
        )
    ]
    if not any(over):
        return metadata, draft
    mask = metadata.is_prefilling.new_tensor(over)  # bool, on the CPU like is_prefilling
    draft = draft.clone()
    draft[mask] = -1
    return metadata.replace(is_prefilling=metadata.is_prefilling | mask), draft


def _route(builder, metadata, draft):
    # looked up at call time (slow path only), so a test can swap the router
    return route_overlong_rows(builder, metadata, draft)


_INSTEAD = "vLLM's own build runs on the unrouted rows"


def _failed(exc):
    core.wrapper_failed(PATCH.name, exc, _INSTEAD)


def _insert_guard(tree):
    funcdef = tree.body[0]
    guard = ast.parse(_GUARD).body
    for node in guard:  # the guard's lines are reported as build's def line
        for child in ast.walk(node):
            if "lineno" in child._attributes:
                child.lineno = child.end_lineno = funcdef.lineno
                child.col_offset, child.end_col_offset = funcdef.col_offset, funcdef.col_offset
    body = funcdef.body
    docstring = (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                 and isinstance(body[0].value.value, str))
    funcdef.body = body[:1] + guard + body[1:] if docstring else guard + body


def inline_build(build):
    """vLLM's ``build`` recompiled with the guard; PatchError where it cannot be."""
    params = inspect.signature(build).parameters
    names = list(params)
    if not names or names[0] != "self" or any(p not in params for p in _GUARD_PARAMS):
        raise base.PatchError(f"unexpected signature of build: {names}")
    if any(name.startswith("_kimi_hotfix") for name in build.__code__.co_varnames
           + build.__code__.co_names):
        raise base.PatchError("build already uses the guard's names")
    return recompile.recompile(
        build,
        _insert_guard,
        cells={"_kimi_hotfix_route": _route, "_kimi_hotfix_failed": _failed},
    )


def build_wrapper(wrapped, instance, args, kwargs):
    """The wrapt fallback: the same guard and routing around vLLM's build."""
    try:
        metadata = args[1] if len(args) > 1 else kwargs["common_attn_metadata"]
        fast = not instance.use_recoverssm or metadata.max_query_len <= instance.num_spec + 1
    except Exception as exc:
        core.wrapper_failed(PATCH.name, exc, _INSTEAD)
        fast = True
    if fast:
        return wrapped(*args, **kwargs)
    try:
        bound = dict(zip(_PARAMS, args))
        bound.update(kwargs)
        metadata, draft = route_overlong_rows(
            instance, bound["common_attn_metadata"], bound.get("num_decode_draft_tokens_cpu")
        )
        if metadata is not bound["common_attn_metadata"]:
            bound["common_attn_metadata"] = metadata
            bound["num_decode_draft_tokens_cpu"] = draft
            args = tuple(bound.pop(name) for name in _PARAMS[: len(args)])
            kwargs = bound
    except Exception as exc:
        core.wrapper_failed(PATCH.name, exc, _INSTEAD)
    return wrapped(*args, **kwargs)


class KDAOverlongRowsPatch(base.Patch):
    name = "kda_overlong_rows"
    target = "vllm.models.kimi_k3.nvidia.kda_metadata"
    wraps = ("KimiK3KDAMetadataBuilder.build",)
    upstream = "PR #55774 follow-up"
    fixed_in = "0.31.0"
    affects_from = "0.29.0"
    symptoms = ("ValueError: KDA RecoverSSM speculative decode query length exceeds its "
                "activation capacity",
                "at startup, in eager dummy runs (adaptive verification profiling); on "
                "0.30.0 too")
    summary = "RecoverSSM: rows longer than num_spec + 1 take the non-speculative path"
    decides = ("source check: build has a RecoverSSM path and does not route rows by "
               "'<= self.num_spec + 1'")
    probe_title = ("KDA build with RecoverSSM, k=8: an eager 48 x 10-token batch and a step "
                   "with a 12-token row")

    def _builder(self, module):
        builder = getattr(module, "KimiK3KDAMetadataBuilder", None)
        if builder is None or "build" not in vars(builder):
            raise base.PatchError("KimiK3KDAMetadataBuilder.build not found")
        return builder

    def check(self, module, optimize):
        builder = self._builder(module)
        try:
            source = recompile.source(vars(builder)["build"])
        except base.PatchError as exc:
            return base.cannot_tell(str(exc))
        if "use_recoverssm" not in source:
            return base.absent("the KDA builder has no RecoverSSM path")
        if _ROUTES.search(source):
            return base.fixed("build routes rows longer than num_spec + 1 out of the "
                              "speculative set")
        return base.needed("build raises on rows longer than num_spec + 1")

    def apply(self, module, wrap):
        builder = self._builder(module)
        if INLINE:
            try:
                build = inline_build(vars(builder)["build"])
            except base.PatchError as exc:
                wrap(builder, "build", build_wrapper)
                return f"wrapt wrapper: {exc}"
            wrap(builder, "build", replacement=build)
            return None
        wrap(builder, "build", build_wrapper)
        return "wrapt wrapper"

    def probe(self):
        from kimi_hotfix.patches.kda_overlong_rows import probe

        return probe.run()


PATCH = KDAOverlongRowsPatch()
