"""Stand-ins for kv_spec_merge (the unit tier's fake vLLM, tests/standins/vllm_tree.py;
NOT vLLM, never imported by a vLLM process).

COMPLETE: each module as it looks where the patch applies. RENAMED: the target
with the symbols the patch wraps renamed away (the tree adds HOST_VALUE), and
RENAMED_STATE, the state the patch reads there: it warns, skips, the host runs.
"""

COMPLETE = {
    "vllm.v1.kv_cache_interface": '''\
"""Stand-in (shim mechanics only, NOT vLLM): the names kv_spec_merge looks for.

``MLAAttentionSpec.merge`` guards the draft capability with a bare assert and
then takes it from ``set.pop()``, like vLLM 0.29.0: kv_spec_merge's behaviour
probe finds it "rejects" (plain Python, or -O with -O parity) or "drops" (bare
-O) the capability, so the patch applies. ``torch`` stands in for the real
module's own import (the probe reads ``bfloat16`` from it).
"""
from dataclasses import dataclass
from types import SimpleNamespace

torch = SimpleNamespace(bfloat16="bfloat16")


@dataclass(frozen=True)
class KVCacheSpec:
    block_size: int

    @classmethod
    def merge(cls, specs):
        assert all(spec == specs[0] for spec in specs[1:]), "specs differ"
        return specs[0]


@dataclass(frozen=True)
class FullAttentionSpec(KVCacheSpec):
    num_kv_heads: int = 1
    head_size: int = 0
    dtype: object = None

    @classmethod
    def merge(cls, specs):
        assert all(s.head_size == specs[0].head_size for s in specs), "head sizes differ"
        return specs[0]


@dataclass(frozen=True)
class MLAAttentionSpec(FullAttentionSpec):
    non_causal_multi_token_decode: bool = False

    @classmethod
    def merge(cls, specs):
        flags = {spec.non_causal_multi_token_decode for spec in specs}
        assert len(flags) == 1, "the group must agree on non_causal_multi_token_decode"
        return cls(block_size=specs[0].block_size, num_kv_heads=specs[0].num_kv_heads,
                   head_size=specs[0].head_size, dtype=specs[0].dtype,
                   non_causal_multi_token_decode=flags.pop())
''',
}
RENAMED = {
    "vllm.v1.kv_cache_interface": '''\
"""Stand-in (shim mechanics only, NOT vLLM): KVCacheSpec renamed away."""


class KVCacheSpecBase:
    @classmethod
    def merge(cls, specs):
        return specs[0]
''',
}
RENAMED_STATE = "failed: vllm.v1.kv_cache_interface.KVCacheSpec not found"
