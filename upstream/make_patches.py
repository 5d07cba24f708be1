"""Build the upstream patches in a git checkout of vLLM 0.33.0's release tree.

    python upstream/make_patches.py [SDIST_TREE] [--check]

SDIST_TREE is the unpacked 0.33.0 release sdist: vLLM's ``vllm/`` and its
whole ``tests/`` (``scripts/get-sdist 0.33.0`` prints it; without the
argument, this runs it). ``release_repo`` commits the tree whole to a scratch
git repository ("vLLM 0.33.0 as released", honouring the tree's own
``.gitignore``). Each patch is one commit on it: its ``vllm/`` edit and its
test edits, written into vLLM's own test files where 0.33.0 keeps that kind of
test; ``git format-patch`` writes ``upstream/000N-*.patch``. ``--check``
rebuilds into a scratch directory and fails when a committed patch differs.

The edits:

- 0001's ``vllm/`` edit is the hand-written one kept in its patch (its
  ``vllm/`` hunks, applied with ``patch --fuzz=0``).
- 0002 and 0003 are mechanical: in the functions named, ``assert cond, msg``
  becomes ``if <cond negated as a person writes it>: raise <exception>(msg)``
  (same message, the condition evaluated once, ``if a: assert b`` joined into
  one ``if``), 0003 leaving type-narrowing asserts (``isinstance(...)``,
  ``x is not None``, with no message) as they are.
- The test edits are ``upstream/tests/<path>``, each an edit of vLLM's file at
  ``<path>`` (``edit_test_file``: after a top-level def, after a line, or
  replacing a line, each anchor found exactly once).

Every changed file is then run through ``ruff format`` with the tree's own
``pyproject.toml`` (vLLM's settings; 0.33.0's files are ruff-formatted as
released).

No patch carries an identity: the commit is made under a placeholder and the
``From:`` author header is dropped from the file, and there is no
``Signed-off-by:``. The DCO is certified by whoever submits: they apply a patch
as their own commit and sign it off (upstream/README.md says how). The commit
message discloses AI assistance with a ``Co-authored-by:`` trailer in git's
``Name <email>`` form.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RUFF = (str(Path(sys.executable).parent / "ruff") if (Path(sys.executable).parent / "ruff").exists()
        else shutil.which("ruff") or "ruff")  # the tools venv's: its version is locked
PLACEHOLDER = ("unsigned", "unsigned@invalid")  # dropped from the patch file
# vLLM's contributing guide, "AI Assisted Contributions": a Co-authored-by: trailer
TRAILER = "Co-authored-by: Claude <noreply@anthropic.com>"
RELEASE = "vLLM 0.33.0 as released"
GIT_ENV = {"GIT_COMMITTER_DATE": "2026-12-02T12:00:00+0000",
           "GIT_AUTHOR_DATE": "2026-12-02T12:00:00+0000", "PATH": "/usr/bin:/bin",
           "GIT_AUTHOR_NAME": PLACEHOLDER[0], "GIT_AUTHOR_EMAIL": PLACEHOLDER[1],
           "GIT_COMMITTER_NAME": PLACEHOLDER[0], "GIT_COMMITTER_EMAIL": PLACEHOLDER[1],
           "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}

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
               keep_type_narrowing: bool = False) -> str:
    """``source`` with every assert in the named ``Class.method``/``function``
    defs written as an explicit raise of ``exception``. An assert that is the
    whole body of an ``if`` (no ``else``) joins that ``if``'s condition: ``if a:
    assert b`` becomes ``if a and <not b>: raise`` (the same evaluation; what
    ruff's SIM102 asks for)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    targets, found = [], set()

    def visit(body, prefix):
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if prefix + node.name in functions:
                    found.add(prefix + node.name)
                    targets.extend(node for node in ast.walk(node))

    visit(tree.body, "")
    if found != set(functions):
        raise SystemExit(f"not found: {sorted(set(functions) - found)}")
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
        new = f"{indent}if ({condition}):\n{indent}    raise {exception}({message})\n"
        lines[first.lineno - 1:node.end_lineno] = [new]
    return "".join(lines)


# -- the test edits --------------------------------------------------------------

DIRECTIVE = re.compile(r"^# >>> (after def|after line|replace line) (.+)$")


def test_edits(rel: str) -> list:
    """[(kind, anchor, lines)] of upstream/tests/<rel>: after its header (comment
    lines), each ``# >>> KIND ANCHOR`` line starts an edit whose text runs to the
    next one (blank lines at its ends dropped)."""
    edits, current = [], None
    for line in (HERE / rel).read_text().splitlines():
        found = DIRECTIVE.match(line)
        if found:
            current = (found[1], found[2], [])
            edits.append(current)
        elif current is not None:
            current[2].append(line)
        elif line.strip() and not line.startswith("#"):
            raise SystemExit(f"{rel}: text before the first '# >>>' edit: {line!r}")
    for _kind, _anchor, lines in edits:
        while lines and not lines[0].strip():
            lines.pop(0)
        while lines and not lines[-1].strip():
            lines.pop()
    if not edits:
        raise SystemExit(f"{rel}: no edit")
    return edits


def edit_test_file(text: str, rel: str) -> str:
    """vLLM's test file ``text`` with upstream/tests/<rel>'s edits made. An
    anchor must be found exactly once: ``after def NAME`` (a top-level def or
    class; the edit follows its last line, two blank lines between),
    ``after line LINE`` / ``replace line LINE`` (LINE: the whole line, indent
    included)."""
    lines = text.splitlines()
    for kind, anchor, new in test_edits(rel):
        if kind == "after def":
            defs = [node for node in ast.parse("\n".join(lines)).body
                    if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == anchor]
            if len(defs) != 1:
                raise SystemExit(f"{rel}: {len(defs)} top-level defs named {anchor}")
            at = defs[0].end_lineno
            lines[at:at] = ["", "", *new]
            continue
        where = [i for i, line in enumerate(lines) if line == anchor]
        if len(where) != 1:
            raise SystemExit(f"{rel}: the line {anchor!r} is there {len(where)} times")
        at = where[0]
        lines[at:at + 1] = [*([lines[at]] if kind == "after line" else []), *new]
    return "\n".join(lines) + "\n"


# -- the patches -------------------------------------------------------------------

PATCHES = [
    {
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
        "vllm": {"vllm/v1/kv_cache_interface.py": "hand-written",
                 "vllm/v1/core/kv_cache_planning.py": "hand-written"},
        "tests": ["tests/v1/core/test_kv_cache_planning.py"],
    },
    {
        "name": "0002-parallel-state-inner-dp-getter-explicit-check",  # the shim cites this name
        "subject": "[Bugfix][Distributed] Raise AssertionError explicitly in "
                   "parallel group getters",
        "body": (
            "Callers catch the AssertionError that get_world_group,\n"
            "get_inner_dp_world_group, get_tp_group, get_pp_group, get_dcp_group\n"
            "and get_pcp_group raise while their group is not initialized, and\n"
            "fall back: CPU KV offload's _all_workers_barrier to the world group\n"
            "(no inner-DP group unless a DP replica spans nodes), the Mooncake EC\n"
            "connector worker, BlockTable, the attention implementations, the MLA\n"
            "metadata builders and the InstantTensor loader to a single rank. The\n"
            "getters raise it with an assert statement, which python -O strips:\n"
            "they return None and the callers fail with AttributeError, e.g.\n"
            "'NoneType' object has no attribute 'barrier' in _all_workers_barrier.\n\n"
            "Raise the AssertionError explicitly, as KVCacheSpec.merge does since\n"
            "#55234. Behaviour without python -O is unchanged."
        ),
        "vllm": {"vllm/distributed/parallel_state.py": {
            "functions": ["get_world_group", "get_inner_dp_world_group", "get_tp_group",
                          "get_pp_group", "get_dcp_group", "get_pcp_group"],
            "exception": "AssertionError"}},
        "tests": ["tests/v1/kv_offload/test_factory.py"],
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
        "vllm": {"vllm/config/vllm.py": {
            "functions": ["VllmConfig.__post_init__", "VllmConfig._set_cudagraph_sizes",
                          "VllmConfig._set_compile_ranges", "VllmConfig.validate_block_size"],
            "exception": "ValueError", "keep_type_narrowing": True}},
        "tests": ["tests/test_config.py"],
    },
]


def sdist_tree() -> Path:
    """The unpacked 0.33.0 sdist (scripts/get-sdist: fetched by its pinned hash, cached)."""
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "get-sdist"), "0.33.0"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"scripts/get-sdist 0.33.0 failed:\n{proc.stderr}")
    return Path(proc.stdout.strip().splitlines()[-1])


def git(repo, *args, input=None, env=None):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, input=input, env={**GIT_ENV, **(env or {})}).stdout


def release_repo(tree: Path, repo: Path) -> str:
    """A git repository at ``repo`` whose one commit is ``tree`` whole (its own
    ``.gitignore`` honoured; get-sdist's marker left out), checked out there:
    the commit's id."""
    shutil.copytree(tree, repo, ignore=shutil.ignore_patterns(".unpacked", "__pycache__"),
                    symlinks=True)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", RELEASE)
    return git(repo, "rev-parse", "HEAD").strip()


def vllm_part(patch_text: str) -> str:
    """A patch's hunks for files under vllm/ (its diff headers included)."""
    parts = re.split(r"(?m)^(?=diff --git )", patch_text)
    return "".join(p for p in parts if p.startswith("diff --git a/vllm/"))


def edit(spec, repo: Path, hand_written: Path) -> None:
    """Make ``spec``'s edits in ``repo``'s work tree, then ruff-format what changed."""
    mechanical_files = {rel: how for rel, how in spec["vllm"].items() if how != "hand-written"}
    hand = [rel for rel, how in spec["vllm"].items() if how == "hand-written"]
    if hand:
        diff = vllm_part(hand_written.read_text())
        touched = re.findall(r"^diff --git a/(\S+) ", diff, re.M)
        if sorted(touched) != sorted(hand):
            raise SystemExit(f"{hand_written.name}: its vllm/ hunks touch {touched}, not {hand}")
        subprocess.run(["patch", "-p1", "--quiet", "--fuzz=0", "--no-backup-if-mismatch"],
                       input=diff, text=True, check=True, cwd=repo)
    for rel, how in mechanical_files.items():
        path = repo / rel
        path.write_text(mechanical(path.read_text(), how["functions"], how["exception"],
                                   how.get("keep_type_narrowing", False)))
    for rel in spec["tests"]:
        path = repo / rel
        path.write_text(edit_test_file(path.read_text(), rel))
    changed = [*spec["vllm"], *spec["tests"]]
    subprocess.run([RUFF, "format", "--quiet", *changed], check=True, cwd=repo)


def without_author(text: str) -> str:
    """The format-patch text less its ``From:`` author header (and the header's
    folded continuation lines): the file names nobody."""
    head, sep, rest = text.partition("\n\n")
    head = re.sub(r"^From: .*\n(?: .*\n)*", "", head + "\n", flags=re.M).rstrip("\n")
    return head + sep + rest


def build(spec, repo: Path, base: str, out: Path) -> Path:
    """``spec``'s commit on ``base`` in ``repo``; its format-patch in ``out``."""
    git(repo, "checkout", "-q", "--detach", base)
    edit(spec, repo, HERE / f"{spec['name']}.patch")
    git(repo, "add", "-A")
    # ";" as the comment character: body lines like "#55234 ..." are text
    git(repo, "-c", "core.commentChar=;", "commit", "-q",
        "-m", f"{spec['subject']}\n\n{spec['body']}\n\n{TRAILER}")
    text = git(repo, "format-patch", "-1", "--stdout", "--no-signature", "HEAD")
    target = out / f"{spec['name']}.patch"
    target.write_text(without_author(text))
    return target


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tree", type=Path, nargs="?",
                        help="the unpacked vLLM 0.33.0 sdist (default: scripts/get-sdist 0.33.0)")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    tree = args.tree or sdist_tree()
    with tempfile.TemporaryDirectory() as scratch:
        repo, out = Path(scratch) / "vllm", Path(scratch) / "out"
        out.mkdir()
        base = release_repo(tree, repo)
        built = [build(spec, repo, base, out if args.check else HERE) for spec in PATCHES]
        stale = [p.name for p in built if p.read_text() != (HERE / p.name).read_text()]
    if args.check and stale:
        print(f"stale: {stale}", file=sys.stderr)
        return 1
    print("\n".join(str(HERE / p.name) for p in built))
    return 0


if __name__ == "__main__":
    os.umask(0o022)
    sys.exit(main())
