"""config_checks: VllmConfig refuses under ``-O`` what it refuses in plain Python.

Why: ``VllmConfig`` (``vllm/config/vllm.py``) checks the engine configuration
with bare ``assert`` statements, which ``python -O`` strips. For the Kimi-K3
DCP8 servers the one that matters is ``validate_block_size``: with decode
context parallelism the KV-cache interleave size must be at most the block size
and divide it (``cp_kv_cache_interleave_size``, set by
``--cp-kv-cache-interleave-size``/``--dcp-kv-cache-interleave-size``). The
engine core calls it after planning the KV cache; plain Python refuses a
misfit (``AssertionError: Block_size(64) should be greater than or equal to and
divisible by cp_kv_cache_interleave_size (128).``), ``-O`` starts the server with
it. ``__post_init__`` holds others: the NIXL prefill/decode checks on
``decode_context_parallel_size`` (0.30.0 and later), the piecewise-CUDA-graph
compilation mode, the micro-batching all2all backends; ``_set_cudagraph_sizes``
and ``_set_compile_ranges`` check the capture sizes and compile ranges.

What it changes: every ``VllmConfig`` method in ``CHECKED`` whose source holds
an ``assert`` is recompiled from vLLM's own source with each ``assert`` written
as ``if not ...: raise AssertionError(...)`` (kimi_hotfix.hardening), on the
first call of any of them in a process (the API server and the engine core
construct a VllmConfig; workers unpickle it and pay nothing). The checks then
refuse exactly what plain Python refuses, with the same AssertionError and
message. This restores plain-Python failures; it adds none: a configuration
that plain Python accepts is accepted unchanged.

Upstream: no PR yet (upstream/0003-vllm-config-explicit-checks.patch); no release
up to 0.33.0 checks these without assert (measured: 0.29.0, 0.30.0, 0.33.0).
0003 raises ``ValueError``, as the rest of ``vllm/config/vllm.py`` does, and
leaves the type-narrowing asserts (``isinstance(...)``, ``x is not None``).

Which exception: this patch raises ``AssertionError``, what plain Python raises
on every release it applies to, and not 0003's ``ValueError``. Its promise is
parity with plain Python on the same image: the same refusal, exception type
and message (``validate_block_size``'s ``AssertionError``; pydantic's
``assertion_error`` entry in the ``ValidationError`` of ``__post_init__``), so
a log search, an alert or a script that matches plain Python's failure matches
the ``-O`` one. Raising ``ValueError`` would make ``-O`` differ from plain
Python on those releases. On a vLLM that carries 0003 the patch is not needed
(see below) and vLLM raises ``ValueError`` with and without ``-O``: the shim
never stands between the two. tests/real/test_o_parity.py checks the
``AssertionError`` under ``-O`` on 0.29.0, 0.30.0 and 0.33.0, and
tests/real/test_upstream.py that ``check`` finds it not needed once 0003 is in.

Needed when (``check``): under ``-O``, one of those methods' source still
holds an ``assert`` other than a type-narrowing one (``isinstance(...)`` or
``x is not None``, with no message; a structural check on the parsed source:
hardening.checks). Type-narrowing asserts restate what vLLM's
own code guarantees (a dtype already resolved, a list pydantic validated as
``list[int]``), refuse no configuration, and are what 0003 leaves. Without
``-O`` the asserts are live: not affected. No source: cannot tell, and
nothing to recompile: ``failed`` (vLLM's own methods run).
"""

from __future__ import annotations

from kimi_hotfix import base, hardening, patching

NOTE = "parity: refuses what plain Python refuses"  # in the state: no new failure
CHECKED = ("__post_init__", "_set_cudagraph_sizes", "_set_compile_ranges", "validate_block_size")


def config_class(module):
    cls = getattr(module, "VllmConfig", None)
    if not isinstance(cls, type):
        raise base.PatchError("vllm.config.vllm.VllmConfig not found")
    return cls


def methods(module) -> dict:
    """{name: function} of the CHECKED methods this VllmConfig defines."""
    cls = config_class(module)
    return {name: hardening.require(cls, name) for name in CHECKED if name in vars(cls)}


def asserted(module) -> dict:
    """{name: number of asserts, less the type-narrowing ones} for the CHECKED
    methods (None: no source)."""
    return {name: hardening.checks(func) for name, func in methods(module).items()}


def decide(module, optimize) -> patching.Decision:
    if not any(name in vars(config_class(module)) for name in CHECKED):
        return patching.absent(f"VllmConfig defines none of {', '.join(CHECKED)} in this vLLM")
    if not optimize:  # decided without reading source: every process pays this check
        return patching.absent("python without -O keeps VllmConfig's asserts")
    found = asserted(module)
    unknown = sorted(name for name, count in found.items() if count is None)
    if unknown:
        return patching.cannot_tell(f"source of VllmConfig.{', '.join(unknown)} unavailable")
    guarded = [name for name, count in found.items() if count]
    if not guarded:
        return patching.fixed("VllmConfig checks without assert (type-narrowing asserts aside)")
    return patching.needed(f"-O strips the asserts of VllmConfig.{', VllmConfig.'.join(guarded)}")


def install(module, ctx):
    cls = config_class(module)
    funcs = {n: f for n, f in methods(module).items() if hardening.asserts(f) != 0}
    lazy = hardening.OnFirstCall(ctx, list(funcs.values()))
    for attr, func in funcs.items():
        ctx.wrap(cls, attr, lazy.wrapper(func))
    return NOTE


class ConfigChecksPatch(patching.Patch):
    name = "config_checks"
    target = "vllm.config.vllm"
    wraps = tuple(f"VllmConfig.{n}" for n in CHECKED)
    upstream = "no PR yet (upstream/0003-vllm-config-explicit-checks.patch)"
    fixed_in = ""
    asserts_measured_up_to = "0.33.0"
    symptoms = ("a configuration plain Python refuses with AssertionError starts under -O "
                "(e.g. cp_kv_cache_interleave_size that does not divide the block size, DCP)",)
    summary = "VllmConfig's assert checks raise under -O as in plain Python (restores refusals)"
    decides = "under -O: a source check for asserts in VllmConfig's checking methods"
    probe_title = ("VllmConfig.validate_block_size with DCP 8, block 64, interleave 128: "
                   "refused or accepted")

    def check(self, module, optimize):
        return decide(module, optimize)

    def apply(self, module, ctx):
        return install(module, ctx)


    def expect(self, version, optimize):
        if version is None:
            return super().expect(version, optimize)
        if not optimize:
            return self.expect_plain_unaffected(version, "VllmConfig's asserts are live")
        return self.expect_optimized(version, "VllmConfig")

    def probe(self):
        return patching.run_probe(self)  # probe.py, beside this file


PATCH = ConfigChecksPatch()
