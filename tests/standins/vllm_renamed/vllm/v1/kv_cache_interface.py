"""Stand-in (shim mechanics only, NOT vLLM): KVCacheSpec renamed away."""


class KVCacheSpecBase:
    @classmethod
    def merge(cls, specs):
        return specs[0]


HOST_VALUE = "kv_cache_interface works"
