"""Stand-in (shim mechanics only, NOT vLLM): a CacheConfig that has RecoverSSM."""
from dataclasses import dataclass, field


@dataclass
class CacheConfig:
    use_kda_recoverssm: bool = field(default=False, init=False)
