"""capture_workspace: keep RecoverSSM's mixed CUDA-graph captures inside its workspace.

Why: with ``--use-replayssm`` (``cache_config.use_kda_recoverssm``), Kimi-K3's KDA
layers hold a speculative activation window of ``num_speculative_tokens + 1``
tokens for at most ``max_num_seqs`` requests: ``max_num_reqs * decode_query_len``
tokens (48 * 9 = 432). vLLM 0.29.0's ``CudaGraphManager._init_candidates`` plans
one mixed-mode (PIECEWISE or FULL-mixed) graph per capture size, up to 512 on
Hopper; sizes above the workspace become dummy batches of 48 requests with 10 or
11 tokens each, and startup dies on the first (largest) capture with
``ValueError: KDA RecoverSSM speculative decode query length exceeds its
activation capacity (9)``.

What it changes: when ``use_kda_recoverssm`` is on, ``_init_candidates`` runs
against a view of the compilation config whose ``cudagraph_capture_sizes`` holds
only the sizes that fit in ``max_num_reqs * decode_query_len``. No mixed-mode
descriptor above the workspace is planned; larger batches run eagerly, as
upstream does. Uniform and varlen decode descriptors were already bounded by the
same limit, so the plan (``_capture_descs`` and ``_candidates``) equals the one
vLLM 0.30.0 builds. The view lives only for that call and takes any write
itself: the shared ``CompilationConfig`` (also read by the speculator's manager)
is never modified. With RecoverSSM off the call is passed through untouched.
Everything the wrapper does runs inside its containment: if building the view
or swapping it in fails, vLLM's own ``_init_candidates`` plans on the shared
config (its original behaviour) and the failure is counted and logged once.
What vLLM's own code raises under the view is vLLM's: it runs once, its
exception reaches the caller unchanged, the plan stays as vLLM left it, and
nothing is counted against the patch.

Upstream: vllm-project/vllm PR #55774, released in 0.30.0.

Needed when (``check``): the installed vLLM has RecoverSSM
(``CacheConfig.use_kda_recoverssm``, a dataclass field) and its
``_init_candidates`` does not bound the mixed captures by it. Decided from the
method's code structure (its AST), never from text: "fixed" needs an ``if``
that reads ``<...>.use_kda_recoverssm`` as code, compares a size (``<=``/``<``)
in its test or body, and plans rather than raises (no ``raise`` in its body).
A comment, a docstring or a check that raises does not count. Any other form
reads as needed, which is harmless: applied to a vLLM that bounds the captures
itself, the plan is the same. Not affected where RecoverSSM does not exist
(0.28.0); not needed once ``_init_candidates`` bounds the mixed captures itself
(0.30.0). Where the source is unavailable it cannot tell: the shim applies it
and warns (with RecoverSSM off the wrapper passes every call through).
"""

from __future__ import annotations

import ast
import importlib

from kimi_hotfix.runtime import base, patching, recompile, wrapping

FIELD = "use_kda_recoverssm"
INSTEAD = "vLLM's own capture plan is used"


def has_recoverssm() -> bool:
    """Does this vLLM have RecoverSSM at all (``CacheConfig.use_kda_recoverssm``,
    a dataclass field: read from the class, not from any text)? The probes of
    this patch and of kda_overlong_rows ask it too (kimi_hotfix.patches._recoverssm)."""
    cache_config = importlib.import_module("vllm.config").CacheConfig
    return FIELD in getattr(cache_config, "__dataclass_fields__", {})


class ClampedCompilationConfig:
    """A view of a CompilationConfig with the capture sizes clamped. Reads go
    to the shared config except for what the view holds; writes stay in the
    view (the shared config is never written)."""

    __slots__ = ("_config", "_own")

    def __init__(self, config, sizes):
        object.__setattr__(self, "_config", config)
        object.__setattr__(self, "_own", {"cudagraph_capture_sizes": sizes})

    def __getattr__(self, name):
        own = object.__getattribute__(self, "_own")
        if name in own:
            return own[name]
        return getattr(object.__getattribute__(self, "_config"), name)

    def __setattr__(self, name, value):
        object.__getattribute__(self, "_own")[name] = value


def workspace_tokens(manager) -> int:
    return manager.max_num_reqs * manager.decode_query_len


def clamped_view(manager):
    """The view to plan with, or None when nothing needs clamping."""
    cache_config = manager.vllm_config.cache_config
    if not getattr(cache_config, FIELD, False):
        return None
    config = manager.compilation_config
    sizes = config.cudagraph_capture_sizes
    if not sizes:
        return None
    limit = workspace_tokens(manager)
    kept = [size for size in sizes if size <= limit]
    if len(kept) == len(sizes):
        return None
    return ClampedCompilationConfig(config, kept)


def make_wrapper(ctx):
    def init_candidates_wrapper(wrapped, instance, args, kwargs):
        try:
            view = clamped_view(instance)
        except Exception as exc:
            ctx.failed(exc, INSTEAD)  # strict mode raises here
            view = None
        if view is None:
            return wrapped(*args, **kwargs)
        try:
            shared = instance.compilation_config
            instance.compilation_config = view
        except Exception as exc:  # the swap failed: vLLM plans on the shared config
            ctx.failed(exc, INSTEAD)
            return wrapped(*args, **kwargs)
        try:
            # vLLM's own code, run once; what it raises reaches its caller unchanged
            return wrapped(*args, **kwargs)
        finally:
            try:
                instance.compilation_config = shared
            except Exception as exc:  # the view stays: it reads through to the shared config
                ctx.failed(exc, "the manager keeps reading the clamped view")

    return init_candidates_wrapper


def _reads_field(node) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == FIELD and isinstance(n.ctx, ast.Load)
               for n in ast.walk(node))


def _compares_size(nodes) -> bool:
    return any(isinstance(n, ast.Compare) and any(isinstance(op, (ast.LtE, ast.Lt)) for op in n.ops)
               for node in nodes for n in ast.walk(node))


def bounds_mixed_captures(func) -> bool:
    """Does ``_init_candidates`` bound what it plans by RecoverSSM (code
    structure, see the module docstring)? PatchError without source."""
    return bounds_in(recompile.function_ast(func))


LOGGING = frozenset({"debug", "info", "warning", "warning_once", "info_once", "debug_once",
                     "error", "exception", "critical", "log", "warn", "print"})


def _acts(body) -> bool:
    """Does a branch do anything but log: any statement other than a logging
    call (``logger.debug(...)``, ``print(...)``), a bare string or ``pass``
    (nested ``if``s looked into)? A branch that only logs bounds nothing."""
    for stmt in body:
        if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr)
                                          and isinstance(stmt.value, ast.Constant)):
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            func = stmt.value.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in LOGGING:
                continue
        if isinstance(stmt, ast.If) and not (_acts(stmt.body) or _acts(stmt.orelse)):
            continue
        return True
    return False


def bounds_in(tree) -> bool:
    """``bounds_mixed_captures`` on the parsed function: an ``if`` whose test
    reads the RecoverSSM field and compares a size, whose branch acts (not
    only logs) and raises nothing."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.If) and _reads_field(node.test)
                and _compares_size([node.test, *node.body]) and _acts(node.body)
                and not any(isinstance(n, ast.Raise) for b in node.body for n in ast.walk(b))):
            return True
    return False


class CaptureWorkspacePatch(patching.Patch):
    wraps = ("CudaGraphManager._init_candidates",)

    def _method(self, module):
        manager = getattr(module, "CudaGraphManager", None)
        method = (wrapping.vllm_own(manager, "_init_candidates")
                  if manager is not None and "_init_candidates" in vars(manager) else None)
        if method is None:
            raise base.PatchError("CudaGraphManager._init_candidates not found")
        return manager, method

    def decide(self, module, optimize):
        _, method = self._method(module)
        if not has_recoverssm():
            return patching.absent("this vLLM has no RecoverSSM (no CacheConfig.use_kda_recoverssm)")
        try:
            bounded = bounds_mixed_captures(method)
        except base.PatchError as exc:
            return patching.cannot_tell(str(exc))
        if bounded:
            return patching.fixed("_init_candidates bounds mixed captures for RecoverSSM")
        return patching.needed("_init_candidates plans mixed graphs above the RecoverSSM workspace")

    def apply(self, module, ctx):
        manager, _ = self._method(module)
        ctx.wrap(manager, "_init_candidates", make_wrapper(ctx))


PATCH = CaptureWorkspacePatch()
