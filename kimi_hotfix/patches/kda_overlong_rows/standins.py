"""Stand-ins for kda_overlong_rows (the unit tier's fake vLLM, tests/standins/vllm_tree.py;
NOT vLLM, never imported by a vLLM process).

COMPLETE: each module as it looks where the patch applies. RENAMED: the target
with the symbols the patch wraps renamed away (the tree adds HOST_VALUE), and
RENAMED_STATE, the state the patch reads there: it warns, skips, the host runs.
"""

COMPLETE = {
    "vllm.models.kimi_k3.nvidia.kda_metadata": '''\
"""Stand-in (shim mechanics only, NOT vLLM): a builder whose RecoverSSM path
raises on long rows and does not route them, so kda_overlong_rows applies."""


class KimiK3KDAMetadataBuilder:
    def __init__(self, num_spec=1):
        self.use_recoverssm = True
        self.num_spec = num_spec

    def build(self, common_prefix_len, common_attn_metadata, num_accepted_tokens=None,
              num_decode_draft_tokens_cpu=None, fast_build=False):
        if self.use_recoverssm and common_attn_metadata.max_query_len > self.num_spec + 1:
            raise ValueError("stand-in capacity error")
        return "built"
''',
}
RENAMED = {
    "vllm.models.kimi_k3.nvidia.kda_metadata": '''\
"""Stand-in (shim mechanics only, NOT vLLM): the builder's build() renamed."""


class KimiK3KDAMetadataBuilder:
    def build_metadata(self, *args, **kwargs):
        return "built"
''',
}
RENAMED_STATE = "failed: KimiK3KDAMetadataBuilder.build not found"
