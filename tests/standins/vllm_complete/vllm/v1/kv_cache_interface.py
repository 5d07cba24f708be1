"""Stand-in (shim mechanics only, NOT vLLM): the names kv_spec_merge looks for.

``merge`` guards with a bare assert, like the real module, so under -O the patch
recompiles it; there is no MLAAttentionSpec, so the capability probe (which
needs torch) is not reached.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class KVCacheSpec:
    block_size: int

    @classmethod
    def merge(cls, specs):
        assert all(spec == specs[0] for spec in specs[1:]), "specs differ"
        return specs[0]


@dataclass(frozen=True)
class FullAttentionSpec(KVCacheSpec):
    head_size: int = 0

    @classmethod
    def merge(cls, specs):
        assert all(s.head_size == specs[0].head_size for s in specs), "head sizes differ"
        return specs[0]
