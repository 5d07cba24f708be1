"""``check``'s view of -O parity (kimi_hotfix.runtime.parity): its probe, on the real vLLM.

A tool's module: ``check`` loads it, a vLLM process never does. Each case
calls vLLM's own code where plain Python refuses with an ``AssertionError``
and ``python -O`` does not, in every release up to 0.33.0 (a site of each
kind the deployments meet: the planner's spec merges, a process-group getter
a barrier falls back from, a configuration check, a KV-cache block guard).
Each runs with plain code (compiled from the source at level 0; a module -O
parity loaded has it already) and, "without" parity, with the code compiled
at this interpreter's optimize level (what vLLM runs under ``-O`` without the
shim): a case whose outcomes differ is what -O takes away. Without ``-O`` the
two are the same: nothing to restore.
"""

from __future__ import annotations

import contextlib
import importlib
import sys

from kimi_hotfix.runtime import parity, patching, versions
from kimi_hotfix.runtime.patching import ProbeResult
from kimi_hotfix.tools.about import About


def _mla_before_mamba():
    import torch
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.kv_cache_interface import MambaSpec, MLAAttentionSpec

    planner = getattr(kv_cache_utils, "is_kv_cache_spec_uniform", None)
    if planner is None:  # 0.33.0 keeps the planner in kv_cache_planning
        planner = importlib.import_module("vllm.v1.core.kv_cache_planning").is_kv_cache_spec_uniform
    mla = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    mamba = MambaSpec(block_size=64, shapes=((4, 128, 128),), dtypes=(torch.float32,))
    return planner({"mla.0": mla, "kda.0": mamba})


def _cache_dtypes_differ():
    import torch
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    mla = [MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16,
                            cache_dtype_str=dtype) for dtype in ("auto", "bfloat16")]
    return MLAAttentionSpec.merge(mla).cache_dtype_str


def _inner_dp_group():
    from vllm.distributed import parallel_state

    if getattr(parallel_state, "_INNER_DP_WORLD", None) is not None:
        raise RuntimeError("this process has an inner-DP world group: the case cannot run here")
    return parallel_state.get_inner_dp_world_group()


def _interleave_misfit():
    from vllm.config import VllmConfig

    config = VllmConfig()
    config.parallel_config.decode_context_parallel_size = 8
    config.cache_config.block_size = 64
    config.parallel_config.cp_kv_cache_interleave_size = 128
    return config.validate_block_size()


def _queue_without_tail():
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock

    queue = FreeKVCacheBlockQueue([])
    queue.fake_free_list_tail.prev_free_block = None  # a corrupted free list
    return queue.append_n([KVCacheBlock(block_id=0)])


# label -> (vLLM modules whose functions the case runs, the case)
CASES = {
    "MLA + KDA/Mamba layers (is_kv_cache_spec_uniform)":
        (("vllm.v1.kv_cache_interface", "vllm.v1.core.kv_cache_utils",
          "vllm.v1.core.kv_cache_planning"), _mla_before_mamba),
    "MLA specs whose cache dtypes differ (MLAAttentionSpec.merge)":
        (("vllm.v1.kv_cache_interface",), _cache_dtypes_differ),
    "no inner-DP group (get_inner_dp_world_group)":
        (("vllm.distributed.parallel_state",), _inner_dp_group),
    "DCP 8, block 64, interleave 128 (validate_block_size)":
        (("vllm.config.vllm",), _interleave_misfit),
    "a free list without its tail (FreeKVCacheBlockQueue.append_n)":
        (("vllm.v1.core.kv_cache_utils",), _queue_without_tail),
}


def _outcome(case) -> str:
    try:
        result = case()
    except Exception as exc:
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}"
    return f"returns {result!r}"[:120]


@contextlib.contextmanager
def compiled_at(modules, level):
    """Within the block, the functions of ``modules`` (those imported) run code
    compiled from their source at ``level``, where the module is not already
    compiled at it; afterwards they run what they ran before."""
    swaps = []
    try:
        for name in modules:
            module = sys.modules.get(name)
            if module is None or _level(module) == level:
                continue
            origin = module.__spec__.origin
            with open(origin, "rb") as f:
                tree = compile(f.read(), origin, "exec", dont_inherit=True, optimize=level)
            codes: dict = {}
            for code in parity._code_tree(tree):
                codes.setdefault((code.co_name, code.co_firstlineno), []).append(code)
            for func in parity._functions(module, origin):
                old = func.__code__
                found = codes.get((old.co_name, old.co_firstlineno), ())
                if len(found) != 1 or found[0] == old:
                    continue
                new = found[0]
                stripped, plain = (old, new) if level == 0 else (new, old)
                if parity._same_def(stripped, plain):  # plain code names more (its asserts)
                    func.__code__ = new
                    swaps.append((func, old))
        yield
    finally:
        for func, old in reversed(swaps):
            func.__code__ = old


def _level(module) -> int:
    return 0 if parity.runs_plain(module) else sys.flags.optimize


class ParityAbout(About):
    """-O parity concerns python -O only, in every vLLM release."""

    def expect(self, version, optimize):
        if version is None:
            return super().expect(version, optimize)
        if not optimize:
            dev = " (a dev build: the code decides)" if versions.is_prerelease(version) else ""
            return False, f"not affected without -O (vLLM's asserts are live){dev}"
        return True, "needed under -O: every vLLM release steers by assert"


ABOUT = ParityAbout(
    upstream="no PR: vLLM steers by assert in every release (fixes for the sites: upstream/)",
    symptoms=(
        ("AttributeError: 'MambaSpec' object has no attribute 'cache_dtype_str'",
         "MLA layers with different cache_dtype_str merged (python -O; varies with PYTHONHASHSEED)"),
        ("AttributeError: 'SlidingWindowSpec' object has no attribute 'attention_chunk_size'",
         "at engine start-up, then Engine core initialization failed (python -O; a model mixing "
         "sliding-window and full-attention layers, full layer first)",
         "sliding layer first (python -O): no error, one KV-cache group, another KV cache size, "
         "greedy text departs from plain Python's after the window"),
        ("AttributeError: 'NoneType' object has no attribute 'barrier'",
         "at worker start-up with CPU KV offload (python -O)"),
        ("a configuration plain Python refuses with AssertionError starts under -O "
         "(e.g. cp_kv_cache_interleave_size that does not divide the block size, DCP)",),
        ("KV-cache guards gone under -O: a wrong block goes on silently where plain Python "
         "stops (vLLM's own tests under python -O: tests/vllm_suite/)",),
    ),
    summary=("under -O, vLLM's modules run plain Python's bytecode: every assert as in "
             "plain Python"),
    decides="python -O or not (every vLLM release steers by assert)",
    probe_title="vLLM's own guards under this interpreter: refused as in plain Python?",
)


class ParityCheck(patching.Patch, internal=True):
    """-O parity as ``check`` reports it, next to the patches (no registry entry:
    kimi_hotfix.runtime.core arms it; what the tools say about it: ``ABOUT``)."""

    name = "o_parity"
    target = "vllm"

    def decide(self, module, optimize):
        if not optimize:
            return patching.absent("python without -O keeps vLLM's asserts")
        return patching.needed("-O strips vLLM's asserts")

    def apply(self, module, ctx):
        raise NotImplementedError("-O parity is armed by kimi_hotfix.runtime.core, not applied")

    _on = True

    def probe(self) -> ProbeResult:
        """Each case with the code of this interpreter's level (without parity)
        or plain code (with it), against plain code: as in plain Python?"""
        level = 0 if self._on else sys.flags.optimize
        cases, differ = {}, []
        for label, (modules, case) in CASES.items():
            for name in modules:
                with contextlib.suppress(ImportError):
                    importlib.import_module(name)
            with compiled_at(modules, 0):
                plain = _outcome(case)
            if level:
                with compiled_at(modules, level):
                    cases[label] = _outcome(case)
            else:
                cases[label] = plain
            if cases[label] != plain:
                differ.append(label)
                cases[label] += f" (plain Python: {plain})"
        if not differ:
            return ProbeResult(ok=True, cases=cases, detail="every case as in plain Python")
        return ProbeResult(ok=False, cases=cases, detail=(
            f"{len(differ)} of {len(cases)} cases differ from plain Python: vLLM's asserts "
            "are stripped"))

    @contextlib.contextmanager
    def toggled(self, on: bool):
        """``check``'s toggle: within the block the probe runs with parity (on)
        or without it; nothing else in the process changes."""
        from kimi_hotfix.runtime import core
        self._on = on
        try:
            yield core.parity_state()
        finally:
            self._on = True


PROBE = ParityCheck()
