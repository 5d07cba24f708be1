"""Stand-in (shim mechanics only, NOT vLLM): a VllmConfig whose checks are asserts."""


class VllmConfig:
    def __init__(self, block_size=16, interleave=1):
        self.block_size, self.interleave = block_size, interleave
        self.__post_init__()

    def __post_init__(self):
        assert self.block_size > 0, "block_size must be positive"

    def validate_block_size(self):
        assert self.block_size % self.interleave == 0, "interleave must divide block_size"
