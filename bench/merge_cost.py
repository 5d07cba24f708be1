#!/usr/bin/env python3
"""What kv_spec_merge's wrapper costs per ``MLAAttentionSpec.merge`` call (issue 20, item 13).

vLLM's KV-cache planner merges the specs of every layer group it forms; a
Kimi-K3 model has 61 layers. The issue measured the patched merge at 170 us for
61 specs against 71 us for plain Python's own merge: the wrapper computed
``dataclasses.fields()`` for every spec on every call. Now it scans the specs
once for the draft capability and, where none has it on (every group without a
DSpark draft), passes them through unchanged; the per-class field check is
cached. The goal: at most 10 % over vLLM's own merge.

Side by side in one process, on the real vLLM, plain Python (where the shim
applies kv_spec_merge on 0.29.0 and the merge it runs is vLLM's own recompiled
with its asserts as raises, the same checks plain Python makes):
- vLLM's own merge (the function under the shim's wrapper, as this interpreter
  compiled it);
- the same again (A/A control: what "no difference" measures);
- ``MLAAttentionSpec.merge`` as the shim installed it.
Each round times ``--calls`` calls of each variant, in a shuffled order; the
figure is the median of the per-round ratio differences ``patched / own - 1``
(bench/stats.py: paired, bootstrap standard error, PASS only when median + 2
s.e. is within the limit).

A group with the draft capability on one member (61 specs, one draft) is timed
and printed too, without a verdict: there the wrapper copies every member that
lacks the capability (``dataclasses.replace``), which is the fix itself (vLLM
0.29.0's own merge refuses that group in plain Python and, under -O, drops the
capability: the illegal memory access).

    VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 VLLM_LOGGING_LEVEL=ERROR PYTHONPATH=. \
        ~/.cache/kimi-hotfix/uv-venvs/vllm-0.29.0-py3.11/bin/python bench/merge_cost.py \
        [--rounds 41] [--calls 200] [--specs 61]
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import stats

LIMIT = 0.10


def own_merge(cls):
    """vLLM's own merge under the shim's wrapper(s), bound to ``cls``."""
    from kimi_hotfix.runtime import wrapping
    own = vars(cls)["merge"]
    while wrapping.is_wrapped(own):
        own = own.__wrapped__
    return own.__get__(None, cls)


def rounds_of(variants, specs, rounds, calls):
    """{name: [seconds per call, one per round]}, variants shuffled per round."""
    out = {name: [] for name in variants}
    order = list(variants)
    rng = random.Random(0)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            fn = variants[name]
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(specs)
            out[name].append((time.perf_counter() - t0) / calls)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--specs", type=int, default=61)
    args = parser.parse_args(argv)

    import torch
    import vllm
    from vllm.v1 import kv_cache_interface as kvi

    from kimi_hotfix.runtime import core, wrapping
    cls = kvi.MLAAttentionSpec
    state = core.states()["kv_spec_merge"].as_dict()
    if state["kind"] != "applied" or not wrapping.is_wrapped(vars(cls)["merge"]):
        print(f"kv_spec_merge is not applied here ({state['text']}): run with PYTHONPATH=. "
              f"on vLLM 0.29.0, without KIMI_HOTFIX=0", file=sys.stderr)
        return 2
    shape = dict(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    target = [cls(**shape) for _ in range(args.specs)]
    with_draft = target[:-1] + [cls(**shape, non_causal_multi_token_decode=True)]
    own = own_merge(cls)
    variants = {"own": own, "own again": own, "patched": cls.merge}
    if repr(cls.merge(target)) != repr(own(target)):
        print("the patched merge and vLLM's own differ on the plain group", file=sys.stderr)
        return 1
    for _ in range(3):  # warm up
        rounds_of(variants, target, 1, args.calls)

    print(f"vLLM {vllm.__version__}, Python {sys.version.split()[0]}, "
          f"{'-O' if sys.flags.optimize else 'plain'}; {args.specs} MLA specs per merge; "
          f"{args.rounds} rounds of {args.calls} calls; {stats.machine()}")
    t = rounds_of(variants, target, args.rounds, args.calls)
    ratio = [p / o - 1 for o, p in zip(t["own"], t["patched"])]
    control = [a / o - 1 for o, a in zip(t["own"], t["own again"])]
    for name in variants:
        print(f"  no draft in the group: {name:10s} {stats.median(t[name]) * 1e6:7.1f} us per call")
    verdict, text = stats.verdict_line("patched / own - 1, no draft in the group",
                                       stats.estimate(ratio), LIMIT, stats.estimate(control))
    print(text)

    try:
        own_does = f"keeps {getattr(own(with_draft), 'non_causal_multi_token_decode', None)!r}"
    except AssertionError:
        own_does = "refuses the group: AssertionError"
    d = rounds_of({"patched": cls.merge}, with_draft, args.rounds, args.calls)
    print(f"  one draft in the group: patched {stats.median(d['patched']) * 1e6:.1f} us per call, "
          f"the capability {cls.merge(with_draft).non_causal_multi_token_decode!r} "
          f"(vLLM's own {own_does}); no verdict: copying the members is the fix")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
