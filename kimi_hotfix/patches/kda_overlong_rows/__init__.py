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
recompiled from vLLM's own source (kimi_hotfix/runtime/recompile.py, after checking that
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

Needed when (``check``): decided from ``build``'s code structure (its AST),
never from text a comment or a string could hold. It has a RecoverSSM path
when its code reads ``self.use_recoverssm``; it routes the rows itself when a
comparison ``... <= self.num_spec + 1`` is an operand of a bitwise AND that is
assigned (``mask &= ...`` or ``mask = mask & ...``: rows filtered out of the
speculative set, 0.31.0's form). A check that raises on such rows (the
comparison in an ``if`` test or an ``assert``, or reduced with ``.all()``)
does not count. Not affected where the builder has no RecoverSSM path
(0.28.0); not needed once it routes them itself (0.31.0). Any other form reads
as needed (the router then finds no over-long speculative row and changes
nothing). Where the source is unavailable it cannot tell: the shim applies it
(the wrapt fallback) and warns.
"""

from __future__ import annotations

import ast
import inspect

from kimi_hotfix.runtime import base, patching, recompile, wrapping

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


INSTEAD = "vLLM's own build runs on the unrouted rows"


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


def inline_build(build, failed):
    """vLLM's ``build`` recompiled with the guard; ``failed(exc)`` is called
    where the guard's own code fails. PatchError where it cannot be."""
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
        cells={"_kimi_hotfix_route": _route, "_kimi_hotfix_failed": failed},
    )


def make_wrapper(ctx):
    """The wrapt fallback: the same guard and routing around vLLM's build."""

    def build_wrapper(wrapped, instance, args, kwargs):
        try:
            metadata = args[1] if len(args) > 1 else kwargs["common_attn_metadata"]
            if instance.use_recoverssm and metadata.max_query_len > instance.num_spec + 1:
                args, kwargs = _routed(instance, args, kwargs)
        except Exception as exc:
            ctx.failed(exc, INSTEAD)
        return wrapped(*args, **kwargs)

    return build_wrapper


def _routed(builder, args, kwargs):
    bound = dict(zip(_PARAMS, args))
    bound.update(kwargs)
    metadata, draft = route_overlong_rows(
        builder, bound["common_attn_metadata"], bound.get("num_decode_draft_tokens_cpu"))
    if metadata is bound["common_attn_metadata"]:
        return args, kwargs
    bound["common_attn_metadata"] = metadata
    bound["num_decode_draft_tokens_cpu"] = draft
    return tuple(bound.pop(name) for name in _PARAMS[: len(args)]), bound


def _self_attr(node, name) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == name
            and isinstance(node.value, ast.Name) and node.value.id == "self")


def _capacity_compare(node) -> bool:
    """``<anything> <= self.num_spec + 1``."""
    return (isinstance(node, ast.Compare) and len(node.ops) == 1
            and isinstance(node.ops[0], ast.LtE) and isinstance(node.comparators[0], ast.BinOp)
            and isinstance(node.comparators[0].op, ast.Add)
            and _self_attr(node.comparators[0].left, "num_spec")
            and isinstance(node.comparators[0].right, ast.Constant)
            and node.comparators[0].right.value == 1)


def _anded(value) -> list:
    """The operands of the bitwise ANDs in ``value``."""
    return [side for n in ast.walk(value) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitAnd)
            for side in (n.left, n.right)]


def structure(build) -> tuple:
    """(has a RecoverSSM path, routes over-long rows itself) from ``build``'s
    AST (see the module docstring). PatchError without source."""
    return structure_of(recompile.function_ast(build))


def structure_of(tree) -> tuple:
    """``structure`` on the parsed function."""
    path = any(_self_attr(n, "use_recoverssm") and isinstance(n.ctx, ast.Load)
               for n in ast.walk(tree))
    routes = False
    indexes = _index_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.BitAnd):
            operands, targets = [node.value, *_anded(node.value)], [node.target]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            operands = _anded(node.value)
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        else:
            continue
        # a mask routes rows only where it selects them: its name indexes something
        # (``query_lens[mask]``); one computed for a metric or a log line does not
        routes = routes or (any(_capacity_compare(op) for op in operands)
                            and any(isinstance(t, ast.Name) and t.id in indexes for t in targets))
    return path, routes


def _index_names(tree) -> set:
    """Names used in a subscript's index anywhere in the function (``x[mask]``,
    ``x[mask, :k]``, ``x[~mask]``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            found.update(n.id for n in ast.walk(node.slice) if isinstance(n, ast.Name))
    return found


class KDAOverlongRowsPatch(patching.Patch):
    wraps = ("KimiK3KDAMetadataBuilder.build",)

    def _builder(self, module):
        builder = getattr(module, "KimiK3KDAMetadataBuilder", None)
        if builder is None or "build" not in vars(builder):
            raise base.PatchError("KimiK3KDAMetadataBuilder.build not found")
        return builder

    def decide(self, module, optimize):
        builder = self._builder(module)
        try:
            path, routes = structure(wrapping.vllm_own(builder, "build"))
        except base.PatchError as exc:
            return patching.cannot_tell(str(exc))
        if not path:
            return patching.absent("the KDA builder has no RecoverSSM path")
        if routes:
            return patching.fixed("build routes rows longer than num_spec + 1 out of the "
                              "speculative set")
        return patching.needed("build raises on rows longer than num_spec + 1")

    def apply(self, module, ctx):
        builder = self._builder(module)
        if INLINE:
            try:
                build = inline_build(wrapping.vllm_own(builder, "build"),
                                     lambda exc: ctx.failed(exc, INSTEAD))
            except base.PatchError as exc:
                ctx.wrap(builder, "build", make_wrapper(ctx))
                return f"wrapt wrapper: {exc}"
            ctx.wrap(builder, "build", replacement=build)
            return None
        ctx.wrap(builder, "build", make_wrapper(ctx))
        return "wrapt wrapper"


PATCH = KDAOverlongRowsPatch()
