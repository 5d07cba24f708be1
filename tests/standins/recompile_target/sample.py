"""Stand-in (shim mechanics only, NOT vLLM): functions for the recompile tests."""


def passthrough(func):
    return func


class Sample:
    @classmethod
    def merge(cls, x):
        """Docstring, indented like a method's."""
        text = """first line
not indented: dedenting the source would change this string"""
        assert x > 0, "x must be positive"
        return text, x

    @passthrough
    def build(self, common_attn_metadata, num_decode_draft_tokens_cpu=None):
        if common_attn_metadata < 0:
            raise ValueError("negative input")
        return common_attn_metadata * 2, num_decode_draft_tokens_cpu

    def swapped(self):
        return "the source says this"

    def nested(self, n):
        # no ``from __future__ import annotations`` in this module: the inner
        # def's annotations are evaluated in this function's own bytecode
        def scaled(x: int) -> "list[int]":
            return [x * n]

        class Box:  # its body stores its __qualname__ as a constant
            value = n

        return [scaled(i) for i in range(n)], Box.__qualname__, Box.value


if True:  # an import nested in a block: not at column 0
    import json as nested_json


def signature(
    value,
    indent=None,
):  # the signature closes at the def's own indentation, as vLLM's often do
    return nested_json.dumps(value, indent=indent)


def closure_maker():
    value = 3

    def uses_closure():
        return value

    return uses_closure


def countdown(n):
    """Module level and recursive: its own name is a global here."""
    return [] if n <= 0 else [n] + countdown(n - 1)


# running code that differs from the source next to it, as when a .py was edited
# after its bytecode was loaded: same function, same lines, another constant
_code = Sample.swapped.__code__
Sample.swapped.__code__ = _code.replace(co_consts=tuple(
    "but the running code says that" if c == "the source says this" else c
    for c in _code.co_consts))
