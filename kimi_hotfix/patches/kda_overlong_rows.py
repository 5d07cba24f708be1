"""kda_overlong_rows: route over-long KDA rows out of RecoverSSM's speculative set.

Why: with RecoverSSM on, ``KimiK3KDAMetadataBuilder.build`` (vLLM 0.29.0, 0.30.0)
treats every active decode row as a speculative row and raises ``ValueError: KDA
RecoverSSM speculative decode query length exceeds its activation capacity
(k + 1)`` when a row holds more than ``num_spec + 1`` tokens. CUDA-graph capture
(see capture_workspace) and eager dummy runs (adaptive verification profiling
probes batches above the capture limit) build such rows, so 0.30.0, which fixed
the capture plan, still crashes at startup.

What it changes: when a batch holds a row longer than ``num_spec + 1`` tokens,
the wrapper marks exactly those rows as non-speculative before vLLM's own
``build`` runs (their ``num_decode_draft_tokens_cpu`` entry becomes -1 and their
``is_prefilling`` entry True, on copies), so they take the non-speculative
(prefill) path, as vLLM 0.31.0 does, instead of raising. ``build`` runs every
engine step: the fast path reads only ``common_attn_metadata.max_query_len`` (an
int) and touches no tensor; a batch within capacity is passed through as is.

Upstream: vllm-project/vllm PR #55774 follow-up, released in 0.31.0
(``spec_sequence_masks_cpu &= query_lens <= num_spec + 1``).

Needed when: the installed ``build`` raises the capacity error and does not route
rows by ``<= self.num_spec + 1`` (source check); without source, by version
(< 0.31.0).
"""

from __future__ import annotations

import inspect
import re

from kimi_hotfix import core

_ROUTES = re.compile(r"<=\s*self\.num_spec\s*\+\s*1")
_PARAMS = (
    "common_prefix_len",
    "common_attn_metadata",
    "num_accepted_tokens",
    "num_decode_draft_tokens_cpu",
    "fast_build",
)


def build_wrapper(wrapped, instance, args, kwargs):
    # Fast path: no tensor is touched; max_query_len is a plain int.
    try:
        metadata = args[1] if len(args) > 1 else kwargs["common_attn_metadata"]
        fast = not instance.use_recoverssm or metadata.max_query_len <= instance.num_spec + 1
    except Exception as exc:
        core.wrapper_failed(PATCH.name, exc)
        fast = True
    if fast:
        return wrapped(*args, **kwargs)
    try:
        args, kwargs = route_overlong_rows(instance, args, kwargs)
    except Exception as exc:
        core.wrapper_failed(PATCH.name, exc)
    return wrapped(*args, **kwargs)


def route_overlong_rows(builder, args, kwargs):
    """Arguments with rows longer than num_spec + 1 marked non-speculative."""
    bound = dict(zip(_PARAMS, args))
    bound.update(kwargs)
    metadata = bound["common_attn_metadata"]
    draft = bound.get("num_decode_draft_tokens_cpu")
    if draft is None or metadata.is_prefilling is None:
        return args, kwargs  # no speculative set: nothing can overflow
    over = metadata.query_start_loc_cpu.diff() > builder.num_spec + 1
    if not bool(over.any()):
        return args, kwargs
    draft = draft.clone()
    draft[over] = -1
    bound["num_decode_draft_tokens_cpu"] = draft
    bound["common_attn_metadata"] = metadata.replace(
        is_prefilling=metadata.is_prefilling | over
    )
    positional = len(args)
    new_args = tuple(bound.pop(name) for name in _PARAMS[:positional])
    return new_args, bound


class KDAOverlongRowsPatch(core.Patch):
    name = "kda_overlong_rows"
    target = "vllm.models.kimi_k3.nvidia.kda_metadata"
    wraps = ("KimiK3KDAMetadataBuilder.build",)
    upstream = "vllm-project/vllm PR #55774 follow-up"
    fixed_in = "0.31.0"
    summary = "RecoverSSM: rows longer than num_spec + 1 take the non-speculative path"
    decides = "source check: build routes rows by '<= self.num_spec + 1' (else version < 0.31.0)"

    def _builder(self, module):
        builder = getattr(module, "KimiK3KDAMetadataBuilder", None)
        if builder is None or "build" not in vars(builder):
            raise core.PatchError("KimiK3KDAMetadataBuilder.build not found")
        return builder

    def check(self, module):
        builder = self._builder(module)
        try:
            source = inspect.getsource(vars(builder)["build"])
        except (OSError, TypeError):
            return self.version_fallback("source of KimiK3KDAMetadataBuilder.build unavailable")
        if "use_recoverssm" not in source:
            return False, "builder has no RecoverSSM path"
        if _ROUTES.search(source):
            return False, "build routes rows longer than num_spec + 1 out of the speculative set"
        return True, "build raises on rows longer than num_spec + 1"

    def apply(self, module, wrap):
        wrap(self._builder(module), "build", build_wrapper)


PATCH = KDAOverlongRowsPatch()
