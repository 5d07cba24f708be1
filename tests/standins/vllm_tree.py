"""The stand-in vLLM trees, built from each patch's ``standins.py`` (NOT vLLM).

``build("complete")``: a fake ``vllm`` (version 0.29.0) with every patch's target
as its ``standins.COMPLETE`` declares it, so every patch applies. ``build("renamed")``:
every target as ``standins.RENAMED`` declares it (the symbols the patch wraps
renamed away) plus ``HOST_VALUE = "<module> works"``, for the fault matrix. Both
carry the few modules below that the mechanics tests use beside the targets.

A tree is written once per content under ``tests/standins/.generated/`` (named by
the hash of its files; written beside and renamed into place, so concurrent test
processes never see half a tree) and reused after.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / ".generated"
PACKAGE_DOC = '"""Stand-in package (shim mechanics tests only; not vLLM)."""\n'
KINDS = ("complete", "renamed")

COMMON = {
    "complete": {
        "vllm.config.vllm": '''\
"""Stand-in (shim mechanics only, NOT vLLM): a VllmConfig whose checks are asserts."""


class VllmConfig:
    def __init__(self, block_size=16, interleave=1):
        self.block_size, self.interleave = block_size, interleave
        self.__post_init__()

    def __post_init__(self):
        assert self.block_size > 0, "block_size must be positive"

    def validate_block_size(self):
        assert self.block_size % self.interleave == 0, "interleave must divide block_size"
''',
        "vllm.distributed.parallel_state": '''\
"""Stand-in (shim mechanics only, NOT vLLM): a group getter that guards with assert."""

_INNER_DP_WORLD = None


def get_inner_dp_world_group():
    assert _INNER_DP_WORLD is not None, "inner dp world group is not initialized"
    return _INNER_DP_WORLD
''',
    },
    "renamed": {
        "vllm.config.vllm": '''\
"""Stand-in (shim mechanics only, NOT vLLM): VllmConfig renamed away."""


class EngineConfig:
    pass


HOST_VALUE = "vllm works"
''',
        "vllm.distributed.parallel_state": '''\
"""Stand-in (shim mechanics only, NOT vLLM): the group getter renamed away."""


def get_inner_data_parallel_group():
    return None


HOST_VALUE = "parallel_state works"
''',
    },
}


def _patches():
    from kimi_hotfix.patches import PATCHES
    return PATCHES


def sources(kind: str) -> dict:
    """{relative path: text} of the ``kind`` tree."""
    if kind not in KINDS:
        raise ValueError(f"no stand-in tree {kind!r}: one of {KINDS}")
    modules = {"vllm": f'"""Stand-in for vllm (shim mechanics tests only): NOT vLLM."""\n'
                       f'__version__ = "0.29.0"\nSTANDIN = "vllm_{kind}"\n'}
    modules.update(COMMON[kind])
    for name, target in _patches().items():
        try:
            declared = importlib.import_module(f"kimi_hotfix.patches.{name}.standins")
        except ModuleNotFoundError as exc:
            raise RuntimeError(f"{name} declares no stand-ins: kimi_hotfix/patches/{name}/standins.py "
                               f"({exc})") from None
        own = dict(declared.COMPLETE if kind == "complete" else declared.RENAMED)
        if target not in own:
            raise RuntimeError(f"{name}'s standins.{kind.upper()} lacks its target {target}")
        if kind == "renamed":
            leaf = target.rsplit(".", 1)[-1]
            own[target] += f'\n\nHOST_VALUE = "{leaf} works"\n'
        for module, text in own.items():
            if modules.get(module, text) != text:
                raise RuntimeError(f"{name} declares {module} unlike another patch does")
            modules[module] = text
    files = {}
    for module in modules:
        parts = module.split(".")
        for i in range(1, len(parts)):
            files.setdefault("/".join(parts[:i]) + "/__init__.py", PACKAGE_DOC)
    for module, text in modules.items():
        parts = module.split(".")
        package = "/".join(parts) + "/__init__.py"
        files[package if package in files or module == "vllm" else "/".join(parts) + ".py"] = text
    return files


def build(kind: str) -> Path:
    """The ``kind`` tree's directory (for ``PYTHONPATH``), written if missing."""
    files = sources(kind)
    digest = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:12]
    final = OUT / f"vllm_{kind}-{digest}"
    if final.is_dir():
        return final
    OUT.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".vllm_{kind}-", dir=OUT))
    for rel, text in files.items():
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    try:
        os.rename(work, final)
    except OSError:  # another process wrote the same tree first
        shutil.rmtree(work, ignore_errors=True)
    return final
