"""kv_spec_merge's probe: Kimi-K3 KV-cache grouping by the installed vLLM's own planner.

Importing this module imports vLLM (CPU is enough: set VLLM_TARGET_DEVICE=cpu).
The layer sets are built from the real spec classes of
``vllm.v1.kv_cache_interface`` with Kimi-K3-like shapes; ``grouping(name)`` runs
vLLM's ``is_kv_cache_spec_uniform`` and ``get_kv_cache_groups`` on a fresh copy
of one set and describes the result in release-independent JSON, so that the
output of two vLLM releases (or of one release with and without the shim) can
be compared with ``==``.

``run()`` is the preflight probe: the target + draft merge and every layer set,
checked for properties that hold for every PYTHONHASHSEED.
"""

from __future__ import annotations

import math
import re

import torch
from vllm.v1 import kv_cache_interface as kvi

from kimi_hotfix.patches.kv_spec_merge import CAPABILITY
from kimi_hotfix.runtime.patching import ProbeResult

# Kimi-K3-like shapes. MLA caches one 576-wide latent (512 kv_lora + 64 rope)
# per token in bf16, one KV head, no separate V.
MLA_HEAD = 576
MLA_DTYPE = torch.bfloat16
BLOCK = 64
# KDA (Mamba-family) state per layer at TP=8: 4 heads of 128: three short-conv
# states (q, k, v: 512 channels x (kernel 4 - 1)) in bf16 and the recurrent
# state 4 x 128 x 128 in fp32.
KDA_SHAPES = ((512, 3), (512, 3), (512, 3), (4, 128, 128))
KDA_DTYPES = (torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.float32)


def _mla(block_size=BLOCK, **extra):
    return kvi.MLAAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=MLA_HEAD, dtype=MLA_DTYPE, **extra
    )


def _kda_page_bytes():
    return sum(math.prod(s) * d.itemsize for s, d in zip(KDA_SHAPES, KDA_DTYPES))


def _hybrid_block_size():
    """Attention block size of a hybrid model: the smallest multiple of 64
    tokens whose MLA page holds one KDA state (what vLLM's hybrid config does
    before it pads the Mamba page up to the attention page)."""
    per_token = _mla(block_size=1).page_size_bytes
    tokens = -(-_kda_page_bytes() // per_token)
    return -(-tokens // BLOCK) * BLOCK


def _kda(page_bytes, block_size):
    return kvi.MambaSpec(
        block_size=block_size,
        shapes=KDA_SHAPES,
        dtypes=KDA_DTYPES,
        page_size_padded=page_bytes,
    )


def _target_name(i):
    return f"model.layers.{i}.self_attn.attn"


def _draft_name(i):
    return f"drafter.layers.{i}.self_attn.attn"


def _kimi_k3_hybrid(mla_first: bool) -> dict:
    """12 decoder layers, 3 KDA : 1 MLA, plus a 1-layer DSpark MLA draft."""
    block = _hybrid_block_size()
    target, draft = _mla(block), _mla(block, **{CAPABILITY: True})
    kda = _kda(target.page_size_bytes, block_size=block)
    mla_layers = {_target_name(i): target for i in (3, 7, 11)}
    mla_layers[_draft_name(0)] = draft
    kda_layers = {f"model.layers.{i}.self_attn": kda for i in range(12) if i % 4 != 3}
    first, second = (mla_layers, kda_layers) if mla_first else (kda_layers, mla_layers)
    return {**first, **second}


def _layer_sets() -> dict:
    target, draft = _mla(), _mla(**{CAPABILITY: True})
    return {
        # (a) 4 causal target MLA layers + 2 non-causal DSpark draft MLA layers.
        "mla_target_draft": {
            **{_target_name(i): target for i in range(4)},
            **{_draft_name(i): draft for i in range(2)},
        },
        # (b) KDA + MLA target + draft, MLA listed first and KDA listed first.
        "kda_mla_draft_mla_first": _kimi_k3_hybrid(mla_first=True),
        "kda_mla_draft_kda_first": _kimi_k3_hybrid(mla_first=False),
        # (c) MLA layers that differ only in cache_dtype_str.
        "mla_cache_dtype_str": {
            **{_target_name(i): _mla(cache_dtype_str="auto") for i in range(2)},
            **{_target_name(i): _mla(cache_dtype_str="bfloat16") for i in range(2, 4)},
        },
    }


LAYER_SETS = tuple(_layer_sets())


def layer_set(name: str) -> dict:
    """A fresh ``{layer name: spec}`` dict (the planner may rewrite it)."""
    sets = _layer_sets()
    if name not in sets:
        raise KeyError(f"unknown layer set {name!r}; valid: {', '.join(sets)}")
    return sets[name]


def planner():
    """vLLM's planner module: ``kv_cache_planning`` (0.33) or ``kv_cache_utils``
    (up to 0.32), whichever holds the planner functions."""
    import importlib

    for name in ("vllm.v1.core.kv_cache_planning", "vllm.v1.core.kv_cache_utils"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(module, "get_kv_cache_groups") and hasattr(module, "is_kv_cache_spec_uniform"):
            return module
    raise ImportError("vLLM's KV cache planner (get_kv_cache_groups) not found")


def vllm_config():
    """A model-less ``VllmConfig()`` as the engine core holds it when it plans:
    the KV cache layout resolved, here to the layer-outermost ``LBNHC`` (the
    legacy NHD) that puts hybrid models on the page-size bucketing path."""
    from vllm.config import VllmConfig

    config = VllmConfig()
    if getattr(config.cache_config, "kv_cache_layout", "absent") is None:
        config.cache_config.kv_cache_layout = "LBNHC"
    return config


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def _value(value):
    """A JSON-able, release-independent rendering of one spec field."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.dtype):
        return str(value).replace("torch.", "")
    if isinstance(value, (tuple, list)):
        return [_value(v) for v in value]
    return str(getattr(value, "name", value))


# Fields that identify a layer's cache in every release from 0.28 to 0.33.
_FIELDS = (
    "block_size",
    "num_kv_heads",
    "head_size",
    "dtype",
    "page_size_bytes",
    "cache_dtype_str",
    CAPABILITY,
    "sliding_window",
    "shapes",
    "dtypes",
)


def describe_spec(spec) -> dict:
    out = {"type": type(spec).__name__}
    for name in _FIELDS:
        if hasattr(spec, name):
            out[name] = _value(getattr(spec, name))
    return out


def describe_group(group) -> dict:
    spec = group.kv_cache_spec
    out = {"layers": list(group.layer_names), "spec": describe_spec(spec)}
    inner = getattr(spec, "kv_cache_specs", None)
    if isinstance(inner, dict):  # UniformTypeKVCacheSpecs keeps one spec per layer
        out["layer_specs"] = {name: describe_spec(s) for name, s in inner.items()}
    return out


def grouping(name: str) -> dict:
    """Run vLLM's own planner on one layer set; JSON-able result.

    ``uniform`` is ``is_kv_cache_spec_uniform``'s answer, ``groups`` the
    described ``get_kv_cache_groups`` result; either step that raises yields
    ``{"error": "Type: message"}`` in its place (the planner raising, e.g. the
    ``-O`` AttributeError, is a result here, not a failure of the probe).
    """
    plan = planner()
    out: dict = {"layer_set": name}
    try:
        out["uniform"] = bool(plan.is_kv_cache_spec_uniform(layer_set(name)))
    except Exception as exc:
        out["uniform"] = {"error": _err(exc)}
    try:
        groups = plan.get_kv_cache_groups(vllm_config(), layer_set(name))
        out["groups"] = [describe_group(g) for g in groups]
    except Exception as exc:
        out["groups"] = {"error": _err(exc)}
    return out


def mla_merge_target_draft() -> dict:
    """``MLAAttentionSpec.merge([target, draft])``: the merged capability, or the error."""
    target, draft = _mla(), _mla(**{CAPABILITY: True})
    try:
        merged = kvi.MLAAttentionSpec.merge([target, draft])
    except Exception as exc:
        return {"error": _err(exc)}
    return {"spec": describe_spec(merged), CAPABILITY: getattr(merged, CAPABILITY, None)}


# -- preflight ----------------------------------------------------------------


def _layer_view(result: dict) -> dict:
    """layer name -> (group index, effective per-layer spec description)."""
    view = {}
    for index, group in enumerate(result["groups"]):
        per_layer = group.get("layer_specs", {})
        for layer in group["layers"]:
            view[layer] = (index, per_layer.get(layer, group["spec"]))
    return view


def problems(result: dict) -> list:
    """What is wrong with one ``grouping()`` result for Kimi-K3 (empty: right).

    Checks properties that hold for every PYTHONHASHSEED, not one pop's luck:
    - no planner step raises;
    - every layer lands in exactly one group, and no group mixes a Mamba/KDA
      layer with an attention layer;
    - the DSpark draft layers share one merged MLA group spec with the target
      layers, and that spec carries the capability; a layer's effective spec
      never loses the capability its own spec had;
    - every layer's effective cache_dtype_str is its own (variants kept apart).

    ``capability_problems`` keeps the ones about the draft capability (this
    patch's); the others are what ``-O`` does to the merges' asserts (-O
    parity's, kimi_hotfix.runtime.parity).
    """
    name = result["layer_set"]
    found = []
    for step in ("uniform", "groups"):
        if isinstance(result.get(step), dict):
            found.append(f"{step}: {result[step]['error']}")
    if found:
        return found
    specs = layer_set(name)
    view = _layer_view(result)
    listed = [layer for group in result["groups"] for layer in group["layers"]]
    if sorted(listed) != sorted(specs):
        found.append("groups do not partition the layers")
    for index, group in enumerate(result["groups"]):
        kinds = {isinstance(specs[layer], kvi.MambaSpec) for layer in group["layers"]}
        if len(kinds) > 1:
            found.append(f"group {index} mixes Mamba/KDA and MLA layers")
    for layer, spec in specs.items():
        if layer not in view:
            continue
        index, effective = view[layer]
        if getattr(spec, CAPABILITY, False) and effective.get(CAPABILITY) is not True:
            found.append(f"{layer} lost {CAPABILITY}")
        own = getattr(spec, "cache_dtype_str", None)
        if hasattr(spec, "cache_dtype_str") and effective.get("cache_dtype_str") != own:
            found.append(
                f"{layer} cache_dtype_str {own!r} became {effective.get('cache_dtype_str')!r}"
            )
    drafts = [layer for layer in specs if getattr(specs[layer], CAPABILITY, False)]
    for layer in drafts:
        index, _ = view.get(layer, (None, None))
        if index is None:
            continue
        group = result["groups"][index]
        targets = [x for x in group["layers"] if not getattr(specs[x], CAPABILITY, True)]
        if group["spec"]["type"] != "MLAAttentionSpec" or not targets:
            found.append(f"{layer} is not in one merged MLA group with the target")
            break
    return sorted(set(found))


def capability_problems(found: list) -> list:
    """The problems about the draft capability (this patch's to fix)."""
    return [p for p in found if CAPABILITY in p or "merged MLA group with the target" in p]


def _spec_label(spec):
    label = re.sub(r"(AttentionSpec|Specs?)$", "", spec.get("type", "?"))
    if spec.get("cache_dtype_str") is not None:
        label += f" {spec['cache_dtype_str']}"
    if CAPABILITY in spec:
        label += " cap=" + ("on" if spec[CAPABILITY] else "off")
    return label


def describe_grouping(result: dict) -> str:
    """One line for a ``grouping()`` result: "MLA cap=on (4) | 3x Mamba (3)"."""
    groups = result.get("groups")
    if isinstance(groups, dict):
        return f"error: {groups.get('error')}"
    parts = []
    for group in groups or []:
        inner = group.get("layer_specs")
        if inner:  # one group, one spec per layer (e.g. UniformTypeKVCacheSpecs)
            labels = [_spec_label(s) for s in inner.values()]
            kinds = ", ".join(f"{lab} ({labels.count(lab)})" for lab in dict.fromkeys(labels))
            parts.append(f"{_spec_label(group['spec'])}[{kinds}]")
        else:
            parts.append(f"{_spec_label(group['spec'])} ({len(group['layers'])})")
    collapsed = [f"{parts.count(p)}x {p}" if parts.count(p) > 1 else p for p in dict.fromkeys(parts)]
    return " | ".join(collapsed) or "no groups"


def run() -> ProbeResult:
    """Is the Kimi-K3 grouping right with the merge methods as installed now?"""
    merge = mla_merge_target_draft()
    found, other, cases = [], [], {}
    if "error" in merge:
        found.append(f"MLAAttentionSpec.merge(target, draft): {merge['error']}")
        cases["merge target+draft"] = merge["error"]
    else:
        cases["merge target+draft"] = f"{CAPABILITY}={merge[CAPABILITY]}"
        if merge[CAPABILITY] is not True:
            found.append(f"MLAAttentionSpec.merge(target, draft) drops {CAPABILITY}")
    for name in LAYER_SETS:
        result = grouping(name)
        cases[name] = describe_grouping(result)
        seen = problems(result)
        mine = capability_problems(seen)
        found.extend(f"{name}: {p}" for p in mine)
        other.extend(f"{name}: {p}" for p in seen if p not in mine)
    # what -O does to the merges' asserts is -O parity's (kimi_hotfix.runtime.parity): said, not judged
    notes = [f"{p} (-O's asserts: -O parity's)" for p in other]
    detail = "; ".join(found + notes) or "draft capability kept, KDA apart, cache dtypes apart"
    return ProbeResult(ok=not found, detail=detail, cases=cases)
