"""The merge battery (child side): every merge classmethod of the installed
vLLM on 800 to 1,300 spec combinations (by release: more spec classes, more
fields), with kv_spec_merge toggled on ("hardened": the shim's merges; under
-O, -O parity's plain code beneath) and off (vLLM's own), then
the public undo()/reapply() where the shim applied it. Runs inside child.py;
no ``assert`` (the child may run under -O)."""

import dataclasses
import enum
import sys

import torch

CAP = "non_causal_multi_token_decode"
NAME = "kv_spec_merge"
bf16 = torch.bfloat16
REQUIRED = dict(block_size=16, num_kv_heads=2, head_size=64, dtype=bf16,
                sliding_window=64, attention_chunk_size=128, rswa_window=256,
                shapes=((4, 8),), dtypes=(bf16,), page_size=4096, blocks_per_request=4)
VARIANT = dict(block_size=32, num_kv_heads=4, head_size=128, dtype=torch.float16,
               head_size_v=32, sliding_window=128, attention_chunk_size=256,
               cache_dtype_str="fp8_ds_mla", model_version="deepseek_v4",
               rswa_window=512, sink_len=8, extra_retained_tokens=2,
               tokens_per_state=4, alignment=512, page_size_padded=1 << 20,
               shapes=((4, 16),), dtypes=(torch.float32,), page_size=8192,
               blocks_per_request=8, num_head_slots=3, state_content_bytes=1000,
               topk_buffer_width=2048, storage_block_size=64,
               block_stride_alignment=4096, max_tp_shards=2,
               prefill_checkpoint_alignment=64, mamba_cache_mode="all")


def spec_classes(kvi):
    return sorted((c for c in vars(kvi).values() if isinstance(c, type)
                   and issubclass(c, kvi.KVCacheSpec) and c.__module__ == kvi.__name__),
                  key=lambda c: c.__name__)


def is_mla(cls):
    return "cache_dtype_str" in {f.name for f in dataclasses.fields(cls)}


def base(kvi, cls):
    kw = {}
    for f in dataclasses.fields(cls):
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            if f.name == "kv_cache_specs":
                kw[f.name] = {"l0": kvi.FullAttentionSpec(block_size=16, num_kv_heads=2,
                                                          head_size=64, dtype=bf16)}
            else:
                kw[f.name] = REQUIRED[f.name]
    if is_mla(cls):
        kw.update(num_kv_heads=1, head_size=576)
    return cls(**kw)


def other(kvi, name, value):
    if name in VARIANT and VARIANT[name] != value:
        return VARIANT[name]
    if isinstance(value, bool):
        return not value
    if isinstance(value, enum.Enum):
        members = [m for m in type(value) if m != value]
        return members[0] if members else None
    if isinstance(value, int):
        return value + 1
    if name == "kv_cache_specs":
        return {"l1": kvi.FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=64,
                                            dtype=bf16)}
    return None


def build_cases(kvi):
    found, bases, unvaried = {}, {}, []
    for cls in spec_classes(kvi):
        try:
            b = base(kvi, cls)
        except Exception as exc:
            unvaried.append(f"{cls.__name__}: no base ({type(exc).__name__}: {exc})")
            continue
        bases[cls] = b
        n = cls.__name__
        found[f"{n}.merge[b]"] = (cls, [b])
        found[f"{n}.merge[b,b,b]"] = (cls, [b, b, b])
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            value = other(kvi, f.name, getattr(b, f.name))
            if value is None:
                unvaried.append(f"{n}.{f.name}")
                continue
            try:
                v = dataclasses.replace(b, **{f.name: value})
            except Exception as exc:
                unvaried.append(f"{n}.{f.name} ({type(exc).__name__})")
                continue
            found[f"{n}.merge[b,{f.name}]"] = (cls, [b, v])
            found[f"{n}.merge[{f.name},b]"] = (cls, [v, b])
            found[f"{n}.merge[b,b,{f.name}]"] = (cls, [b, b, v])
            again = other(kvi, f.name, value)  # two variants: e.g. two sliding windows
            if again is not None and again != value:
                try:
                    w = dataclasses.replace(b, **{f.name: again})
                except Exception as exc:  # recorded, not dropped (issue 30 item 9)
                    unvaried.append(f"{n}.{f.name}' ({type(exc).__name__})")
                    continue
                found[f"{n}.merge[{f.name},{f.name}']"] = (cls, [v, w])
        if is_mla(cls):
            auto, bf = (dataclasses.replace(b, cache_dtype_str=s) for s in ("auto", "bfloat16"))
            found[f"{n}.merge[auto,bfloat16]"] = (cls, [auto, bf])
            found[f"{n}.merge[bfloat16,auto,auto]"] = (cls, [bf, auto, auto])
    for c1, b1 in bases.items():  # mixed types, called as the planner does
        for c2, b2 in bases.items():
            if c1 is not c2:
                found[f"{c1.__name__}.merge[{c1.__name__},{c2.__name__}]"] = (c1, [b1, b2])
    return found, sorted(bases, key=lambda c: c.__name__), unvaried


def outcome(cls, specs):
    try:
        result = cls.merge(list(specs))
    except Exception as exc:
        return f"raise {type(exc).__name__}: {str(exc)[:200]}"
    return f"ok {type(result).__name__} {result!r}"


def battery(found):
    return {name: outcome(cls, specs) for name, (cls, specs) in found.items()}


def group_capability(specs):
    """Each spec given the group's any() capability (the documented semantics)."""
    group = any(getattr(s, CAP, False) for s in specs)
    return [dataclasses.replace(s, **{CAP: group}) if hasattr(s, CAP) else s for s in specs]


def fresh_codes(kvi):
    """merge code objects compiled now from vLLM's own source file, as the
    module was compiled at import (this interpreter's level, or plain where -O
    parity loaded it)."""
    from kimi_hotfix.runtime import parity
    level = 0 if parity.runs_plain(kvi) else -1
    with open(kvi.__file__) as f:
        module = compile(f.read(), kvi.__file__, "exec", dont_inherit=True, optimize=level)
    found, todo = {}, [module]
    while todo:
        code = todo.pop()
        for const in code.co_consts:
            if hasattr(const, "co_code"):
                todo.append(const)
                if const.co_name == "merge":
                    found[const.co_qualname] = const
    return found


def run(core, kvi):
    import kimi_hotfix

    out = {"optimize": sys.flags.optimize}
    found, classes, unvaried = build_cases(kvi)
    owners = [c for c in spec_classes(kvi) if "merge" in vars(c)]
    out.update(classes=[c.__name__ for c in classes], merge_owners=[c.__name__ for c in owners],
               unvaried=unvaried)
    installed = {c: vars(c)["merge"] for c in owners}
    state_before = str(core.states()[NAME])
    from kimi_hotfix.tools.preflight import toggled  # check's own toggle
    with toggled(NAME, True) as state:
        out["state_on"] = str(state)
        out["wrapped_on"] = {c.__name__: core.is_wrapped(vars(c)["merge"]) for c in owners}
        out["hardened"] = battery(found)
    from kimi_hotfix.tools.preflight import toggled  # check's own toggle
    with toggled(NAME, False) as state:
        out["state_off"] = str(state)
        codes = fresh_codes(kvi)
        out["restored"] = {
            c.__name__: (type(vars(c)["merge"]) is classmethod
                         and not core.is_wrapped(vars(c)["merge"])
                         and vars(c)["merge"].__func__.__code__ == codes.get(f"{c.__name__}.merge"))
            for c in owners}
        out["original"] = battery(found)
        out["original_group_capability"] = {
            name: outcome(cls, group_capability(specs))
            for name, (cls, specs) in found.items()
            if len({getattr(s, CAP, False) for s in specs}) > 1}
        target = base(kvi, kvi.MLAAttentionSpec)
        try:
            out["original_capability_merge"] = getattr(
                kvi.MLAAttentionSpec.merge([target, dataclasses.replace(target, **{CAP: True})]),
                CAP)
        except AssertionError as exc:
            out["original_capability_merge"] = f"AssertionError: {exc}"
    out["toggles_left_no_trace"] = (all(vars(c)["merge"] is m for c, m in installed.items())
                                    and str(core.states()[NAME]) == state_before)
    out["installed_equal_hardened"] = battery(found) == out["hardened"]
    if core.states()[NAME].kind == "applied":  # the public rollback API
        originals = {c: m.__wrapped__ for c, m in installed.items() if core.is_wrapped(m)}
        kimi_hotfix.undo(NAME)
        out["undo_state"] = str(kimi_hotfix.states()[NAME])
        out["undo_restored"] = all(vars(c)["merge"] is m for c, m in originals.items())
        kimi_hotfix.reapply(NAME)
        out["reapply_state"] = str(kimi_hotfix.states()[NAME])
        out["reapply_same_originals"] = all(
            core.is_wrapped(vars(c)["merge"]) and vars(c)["merge"].__wrapped__ is m
            for c, m in originals.items())
        out["reapply_equal_hardened"] = battery(found) == out["hardened"]
    return out
