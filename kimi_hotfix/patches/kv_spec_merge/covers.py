"""The ``-O`` audit's sites this patch covers (python -m kimi_hotfix audit).

Rows of kimi_hotfix.audit.reviewed, kept next to the patch: (qualified name,
{normalised source hash: the release it was reviewed in}, why). Read only by
the audit, never when vLLM is imported.
"""

_PLANNER = ("The planner tells KV-cache specs that cannot share a group apart by the "
            "AssertionError their merge raises. -O strips the asserts in the spec merges "
            "(KVCacheSpec.merge too, in 0.29.0): incompatible specs merge, or the merge runs "
            "into an AttributeError nothing catches. kv_spec_merge recompiles every merge with "
            "an assert so that it raises AssertionError under -O.")
_MERGE = ("A KV-cache spec merge the planner calls through is_kv_cache_spec_uniform and "
          "the page-size bucketing; kv_spec_merge recompiles it with each assert raising "
          "AssertionError (docs/o-parity.md).")
_KVI = "vllm.v1.kv_cache_interface."

COVERS = tuple(
    row
    for module, releases in (("vllm.v1.core.kv_cache_utils", "0.29.0, 0.30.0"),
                             ("vllm.v1.core.kv_cache_planning", "0.33.0"))
    for row in (
        (f"{module}.is_kv_cache_spec_uniform", {"4fb234c47f924b49": releases}, _PLANNER),
        (f"{module}._get_kv_cache_groups_uniform_page_size", {"878f77328682ee52": releases},
         _PLANNER),
    )
) + (
    (_KVI + "KVCacheSpec.merge", {"6aa5555bea667a3a": "0.29.0"},
     _MERGE + " 0.30.0 raises explicitly here."),
    (_KVI + "FullAttentionSpec.merge",
     {"347f6a4dc51a21f1": "0.29.0, 0.30.0", "7c4172adfc14adba": "0.33.0"}, _MERGE),
    (_KVI + "MLAAttentionSpec.merge",
     {"b05f2f8b2bfb5c4f": "0.29.0", "565140f506465636": "0.30.0",
      "749336663f30638d": "0.33.0"}, _MERGE),
    (_KVI + "RSWASpec.merge",
     {"362f0b74c6ba6989": "0.29.0, 0.30.0", "9edf63275ff6eae5": "0.33.0"}, _MERGE),
    (_KVI + "SinkFullAttentionSpec.merge",
     {"d53a168aa6ab5a9b": "0.29.0, 0.30.0", "f519f660bb338c67": "0.33.0"}, _MERGE),
    (_KVI + "SlidingWindowMLASpec.merge",
     {"c7f1a63b666cda03": "0.29.0, 0.30.0", "fc0e8db89c7a2ed4": "0.33.0"}, _MERGE),
)
