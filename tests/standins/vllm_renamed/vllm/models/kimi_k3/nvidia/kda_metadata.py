"""Stand-in (shim mechanics only, NOT vLLM): the builder's build() renamed."""


class KimiK3KDAMetadataBuilder:
    def build_metadata(self, *args, **kwargs):
        return "built"


HOST_VALUE = "kda_metadata works"
