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
