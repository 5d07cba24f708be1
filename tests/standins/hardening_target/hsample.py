"""Stand-in functions for kimi_hotfix.hardening (shim mechanics only)."""

STATE = {"group": None}


def getter():
    assert STATE["group"] is not None, "group is not initialized"
    return STATE["group"]


def no_assert(x):
    return x + 1


def narrowing(value, limit):
    assert isinstance(value, int)
    assert limit is not None
    assert value is not None, "a message makes it a check"
    assert value > 0, f"value {value} must be positive"
    return value


class Config:
    def __init__(self, size):
        self.size = size

    def check(self, limit):
        text = """
an assert at column 0 inside a string:
assert nothing
"""
        if self.size > 1:
            assert self.size <= limit, f"size {self.size} over {limit}"
        def nested():
            assert limit > 0
        nested()
        return text
