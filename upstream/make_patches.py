"""Rebuild the upstream patches from the released vLLM 0.33.0 files.

    python upstream/make_patches.py VLLM_0_33_TREE [--check]

VLLM_0_33_TREE holds the ``vllm/`` package of the 0.33.0 wheel (e.g.
``~/.cache/kimi-hotfix/vllm/vllm-0.33.0``). For each patch, a scratch git
repository gets the original files, the edit below and the regression test
from ``upstream/tests/``, and ``git format-patch --signoff`` writes
``upstream/000N-*.patch`` (author and sign-off: this checkout's git identity).
The edits turn ``assert cond, msg`` into ``if not cond: raise
AssertionError(msg)`` (same exception, same message, the condition evaluated
once), in the functions named, and ``ruff format --line-length 88`` (vLLM's
setting; these files are ruff-formatted as released) lays them out.
0001's edit is the hand-written one kept in its patch (it reads better than
the mechanical one and was reviewed as such). ``--check`` rebuilds into a
scratch directory and fails when a committed patch's diff differs.
"""

from __future__ import annotations

import argparse
import ast
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUFF = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")


def _condition(source, test):
    """Source text of ``not test``, written the way a person would."""
    seg = ast.get_source_segment(source, test)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return ast.get_source_segment(source, test.operand)
    if (isinstance(test, ast.Compare) and len(test.ops) == 1
            and type(test.ops[0]) in (ast.Is, ast.IsNot, ast.In, ast.NotIn)):
        inverse = {ast.Is: "is not", ast.IsNot: "is", ast.In: "not in", ast.NotIn: "in"}
        left = ast.get_source_segment(source, test.left)
        right = ast.get_source_segment(source, test.comparators[0])
        return f"{left} {inverse[type(test.ops[0])]} {right}"
    if isinstance(test, (ast.Call, ast.Name, ast.Attribute)):
        return f"not {seg}"
    return f"not ({seg})"


def mechanical(source: str, functions: list[str]) -> str:
    """``source`` with every assert in the named ``Class.method``/``function``
    defs written as an explicit raise. An assert that is the whole body of an
    ``if`` (no ``else``) joins that ``if``'s condition: ``if a: assert b``
    becomes ``if a and not b: raise`` (the same evaluation; what ruff's SIM102
    asks for)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    targets = []

    def visit(body, prefix):
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if prefix + node.name in functions:
                    targets.extend(node for node in ast.walk(node))

    visit(tree.body, "")
    parents = {id(child): node for node in targets for child in ast.iter_child_nodes(node)}
    asserts = [n for n in targets if isinstance(n, ast.Assert)]
    if not asserts:
        raise SystemExit(f"no assert found in {functions}")
    for node in sorted(asserts, key=lambda n: n.lineno, reverse=True):
        condition = _condition(source, node.test)
        first = node
        parent = parents.get(id(node))
        if isinstance(parent, ast.If) and parent.body == [node] and not parent.orelse:
            outer = ast.get_source_segment(source, parent.test)
            if isinstance(parent.test, ast.BoolOp) and isinstance(parent.test.op, ast.Or):
                outer = f"({outer})"
            condition, first = f"({outer}\nand {condition})", parent
        indent = lines[first.lineno - 1][: first.col_offset]
        message = ast.get_source_segment(source, node.msg) if node.msg is not None else ""
        new = f"{indent}if {condition}:\n{indent}    raise AssertionError({message})\n"
        lines[first.lineno - 1:node.end_lineno] = [new]
    return "".join(lines)


PATCHES = [
    {
        "name": "0002-parallel-state-inner-dp-getter-explicit-check",
        "subject": "[Bugfix] Raise AssertionError explicitly in get_inner_dp_world_group",
        "body": (
            "CPU KV offload's _all_workers_barrier (vllm/v1/kv_offload/cpu/spec.py)\n"
            "falls back to the world group when get_inner_dp_world_group() raises\n"
            "AssertionError, i.e. when no DP replica spans nodes. The getter guards\n"
            "with a bare assert, which python -O strips: it then returns None and\n"
            "the barrier fails with AttributeError: 'NoneType' object has no\n"
            "attribute 'barrier' when the offloading worker is created.\n\n"
            "Raise the AssertionError explicitly, as KVCacheSpec.merge does since\n"
            "#55234. Behaviour without -O is unchanged."
        ),
        "edits": {"vllm/distributed/parallel_state.py": ["get_inner_dp_world_group"]},
        "tests": ["tests/v1/kv_offload/cpu/test_all_workers_barrier_optimized.py"],
    },
    {
        "name": "0003-vllm-config-explicit-checks",
        "subject": "[Bugfix] Keep VllmConfig's checks under python -O",
        "body": (
            "VllmConfig validates the engine configuration with bare asserts in\n"
            "__post_init__, _set_cudagraph_sizes, _set_compile_ranges and\n"
            "validate_block_size. python -O strips them, so configurations that\n"
            "plain Python refuses start anyway, e.g. a decode context parallel\n"
            "interleave size that does not divide the block size, or NIXL P/D\n"
            "with decode_context_parallel_size neither 1 nor the transfer size.\n\n"
            "Raise the same AssertionError with the same message explicitly.\n"
            "Behaviour without -O is unchanged (pydantic still reports the\n"
            "__post_init__ ones as a ValidationError)."
        ),
        "edits": {"vllm/config/vllm.py": ["VllmConfig.__post_init__",
                                          "VllmConfig._set_cudagraph_sizes",
                                          "VllmConfig._set_compile_ranges",
                                          "VllmConfig.validate_block_size"]},
        "tests": ["tests/config/test_vllm_config_optimized.py"],
    },
]

FIRST = {
    "name": "0001-kv-cache-spec-merge-explicit-checks",
    "subject": "[Bugfix] Raise AssertionError explicitly in KV cache spec merges",
    "body": (
        "The KV cache spec merges (FullAttentionSpec, MLAAttentionSpec, RSWASpec,\n"
        "SlidingWindowMLASpec, SinkFullAttentionSpec) guard their inputs with\n"
        "bare assert statements, which python -O strips. The planner tells\n"
        "incompatible specs apart by catching AssertionError from these merges\n"
        "(is_kv_cache_spec_uniform, _get_kv_cache_groups_uniform_page_size), so\n"
        "under -O it merges MLA specs with different cache_dtype_str (the value\n"
        "kept comes from set.pop(), i.e. depends on PYTHONHASHSEED), fails with\n"
        "AttributeError: 'MambaSpec' object has no attribute 'cache_dtype_str'\n"
        "when MLA layers are listed before a Mamba layer, and with\n"
        "'SlidingWindowSpec' object has no attribute 'attention_chunk_size'\n"
        "when a full-attention layer is listed before a sliding-window one.\n\n"
        "Replace every assert in the merges with an explicit raise of the same\n"
        "AssertionError, as KVCacheSpec.merge does since #55234. Behaviour\n"
        "without -O is unchanged.\n\n"
        "Fixes #54649"
    ),
    "tests": ["tests/v1/core/test_kv_cache_spec_merge_optimized.py"],
}


def _git(repo, *args, **kwargs):
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                          **kwargs).stdout


def identity():
    name = _git(HERE, "config", "user.name").strip()
    email = _git(HERE, "config", "user.email").strip()
    return name, email


def build(spec, tree: Path, out: Path, edit) -> Path:
    name, email = identity()
    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch)
        _git(repo, "init", "-q")
        _git(repo, "config", "user.name", name)
        _git(repo, "config", "user.email", email)
        for rel in edit:  # the released files
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tree / rel, repo / rel)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "vLLM 0.33.0 as released")
        for rel, change in edit.items():
            change(repo / rel)
        for rel in spec["tests"]:
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(HERE / rel, repo / rel)
        _git(repo, "add", "-A")
        # ";" as the comment character: body lines like "Fixes #54649" are text
        _git(repo, "-c", "core.commentChar=;", "commit", "-q", "--signoff",
             "-m", spec["subject"] + "\n\n" + spec["body"],
             env={"GIT_COMMITTER_DATE": "2026-12-02T12:00:00+0000",
                  "GIT_AUTHOR_DATE": "2026-12-02T12:00:00+0000", "PATH": "/usr/bin:/bin"})
        target = out / f"{spec['name']}.patch"
        text = _git(repo, "format-patch", "-1", "--stdout", "--no-signature", "HEAD")
        target.write_text(text)
    return target


def _mechanical_edit(functions):
    def change(path: Path):
        path.write_text(mechanical(path.read_text(), functions))
        subprocess.run([RUFF, "format", "--line-length", "88", "--quiet", str(path)], check=True)

    return change


def _apply_first(path: Path):
    """0001's hand-written edit, taken from the committed patch's hunks."""
    committed = (HERE / f"{FIRST['name']}.patch").read_text()
    diff = committed[committed.index("diff --git a/vllm/v1/kv_cache_interface.py"):]
    diff = diff[:diff.index("diff --git a/tests/")] if "diff --git a/tests/" in diff else diff
    subprocess.run(["patch", "-p1", "--quiet", "--fuzz=0"], input=diff, text=True, check=True,
                   cwd=path.parents[len(Path("vllm/v1/kv_cache_interface.py").parts) - 1])


def diff_of(patch_text: str) -> str:
    return patch_text[patch_text.index("diff --git"):]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", type=Path, help="directory holding vLLM 0.33.0's vllm/")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) if args.check else HERE
        built = [build(FIRST, args.tree, out, {"vllm/v1/kv_cache_interface.py": _apply_first})]
        for spec in PATCHES:
            edit = {rel: _mechanical_edit(funcs) for rel, funcs in spec["edits"].items()}
            built.append(build(spec, args.tree, out, edit))
        stale = [p.name for p in built
                 if diff_of(p.read_text()) != diff_of((HERE / p.name).read_text())]
    if args.check and stale:
        print(f"stale: {stale}", file=sys.stderr)
        return 1
    print("\n".join(str(HERE / p.name) for p in built))
    return 0


if __name__ == "__main__":
    sys.exit(main())
