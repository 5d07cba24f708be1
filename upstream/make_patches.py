"""Rebuild the upstream patches from the released vLLM 0.33.0 files.

    python upstream/make_patches.py VLLM_0_33_TREE [--check]

VLLM_0_33_TREE holds the ``vllm/`` package of the 0.33.0 wheel (e.g. a vLLM
venv's site-packages). For each patch, a scratch git repository gets the
original files, the edit below and the regression test from
``upstream/tests/``; ``git format-patch`` writes ``upstream/000N-*.patch``.

No patch carries an identity: the commit is made under a placeholder and the
``From:`` author header is dropped from the file, and there is no
``Signed-off-by:``. The DCO is certified by whoever submits: they apply a patch
as their own commit and sign it off (upstream/README.md says how). The commit
message carries the ``Co-authored-by:`` trailer vLLM's contributing guide asks
for when an AI tool helped.

0001's edit is the hand-written one kept in its patch (its ``vllm/`` hunks).
0002 and 0003 are mechanical: in the functions named, ``assert cond, msg``
becomes ``if <cond negated as a person writes it>: raise <exception>(msg)``
(same message, the condition evaluated once, ``if a: assert b`` joined into
one ``if``), 0003 leaving type-narrowing asserts (``isinstance(...)``,
``x is not None``, with no message) as they are; then ``ruff format --line-length 88`` (vLLM's
setting; these files are ruff-formatted as released). ``--check`` rebuilds into
a scratch directory and fails when a committed patch differs.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUFF = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
PLACEHOLDER = ("unsigned", "unsigned@invalid")  # dropped from the patch file
TRAILER = "Co-authored-by: Claude"  # vLLM's contributing guide, "AI Assisted Contributions"

INVERSE = {ast.Is: "is not", ast.IsNot: "is", ast.In: "not in", ast.NotIn: "in",
           ast.Eq: "!=", ast.NotEq: "==", ast.Lt: ">=", ast.LtE: ">", ast.Gt: "<=",
           ast.GtE: "<"}


def negate(source, test) -> tuple[str, type | None]:
    """Source text of ``not test`` written the way a person would, and the
    boolean operator at its top (``ast.And``/``ast.Or``, None: an atom)."""
    def seg(node):
        return ast.get_source_segment(source, node)

    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = test.operand
        return seg(inner), type(inner.op) if isinstance(inner, ast.BoolOp) else None
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = seg(test.left), type(test.ops[0]), seg(test.comparators[0])
        is_len = isinstance(test.left, ast.Call) and getattr(test.left.func, "id", "") == "len"
        if is_len and op is ast.Gt and right == "0":
            return f"{left} == 0", None
        return f"{left} {INVERSE[op]} {right}", None
    if isinstance(test, ast.BoolOp):  # De Morgan, evaluated in the same order
        top = ast.Or if isinstance(test.op, ast.And) else ast.And
        parts = [joinable(*negate(source, value), top) for value in test.values]
        return (" or " if top is ast.Or else " and ").join(parts), top
    if isinstance(test, (ast.Call, ast.Name, ast.Attribute, ast.Subscript)):
        return f"not {seg(test)}", None
    return f"not ({seg(test)})", None


def joinable(text, top, joiner) -> str:
    """``text`` to join with ``joiner``: parenthesized only where needed."""
    return f"({text})" if top is not None and top is not joiner else text


def is_type_narrowing(node: ast.Assert) -> bool:
    """``assert isinstance(...)`` or ``assert x is not None``, with no message."""
    test = node.test
    if node.msg is not None:
        return False
    if isinstance(test, ast.Call) and getattr(test.func, "id", None) == "isinstance":
        return True
    return (isinstance(test, ast.Compare) and [type(op) for op in test.ops] == [ast.IsNot]
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value is None)


def mechanical(source: str, functions: list[str], exception: str = "AssertionError",
               keep_type_narrowing: bool = False, comment: str = "") -> str:
    """``source`` with every assert in the named ``Class.method``/``function``
    defs written as an explicit raise of ``exception`` (``comment``, if given,
    as a line above each). An assert that is the
    whole body of an ``if`` (no ``else``) joins that ``if``'s condition: ``if a:
    assert b`` becomes ``if a and <not b>: raise`` (the same evaluation; what
    ruff's SIM102 asks for)."""
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
    asserts = [n for n in targets if isinstance(n, ast.Assert)
               and not (keep_type_narrowing and is_type_narrowing(n))]
    if not asserts:
        raise SystemExit(f"no assert to rewrite in {functions}")
    for node in sorted(asserts, key=lambda n: n.lineno, reverse=True):
        condition, top = negate(source, node.test)
        first = node
        parent = parents.get(id(node))
        if isinstance(parent, ast.If) and parent.body == [node] and not parent.orelse:
            outer = ast.get_source_segment(source, parent.test)
            outer_top = type(parent.test.op) if isinstance(parent.test, ast.BoolOp) else None
            condition = (f"{joinable(outer, outer_top, ast.And)}\n"
                         f"and {joinable(condition, top, ast.And)}")
            first = parent
        indent = lines[first.lineno - 1][: first.col_offset]
        message = ast.get_source_segment(source, node.msg) if node.msg is not None else ""
        new = f"{indent}# {comment}\n" if comment else ""
        new += f"{indent}if ({condition}):\n{indent}    raise {exception}({message})\n"
        lines[first.lineno - 1:node.end_lineno] = [new]
    return "".join(lines)


PATCHES = [
    {
        "name": "0002-parallel-state-inner-dp-getter-explicit-check",
        "subject": "[Bugfix][Distributed] Raise AssertionError explicitly in "
                   "get_inner_dp_world_group",
        "body": (
            "CPU KV offload's _all_workers_barrier (vllm/v1/kv_offload/cpu/spec.py)\n"
            "falls back to the world group when get_inner_dp_world_group() raises\n"
            "AssertionError, i.e. when no DP replica spans nodes. The getter guards\n"
            "with an assert statement, which python -O strips: it then returns None\n"
            "and creating the offloading worker fails with AttributeError:\n"
            "'NoneType' object has no attribute 'barrier'.\n\n"
            "Raise the AssertionError explicitly, as KVCacheSpec.merge does since\n"
            "#55234. Behaviour without python -O is unchanged."
        ),
        "edits": {"vllm/distributed/parallel_state.py": ["get_inner_dp_world_group"]},
        "exception": "AssertionError",
        "tests": ["tests/distributed/test_parallel_state.py"],
    },
    {
        "name": "0003-vllm-config-explicit-checks",
        "subject": "[Bugfix][Config] Raise ValueError instead of assert in VllmConfig checks",
        "body": (
            "VllmConfig validates the engine configuration with assert statements\n"
            "in __post_init__, _set_cudagraph_sizes, _set_compile_ranges and\n"
            "validate_block_size. python -O strips them, so configurations that\n"
            "python refuses start under python -O, e.g. a decode context parallel\n"
            "interleave size that does not divide the block size, or NIXL P/D with\n"
            "decode_context_parallel_size neither 1 nor the transfer size.\n\n"
            "Raise ValueError with the same message, as the other checks of\n"
            "vllm/config/vllm.py do. Nothing catches the AssertionError these\n"
            "raised; those in __post_init__ still reach the caller as pydantic's\n"
            "ValidationError. The type-narrowing asserts (isinstance, is not None)\n"
            "stay.\n\n"
            "Release note: python -O deployments whose configuration python refuses\n"
            "no longer start; python refuses them with ValueError (was\n"
            "AssertionError)."
        ),
        "edits": {"vllm/config/vllm.py": ["VllmConfig.__post_init__",
                                          "VllmConfig._set_cudagraph_sizes",
                                          "VllmConfig._set_compile_ranges",
                                          "VllmConfig.validate_block_size"]},
        "exception": "ValueError",
        "keep_type_narrowing": True,
        "tests": ["tests/config/test_vllm_config.py"],
    },
]

FIRST = {
    "name": "0001-kv-cache-spec-merge-explicit-checks",
    "subject": "[Bugfix][Core] Raise AssertionError explicitly in KV cache spec merges",
    "body": (
        "Follow-up to #55234 for #54649. The merges of FullAttentionSpec,\n"
        "MLAAttentionSpec, RSWASpec, SlidingWindowMLASpec and\n"
        "SinkFullAttentionSpec still guard their inputs with assert statements,\n"
        "which python -O strips. The planner reads the AssertionError of a merge\n"
        "as \"these layers cannot share a KV cache group\"\n"
        "(is_kv_cache_spec_uniform, _get_kv_cache_groups_uniform_page_size), so\n"
        "under python -O it merges MLA specs with different cache_dtype_str (the\n"
        "value kept comes from set.pop() and changes with PYTHONHASHSEED), and\n"
        "fails with AttributeError: 'MambaSpec' object has no attribute\n"
        "'cache_dtype_str' when MLA layers come before a Mamba layer.\n\n"
        "Raise the same AssertionError explicitly, as KVCacheSpec.merge does\n"
        "since #55234, in the merges and in the two checks that guard a pick\n"
        "from a set (UniformTypeKVCacheSpecs.max_num_blocks_per_req,\n"
        "get_uniform_page_size). Behaviour without python -O is unchanged."
    ),
    "files": ["vllm/v1/kv_cache_interface.py", "vllm/v1/core/kv_cache_planning.py"],
    "tests": ["tests/v1/core/test_kv_cache_utils.py"],
}


# The regression tests go into the files where vLLM keeps their kind of test.
# Those files are not in the wheel, and this project keeps no copy of them: it
# records only the lines its hunks touch or show as context, read from
# vllm-project/vllm at the commit named (the newest the index read here held),
# and where they are. ``lines``: the file's length there; None where it was not
# known here (a 4,000-line file): that hunk is anchored at the file's end by its
# context alone, and ``git am`` reports an offset. ``imports``: (the line the
# added imports follow, 0 for the top; the lines before and after it).
# upstream/tests/<path> holds what is added, in sections (see its header).
TEST_BASES = {
    "tests/v1/core/test_kv_cache_utils.py": {
        "commit": "002f10e0cfa1373a19a0d2756598a34b700d20e5", "lines": None, "imports": None,
        "tail": ["    )", "", "    assert not any(g.is_eagle_group for g in groups)"],
    },
    "tests/distributed/test_parallel_state.py": {
        "commit": "22de8ae2b9122021dbe88723653a87c4fd566fc9", "lines": 49,
        "imports": (0, [], ["from typing import Any, Dict", "", "import torch"]),
        "tail": ["        },", '        "key8": "value5"', "    }"],
    },
    "tests/config/test_vllm_config.py": {
        "commit": "f8e48ffde070c138e80dc92497fb8cb26823711b", "lines": 19,
        "imports": (5, ["", "from pathlib import Path", ""],
                    ["from vllm.config.vllm import _normalize_debug_dump_path", "", ""]),
        "tail": ['    path = _normalize_debug_dump_path("vllm-debug")', "",
                 '    assert path == Path("vllm-debug").absolute()'],
    },
}
SECTIONS = ("# >>> the file's own imports", "# >>> added to the imports", "# >>> appended at the end")
FILLER = "# (a line of vLLM's file that this project does not hold)"


def sections(rel: str) -> tuple:
    """(the file's own imports, added imports, appended lines) of
    upstream/tests/<rel>, each a list of lines without blank lines at its ends."""
    lines = (HERE / rel).read_text().splitlines()
    marks = [lines.index(mark) for mark in SECTIONS]
    parts = [lines[a + 1:b] for a, b in zip(marks, [*marks[1:], len(lines)])]

    def trim(part):
        while part and not part[0].strip():
            part = part[1:]
        while part and not part[-1].strip():
            part = part[:-1]
        return part
    return tuple(trim(part) for part in parts)


def stand_in(rel: str) -> str:
    """vLLM's test file as far as this project knows it: the recorded lines at
    their places, ``FILLER`` elsewhere (never within a hunk's context)."""
    base = TEST_BASES[rel]
    tail = base["tail"]
    n = base["lines"] or len(tail) + 1  # unknown length: one filler line, then the tail
    text = [FILLER] * n
    text[n - len(tail):] = tail
    if base["imports"]:
        at, before, after = base["imports"]
        text[at - len(before):at + len(after)] = [*before, *after]
    return "\n".join(text) + "\n"


def with_tests(rel: str, text: str) -> str:
    """``text`` (vLLM's file) with the imports added and the tests appended."""
    _own, added, appended = sections(rel)
    lines = text.splitlines()
    base = TEST_BASES[rel]
    if added:
        if not base["imports"]:
            raise SystemExit(f"{rel}: imports added, but where is not recorded")
        at = base["imports"][0]
        lines[at:at] = added
    return "\n".join([*lines, "", "", *appended]) + "\n"


def runnable(rel: str) -> str:
    """The added tests as a file of their own: what the overlay puts at ``rel``
    (the rest of vLLM's file is not here)."""
    return (HERE / rel).read_text()


def without_stand_in_index(text: str, tests) -> str:
    """No ``index`` line for the test files changed: its hashes would be the
    stand-in's, not vLLM's (``git am`` needs none without --3way)."""
    for rel in tests:
        text = re.sub(rf"(^diff --git a/{re.escape(rel)} b/{re.escape(rel)}\n)index [0-9a-f.]+ \d+\n",
                      r"\1", text, flags=re.M)
    return text


def _git(repo, *args, **kwargs):
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                          **kwargs).stdout


def without_author(text: str) -> str:
    """The format-patch text less its ``From:`` author header (and the header's
    folded continuation lines): the file names nobody."""
    head, sep, rest = text.partition("\n\n")
    head = re.sub(r"^From: .*\n(?: .*\n)*", "", head + "\n", flags=re.M).rstrip("\n")
    return head + sep + rest


def build(spec, tree: Path, out: Path, edit) -> Path:
    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch)
        env = {"GIT_COMMITTER_DATE": "2026-12-02T12:00:00+0000",
               "GIT_AUTHOR_DATE": "2026-12-02T12:00:00+0000", "PATH": "/usr/bin:/bin",
               "GIT_AUTHOR_NAME": PLACEHOLDER[0], "GIT_AUTHOR_EMAIL": PLACEHOLDER[1],
               "GIT_COMMITTER_NAME": PLACEHOLDER[0], "GIT_COMMITTER_EMAIL": PLACEHOLDER[1],
               "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
        _git(repo, "init", "-q", env=env)
        for rel in edit:  # the released files
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tree / rel, repo / rel)
        for rel in spec["tests"]:  # vLLM's test file (its stand-in)
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            (repo / rel).write_text(stand_in(rel))
        _git(repo, "add", "-A", env=env)
        _git(repo, "commit", "-q", "-m", "vLLM 0.33.0 as released", env=env)
        for rel, change in edit.items():
            change(repo / rel)
        for rel in spec["tests"]:
            (repo / rel).write_text(with_tests(rel, stand_in(rel)))
        _git(repo, "add", "-A", env=env)
        # ";" as the comment character: body lines like "#55234 ..." are text
        _git(repo, "-c", "core.commentChar=;", "commit", "-q",
             "-m", f"{spec['subject']}\n\n{spec['body']}\n\n{TRAILER}", env=env)
        target = out / f"{spec['name']}.patch"
        text = _git(repo, "format-patch", "-1", "--stdout", "--no-signature", "HEAD", env=env)
        target.write_text(without_stand_in_index(without_author(text), spec["tests"]))
    return target


def _mechanical_edit(functions, exception, keep_type_narrowing, comment):
    def change(path: Path):
        path.write_text(mechanical(path.read_text(), functions, exception, keep_type_narrowing,
                                   comment))
        subprocess.run([RUFF, "format", "--line-length", "88", "--quiet", str(path)], check=True)

    return change


def _hand_written(repo_root_of):
    """0001's hand-written edit: the committed patch's hunks for ``vllm/`` files."""
    def change(path: Path):
        committed = (HERE / f"{FIRST['name']}.patch").read_text()
        rel = path.relative_to(repo_root_of(path)).as_posix()
        start = committed.index(f"diff --git a/{rel} ")
        end = committed.find("\ndiff --git ", start + 1)
        diff = committed[start:] if end < 0 else committed[start:end + 1]
        subprocess.run(["patch", "-p1", "--quiet", "--fuzz=0"], input=diff, text=True,
                       check=True, cwd=repo_root_of(path))

    return change


def _root_of(rel: str):
    return lambda path: path.parents[len(Path(rel).parts) - 1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", type=Path, help="directory holding vLLM 0.33.0's vllm/")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) if args.check else HERE
        built = [build(FIRST, args.tree, out,
                       {rel: _hand_written(_root_of(rel)) for rel in FIRST["files"]})]
        for spec in PATCHES:
            edit = {rel: _mechanical_edit(funcs, spec["exception"],
                                          spec.get("keep_type_narrowing", False),
                                          spec.get("comment", ""))
                    for rel, funcs in spec["edits"].items()}
            built.append(build(spec, args.tree, out, edit))
        stale = [p.name for p in built if p.read_text() != (HERE / p.name).read_text()]
    if args.check and stale:
        print(f"stale: {stale}", file=sys.stderr)
        return 1
    print("\n".join(str(HERE / p.name) for p in built))
    return 0


if __name__ == "__main__":
    sys.exit(main())
