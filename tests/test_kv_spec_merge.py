"""Acceptance for the kv_spec_merge patch, against the real vLLM releases.

Everything that claims vLLM behaviour runs in child interpreters of the cached
venvs (``-O``/``-OO`` and PYTHONHASHSEED are real). One child computes every
layer set (``python -m kimi_hotfix.probes.kv_grouping``); children are cached
per (interpreter, flags, seed, shim) for the whole module.

The reference is vLLM 0.33.0 without ``-O`` and without the shim (no
PYTHONPATH: sitecustomize never loads), computed in this run from the 0.33.0
venv's interpreter. Nothing about vLLM's grouping is hard-coded here.
"""

from __future__ import annotations

import pytest

from conftest import (
    OPT_FLAGS,
    OPT_IDS,
    REPO,
    VLLM_VERSION,
    hermetic_env,
    json_lines,
    run_python,
    venv_python,
)

pytestmark = pytest.mark.vllm("0.29.0", "0.30.0", "0.33.0")

REFERENCE_RELEASE = "0.33.0"
SEEDS = (0, 1, 2, 3)
# Seeds per interpreter mode for the shim runs (one child each): every seed runs
# optimized at least once; -O, the nightly containers' mode, runs them all.
SHIM_RUNS = [("plain", 0), ("plain", 1), *(("O", s) for s in SEEDS), ("OO", 2), ("OO", 3)]
PROBE = "kimi_hotfix.probes.kv_grouping"
CAPABILITY = "non_causal_multi_token_decode"
FLAGS = dict(zip(OPT_IDS, OPT_FLAGS))
LEVEL = {"plain": 0, "O": 1, "OO": 2}  # sys.flags.optimize

_runs: dict = {}


class Run:
    """One probe child: its KIMI_JSON records by kind (and layer set)."""

    def __init__(self, proc):
        self.stderr = proc.stderr
        self.records = {}
        for obj in json_lines(proc.stdout):
            self.records[(obj.pop("kind"), obj.get("layer_set"))] = obj
        self.process = self.records[("process", None)]
        self.preflight = self.records[("preflight", None)]
        self.merge = self.records[("merge_target_draft", None)]
        self.groupings = {k[1]: v for k, v in self.records.items() if k[0] == "grouping"}

    def results(self) -> dict:
        """What must equal the reference: the merge and every layer set's grouping."""
        return {"merge_target_draft": self.merge, **self.groupings}


def probe(release: str, opt: str, seed: int, shim: str) -> Run:
    """shim: "on" (PYTHONPATH, default env), "off" (KIMI_HOTFIX=0) or
    "absent" (no PYTHONPATH: the probe runs by path, sitecustomize never loads)."""
    key = (release, opt, seed, shim)
    if key not in _runs:
        env = hermetic_env(
            shim=shim != "absent",
            PYTHONHASHSEED=seed,
            KIMI_HOTFIX="0" if shim == "off" else None,
        )
        args = (
            [str(REPO / "kimi_hotfix" / "probes" / "kv_grouping.py")]
            if shim == "absent"
            else ["-m", PROBE]
        )
        proc = run_python(args, python=venv_python(release), flags=FLAGS[opt], env=env, cwd=REPO)
        _runs[key] = Run(proc)
    return _runs[key]


def reference() -> Run:
    return probe(REFERENCE_RELEASE, "plain", 0, "absent")


def differing(run: Run, ref: Run) -> dict:
    """{result name: (this run's, reference's)} where they differ."""
    mine, theirs = run.results(), ref.results()
    return {k: (mine.get(k), theirs[k]) for k in theirs if mine.get(k) != theirs[k]}


# -- the reference itself -----------------------------------------------------


def test_reference_is_unshimmed_plain_0_33():
    ref = reference()
    assert ref.process["vllm"] == REFERENCE_RELEASE
    assert ref.process["optimize"] == 0
    assert "states" not in ref.process, "the reference must run without the shim"
    assert "kimi-hotfix" not in ref.stderr
    # The reference's Kimi-K3 grouping is the right one (and the layer sets are
    # ones vLLM can plan: no planner error in any of them).
    assert ref.preflight["ok"], ref.preflight["detail"]


# -- acceptance: with the shim, every flag and seed groups as the reference ----


@pytest.mark.parametrize("opt,seed", SHIM_RUNS, ids=[f"{o}-{s}" for o, s in SHIM_RUNS])
def test_shim_groups_like_reference(opt, seed):
    run = probe(VLLM_VERSION, opt, seed, "on")
    assert run.process["vllm"] == VLLM_VERSION
    assert run.process["optimize"] == LEVEL[opt]
    assert run.process["hashseed"] == str(seed)
    assert differing(run, reference()) == {}
    assert run.merge[CAPABILITY] is True
    assert run.preflight["ok"], run.preflight["detail"]


# -- the bug reproduces without the shim, in this run --------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_without_shim_O_reproduces_the_bug(seed):
    run = probe(VLLM_VERSION, "O", seed, "off")
    assert run.process["optimize"] == 1
    assert run.process["states"]["kv_spec_merge"].startswith("disabled")
    assert not any(run.process["merge_wrapped"].values())
    assert differing(run, reference()), "-O without the shim grouped like the reference"
    assert not run.preflight["ok"]
    if VLLM_VERSION == "0.29.0":  # issue #54649: the draft loses its capability
        assert run.merge.get(CAPABILITY) is not True, run.merge
        assert run.groupings["mla_target_draft"] != reference().groupings["mla_target_draft"]


# -- patch state: not needed on fixed vLLM without -O, applied under -O ---------


@pytest.mark.parametrize("opt", OPT_IDS)
def test_patch_state(opt):
    run = probe(VLLM_VERSION, opt, dict(SHIM_RUNS)[opt], "on")
    state = run.process["states"]["kv_spec_merge"]
    wrapped = run.process["merge_wrapped"]
    summary = [line for line in run.stderr.splitlines() if "kv_spec_merge:" in line]
    assert len(summary) == 1, run.stderr[-3000:]
    assert f"kv_spec_merge: {state}" in summary[0]
    if opt != "plain":
        assert state == "applied"
        assert wrapped["MLAAttentionSpec"] and wrapped["FullAttentionSpec"]
        return
    # Without -O the patch is needed exactly where vLLM's own merge lacks the
    # capability semantics (measured here, in this venv, without the shim).
    unpatched = differential("plain")["original_capability_merge"]
    if unpatched is True:
        assert state.startswith("not needed: upstream fixed"), state
        assert not any(wrapped.values()), wrapped
    else:
        assert state == "applied"
        assert wrapped["MLAAttentionSpec"]
    if VLLM_VERSION == REFERENCE_RELEASE:
        assert state.startswith("not needed: upstream fixed")


# -- differential: hardened merge vs vLLM's own, over every merge classmethod ----

# Runs in a child with KIMI_HOTFIX_FORCE=kv_spec_merge (applied at import on
# every release). Outcomes: hardened (as applied), then original (after
# kimi_hotfix.undo), then hardened again (after kimi_hotfix.reapply). No
# ``assert`` here: the child may run under -O.
BATTERY = r'''
import dataclasses, enum, json, sys
import torch
import kimi_hotfix
from kimi_hotfix import core
from vllm.v1 import kv_cache_interface as kvi

CAP = "non_causal_multi_token_decode"
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

def spec_classes():
    return sorted((c for c in vars(kvi).values() if isinstance(c, type)
                   and issubclass(c, kvi.KVCacheSpec) and c.__module__ == kvi.__name__),
                  key=lambda c: c.__name__)

def is_mla(cls):
    return "cache_dtype_str" in {f.name for f in dataclasses.fields(cls)}

def base(cls):
    kw = {}
    for f in dataclasses.fields(cls):
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            if f.name == "kv_cache_specs":
                kw[f.name] = {"l0": kvi.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=bf16)}
            else:
                kw[f.name] = REQUIRED[f.name]
    if is_mla(cls):
        kw.update(num_kv_heads=1, head_size=576)
    return cls(**kw)

def other(name, value):
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
        return {"l1": kvi.FullAttentionSpec(block_size=16, num_kv_heads=4, head_size=64, dtype=bf16)}
    return None

def build_cases():
    cases, bases, unvaried = {}, {}, []
    for cls in spec_classes():
        try:
            b = base(cls)
        except Exception as exc:
            unvaried.append(f"{cls.__name__}: no base ({type(exc).__name__}: {exc})")
            continue
        bases[cls] = b
        n = cls.__name__
        cases[f"{n}.merge[b]"] = (cls, [b])
        cases[f"{n}.merge[b,b,b]"] = (cls, [b, b, b])
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            value = other(f.name, getattr(b, f.name))
            if value is None:
                unvaried.append(f"{n}.{f.name}")
                continue
            try:
                v = dataclasses.replace(b, **{f.name: value})
            except Exception as exc:
                unvaried.append(f"{n}.{f.name} ({type(exc).__name__})")
                continue
            cases[f"{n}.merge[b,{f.name}]"] = (cls, [b, v])
            cases[f"{n}.merge[{f.name},b]"] = (cls, [v, b])
            cases[f"{n}.merge[b,b,{f.name}]"] = (cls, [b, b, v])
            again = other(f.name, value)  # two variants: e.g. two sliding windows
            if again is not None and again != value:
                try:
                    w = dataclasses.replace(b, **{f.name: again})
                except Exception:
                    continue
                cases[f"{n}.merge[{f.name},{f.name}']"] = (cls, [v, w])
        if is_mla(cls):
            auto, bf = (dataclasses.replace(b, cache_dtype_str=s) for s in ("auto", "bfloat16"))
            cases[f"{n}.merge[auto,bfloat16]"] = (cls, [auto, bf])
            cases[f"{n}.merge[bfloat16,auto,auto]"] = (cls, [bf, auto, auto])
    for c1, b1 in bases.items():  # mixed types, called as the planner does
        for c2, b2 in bases.items():
            if c1 is not c2:
                cases[f"{c1.__name__}.merge[{c1.__name__},{c2.__name__}]"] = (c1, [b1, b2])
    return cases, sorted(bases, key=lambda c: c.__name__), unvaried

def outcome(cls, specs):
    try:
        result = cls.merge(list(specs))
    except Exception as exc:
        return f"raise {type(exc).__name__}: {str(exc)[:200]}"
    return f"ok {type(result).__name__} {result!r}"

def battery(cases):
    return {name: outcome(cls, specs) for name, (cls, specs) in cases.items()}

def group_capability(specs):
    """Each spec given the group's any() capability (the documented semantics)."""
    group = any(getattr(s, CAP, False) for s in specs)
    return [dataclasses.replace(s, **{CAP: group}) if hasattr(s, CAP) else s for s in specs]

def merge_owners():
    return [c for c in spec_classes() if "merge" in vars(c)]

def fresh_codes():
    """merge code objects compiled now from vLLM's own source file, as this
    interpreter (-O or not) compiled them at import."""
    src = open(kvi.__file__).read()
    module = compile(src, kvi.__file__, "exec", dont_inherit=True, optimize=-1)
    found, todo = {}, [module]
    while todo:
        code = todo.pop()
        for const in code.co_consts:
            if hasattr(const, "co_code"):
                todo.append(const)
                if const.co_name == "merge":
                    found[const.co_qualname] = const
    return found

out = {"optimize": sys.flags.optimize}
out["state_forced"] = kimi_hotfix.states()["kv_spec_merge"]
cases, classes, unvaried = build_cases()
out["classes"] = [c.__name__ for c in classes]
out["merge_owners"] = [c.__name__ for c in merge_owners()]
out["unvaried"] = unvaried
out["wrapped_forced"] = {c.__name__: core.is_wrapped(vars(c)["merge"]) for c in merge_owners()}
out["hardened"] = battery(cases)

kimi_hotfix.undo("kv_spec_merge")
out["state_undone"] = kimi_hotfix.states()["kv_spec_merge"]
originals = {c: vars(c)["merge"] for c in merge_owners()}
codes = fresh_codes()
out["restored"] = {
    c.__name__: (type(m) is classmethod and not core.is_wrapped(m)
                 and m.__func__.__code__ == codes.get(f"{c.__name__}.merge"))
    for c, m in originals.items()
}
out["original"] = battery(cases)
out["original_group_capability"] = {
    name: outcome(cls, group_capability(specs))
    for name, (cls, specs) in cases.items()
    if len({getattr(s, CAP, False) for s in specs}) > 1
}
target = base(kvi.MLAAttentionSpec)
try:
    out["original_capability_merge"] = getattr(
        kvi.MLAAttentionSpec.merge([target, dataclasses.replace(target, **{CAP: True})]), CAP)
except AssertionError as exc:
    out["original_capability_merge"] = f"AssertionError: {exc}"

kimi_hotfix.reapply("kv_spec_merge")
out["state_reapplied"] = kimi_hotfix.states()["kv_spec_merge"]
out["rewrapped_same_originals"] = {
    c.__name__: core.is_wrapped(vars(c)["merge"]) and vars(c)["merge"].__wrapped__ is m
    for c, m in originals.items() if core.is_wrapped(vars(c)["merge"])
}
out["hardened_again_equal"] = battery(cases) == out["hardened"]
kimi_hotfix.undo("kv_spec_merge")
out["undone_again_identical"] = all(vars(c)["merge"] is m for c, m in originals.items())
print("KIMI_JSON:" + json.dumps(out, sort_keys=True))
'''

_differentials: dict = {}


def differential(opt: str) -> dict:
    if opt not in _differentials:
        env = hermetic_env(PYTHONHASHSEED=0, KIMI_HOTFIX_FORCE="kv_spec_merge")
        proc = run_python(["-c", BATTERY], flags=FLAGS[opt], env=env, cwd=REPO)
        (_differentials[opt],) = json_lines(proc.stdout)
    return _differentials[opt]


def _mismatches(left: dict, right: dict, limit=8) -> list:
    bad = [(k, left.get(k), right.get(k)) for k in sorted(set(left) | set(right)) if left.get(k) != right.get(k)]
    return bad[:limit] + ([f"... {len(bad) - limit} more"] if len(bad) > limit else [])


def test_differential_covers_every_merge_classmethod():
    plain = differential("plain")
    assert plain["state_forced"].startswith("applied")
    # every class defining merge in the installed module has cases of its own
    assert set(plain["merge_owners"]) <= set(plain["classes"])
    for owner in plain["merge_owners"]:
        assert sum(1 for k in plain["hardened"] if k.startswith(owner + ".merge[")) > 10
    # the documented fields of the brief are varied where they exist
    varied = {k.split("[b,", 1)[1].rstrip("]") for k in plain["hardened"] if "[b," in k}
    assert {"block_size", "head_size", "dtype", "sliding_window", "cache_dtype_str",
            "model_version", "rswa_window", CAPABILITY} <= varied


def test_hardened_merge_equals_vllm_plain():
    """Same result or same exception as vLLM's own merge, except the
    documented capability: a group of MLA specs whose only disagreement is
    non_causal_multi_token_decode merges to what vLLM's own merge returns for
    the specs given the group's any() value."""
    plain = differential("plain")
    hardened, original = plain["hardened"], plain["original"]
    assert set(hardened) == set(original)
    capability = plain["original_group_capability"]
    unexplained = {
        k: (hardened[k], original[k])
        for k in hardened
        if hardened[k] != original[k] and not (k in capability and hardened[k] == capability[k])
    }
    assert unexplained == {}
    assert any(v.startswith("raise AssertionError") for v in original.values())
    assert any(v.startswith("ok ") for v in original.values())
    # The capability cases really are merged with any(), on every release.
    for key, result in capability.items():
        assert hardened[key] == result, key
    if plain["original_capability_merge"] is not True:  # pre-0.30 merge: the fix shows
        assert any(hardened[k] != original[k] for k in capability)


@pytest.mark.parametrize("opt", ["O", "OO"])
def test_hardened_merge_under_O_raises_where_plain_vllm_does(opt):
    plain, optimized = differential("plain"), differential(opt)
    assert optimized["optimize"] == LEVEL[opt]
    assert optimized["state_forced"] == "applied"
    common = set(plain["hardened"]) & set(optimized["hardened"])
    assert common == set(plain["hardened"]), "cases built under plain are missing under -O"
    hard_o = {k: optimized["hardened"][k] for k in common}
    assert _mismatches(hard_o, plain["hardened"]) == []
    # AssertionError exactly where plain-Python vLLM raises it (capability aside)
    capability = plain["original_group_capability"]
    raises_o = {k for k, v in hard_o.items() if v.startswith("raise AssertionError")}
    raises_plain = {
        k for k, v in plain["original"].items()
        if v.startswith("raise AssertionError") and k not in capability
    }
    assert raises_o - set(capability) == raises_plain
    # ...and the battery has teeth: vLLM's own merge under -O is different.
    orig_o = {k: optimized["original"][k] for k in common}
    assert _mismatches(orig_o, plain["original"], limit=1000), "-O changed nothing?"


@pytest.mark.parametrize("opt", OPT_IDS)
def test_undo_restores_vllm_classmethods(opt):
    result = differential(opt)
    assert result["state_forced"].startswith("applied")
    assert result["wrapped_forced"]["MLAAttentionSpec"]
    assert result["state_undone"] == "undone"
    assert result["restored"] and all(result["restored"].values()), result["restored"]
    assert result["state_reapplied"].startswith("applied")
    assert result["rewrapped_same_originals"] and all(result["rewrapped_same_originals"].values())
    assert result["hardened_again_equal"]
    assert result["undone_again_identical"]
