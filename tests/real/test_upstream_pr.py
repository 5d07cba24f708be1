"""upstream/ is ready to send, built and tested in vLLM 0.33.0's own tree.

The release tree is vLLM 0.33.0's sdist (``scripts/get-sdist 0.33.0``: its
``vllm/`` and whole ``tests/``), committed whole to a scratch git repository
(upstream/make_patches.py's ``release_repo``).

- Each patch applies whole to that tree (``git apply --check``), and it is what
  upstream/make_patches.py builds there (nothing edited by hand since). The
  patches change disjoint files, so the tree with all three applied is, file by
  file, the tree with each one.
- Its ``tests/`` part edits vLLM's own test files (no new file), in the file
  where 0.33.0 already keeps that kind of test (``HOME``); the tests it adds or
  changes are exactly those its PR's Test Plan names; they are small beside the
  change; the patched files pass vLLM's ruff (its ``pyproject.toml``); and no
  test of the tree still pins the exception a patch replaces.
- Those tests run in place, in vLLM's real test files, against the 0.33.0 wheel
  (the ``suite-0.33.0-py3.11`` venv: the 0.33.0 venv plus tblib, which vLLM's
  ``tests/conftest.py`` imports): one pytest run over the three files whole,
  selecting the patches' tests, per tree state: the release's ``vllm/``
  (every selected test fails) and the patched one (upstream/overlay.py: every
  selected test passes). Each file's whole collection succeeds in both. 0003's
  tests run vLLM's checks in the test process, so its file runs again in both
  states under ``python -O -m pytest`` (pytest rewrites the tests' asserts: they
  still check). The counts and the reasons each Test Result gives are those
  runs'.
- Each patch is a ``git format-patch`` with a ``[Bugfix][Scope]`` subject that
  names nobody (no ``From:`` author header, no ``Signed-off-by:``: the
  submitter certifies the DCO) and discloses AI assistance with a
  ``Co-authored-by:`` trailer in git's ``Name <email>`` form; upstream/README.md's
  command makes it the submitter's signed-off commit on the release tree.
- Each PR text is vLLM's template whole (no H1 copy of the title), in the
  first person: what only the submitter can do or know is a visible
  ``**[SUBMITTER: ...]**`` placeholder (an HTML comment renders as nothing once
  posted), and no other sentence speaks of the submitter. It writes
  ``python -O`` (a bare ``-O`` is vLLM's compilation level), cites only paths
  of the patched tree and nothing of this project, and every sentence that
  says "measured" is registered with the tests here that measure it.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness import REPORT_LINES, vllm_location
from helpers import REPO, hermetic_env

pytestmark = pytest.mark.releases("0.33.0")
UPSTREAM = REPO / "upstream"
PATCHES = sorted(UPSTREAM.glob("000*.patch"))
PR_TEXT = {"0001": UPSTREAM / "PR.md", "0002": UPSTREAM / "PR-0002.md",
           "0003": UPSTREAM / "PR-0003.md"}
TAGS = {"0001": "[Bugfix][Core] ", "0002": "[Bugfix][Distributed] ", "0003": "[Bugfix][Config] "}
# Where 0.33.0 keeps each kind of test: a line the released file already holds
# that shows it (#55234's python -O child; the CPU offload spec's tests; the
# VllmConfig checks' tests, validate_block_size's among them)
HOME = {
    "tests/v1/core/test_kv_cache_planning.py": '        [sys.executable, "-O", "-c", script],',
    "tests/v1/kv_offload/test_factory.py":
        "from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec",
    "tests/test_config.py": "        VllmConfig.validate_block_size(config)",
}
TRAILER = re.compile(r"^Co-authored-by: [^<>\n]+ <[^<>@\s]+@[^<>\s]+>$", re.M)
TEMPLATE = ("## Purpose", "## Test Plan", "## Test Result")
# vLLM's .github/PULL_REQUEST_TEMPLATE.md after the three headings: kept whole
CHECKLIST = (
    "---", "<details>",
    "<summary> Essential Elements of an Effective PR Description Checklist </summary>", "",
    "- [{}] The purpose of the PR, such as \"Fix some issue (link existing issues this PR will "
    "resolve)\".",
    "- [{}] The test plan, such as providing test command.",
    "- [{}] The test results, such as pasting the results comparison before and after, or e2e "
    "results",
    "- [{}] (Optional) The necessary documentation update, such as updating "
    "`supported_models.md` and `examples` for a new model.",
    "- [{}] (Optional) Release notes update. If your change is user facing, please update the "
    "release notes draft in the [Google Doc](https://docs.google.com/document/d/"
    "1YyVqrgX4gHTtrstbq8oWUImOyPCKSGnJ7xtTpmXzlRs/edit?tab=t.0).",
    "</details>", "",
    "**BEFORE SUBMITTING, PLEASE READ <https://docs.vllm.ai/en/latest/contributing>** (anything "
    "written below this line will be removed by GitHub Actions)",
)
# a placeholder the submitter fills, visible once posted
BLANK = re.compile(r"\*\*\[SUBMITTER: (.*?)\]\*\*", re.S)
# Each sentence of a PR text that says "measured" (by a phrase of it) and the
# tests of this project that make the measurement. Not measured here, so not
# said to be: 0002's get_forward_context (read from the code). 0003's Test Result
# gives its python -O -m pytest runs as runs, not as a measurement.
MEASURED = {
    "0001": {
        "I measured on CPU with the v0.33.0 release under `python -O`: `is_kv_cache_spec_uniform`": [
            "tests/real/test_upstream_pr.py::test_new_tests_fail_without_the_fix_and_pass_with_it",
            "tests/real/test_upstream_pr.py::test_first_pr_reproducer_prints_its_table",
            "tests/real/test_kv_spec_merge.py::test_without_the_shim_O_reproduces_the_bug"],
        "I measured the kept `cache_dtype_str` changing": [
            "tests/real/test_kv_spec_merge.py::"
            "test_without_the_shim_O_keeps_a_cache_dtype_chosen_by_the_hash_seed"],
        "I also measured it end to end": [
            "tests/e2e/test_served.py::test_full_first_without_shim_dies_at_engine_start_under_O"],
    },
    "0002": {
        "I measured on CPU with the v0.33.0 release under `python -O`": [
            "tests/real/test_upstream_pr.py::test_new_tests_fail_without_the_fix_and_pass_with_it",
            "tests/real/test_o_parity.py::test_cpu_offload_barrier_needs_the_getter_to_raise"],
    },
    "0003": {
        "I measured on CPU with the v0.33.0 release under `python -O` that `validate_block_size`": [
            "tests/real/test_o_parity.py::"
            "test_dcp_interleave_check_refuses_under_O_only_with_the_patch",
            "tests/real/test_o_parity.py::test_nixl_dcp_check_refuses_under_O_only_with_the_patch"],
    },
}

# A path in vLLM's tree, not part of a longer one (".../vllm/x.py" in an excerpt is not a citation)
CITED = re.compile(r"(?<![\w/.~-])((?:vllm|tests)/[\w./-]*\w)")
FOREIGN = ("kimi_hotfix", "kimi-hotfix", "~/.cache", "upstream/", "tests/real", "tests/unit")
BARE_O = re.compile(r"(?<!python )(?<![\w-])-O(?![\w.])")  # "-O" not written as "python -O"
GIT_ENV = {"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}
COST = {"processes": 0, "cpu": 0.0, "wall": 0.0}  # what this module's vLLM processes cost


def number(patch: Path) -> str:
    return patch.name[:4]


def make_patches_module():
    spec = importlib.util.spec_from_file_location("kimi_make_patches", UPSTREAM / "make_patches.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def overlay_module():
    spec = importlib.util.spec_from_file_location("kimi_overlay_pr", UPSTREAM / "overlay.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def git(repo, *args, check=True):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          env=GIT_ENV, check=check)


def suite_python() -> str:
    """The python of the suite-0.33.0-py3.11 venv (vLLM 0.33.0's wheel, what
    vLLM's own tests/conftest.py imports), built from its lock if needed."""
    proc = subprocess.run([str(REPO / "scripts" / "build-venv"), "suite-0.33.0-py3.11"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"could not build the suite venv:\n{proc.stderr[-4000:]}"
    return str(Path(proc.stdout.strip().splitlines()[-1]) / "bin" / "python")


def measured_run(cmd, timeout=900, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` of a process that imports vLLM, its CPU (its own and
    its waited-for children's, from wait4: not the other threads' children)
    added to COST."""
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, **kwargs)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _pid, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        COST["processes"] += 1
        COST["cpu"] += usage.ru_utime + usage.ru_stime
        COST["wall"] += time.monotonic() - start
        out.seek(0), err.seek(0)
        return subprocess.CompletedProcess(cmd, proc.returncode, out.read(), err.read())


@pytest.fixture(scope="module", autouse=True)
def cost_line():
    yield
    if release_tree.cache_info().currsize:  # the scratch trees: about 100 MB
        shutil.rmtree(release_tree()["root"], ignore_errors=True)
    if COST["processes"]:
        REPORT_LINES.append(
            f"test_upstream_pr: {COST['processes']} processes on vLLM 0.33.0 (vLLM's pytest per "
            f"tree state, each with the python -O children of 0001's and 0002's tests; PR.md's "
            f"reproducer), {COST['cpu']:.0f} CPU-s with their children, {COST['wall']:.0f} s wall")


# -- the release tree and the two tree states ------------------------------------


@functools.cache
def release_tree() -> dict:
    """The sdist, its scratch git repository (``release_repo``) and base commit,
    and a checkout of every patch applied there (``patched``)."""
    import tempfile

    make = make_patches_module()
    sdist = make.sdist_tree()
    root = Path(tempfile.mkdtemp(prefix="kimi-upstream-pr-"))
    repo = root / "release"
    base = make.release_repo(sdist, repo)
    applied = root / "patched"
    git(repo, "worktree", "add", "-q", "--detach", str(applied), base)
    for patch in PATCHES:
        git(applied, "apply", str(patch))
    return {"sdist": sdist, "repo": repo, "base": base, "patched": applied, "root": root}


def touched(patch: Path) -> list:
    return re.findall(r"^diff --git a/(\S+) b/", patch.read_text(), re.M)


def changed_test_files(patch: Path) -> list:
    return [rel for rel in touched(patch) if rel.startswith("tests/")]


@functools.cache
def run_tree(state: str) -> Path:
    """vLLM's repository layout for one tree state: ``tests/`` (the sdist's,
    with every patch's test edits; hard links of the patched checkout's
    files) and ``pyproject.toml`` (its pytest settings), beside ``vllm``: the
    wheel's package as released (a symlink) or with every patch's ``vllm/``
    part (upstream/overlay.py)."""
    rel_root = release_tree()
    dest = rel_root["root"] / state
    site = vllm_location(suite_python())
    if state == "released":
        dest.mkdir()
        os.symlink(site / "vllm", dest / "vllm")
    else:
        combined = rel_root["root"] / "all.patch"
        combined.write_text("".join(p.read_text() for p in PATCHES))
        overlay_module().make_overlay(site, combined, dest)
    shutil.copytree(rel_root["patched"] / "tests", dest / "tests", copy_function=os.link)
    shutil.copy2(rel_root["patched"] / "pyproject.toml", dest / "pyproject.toml")
    return dest


def top_level_defs(text: str) -> dict:
    """{name: source, decorators included} of a module's top-level defs."""
    lines = text.splitlines()
    out = {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            out[node.name] = "\n".join(lines[first - 1:node.end_lineno])
    return out


@functools.cache
def new_tests(patch_name: str) -> frozenset:
    """(file, test function) the patch adds to or changes in vLLM's files."""
    rel_root, found = release_tree(), set()
    for rel in changed_test_files(UPSTREAM / patch_name):
        before = top_level_defs((rel_root["sdist"] / rel).read_text())
        after = top_level_defs((rel_root["patched"] / rel).read_text())
        found |= {(rel, name) for name, text in after.items()
                  if name.startswith("test") and before.get(name) != text}
    return frozenset(found)


OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (tests/\S+?)::(\S+)", re.M)


# The patches whose tests run vLLM's code in the test process (0001's and 0002's
# start a python -O child of their own): their files also run under python -O -m
# pytest (pytest rewrites the tests' asserts, so they still check).
IN_PROCESS = ("0003",)


@functools.cache
def pytest_run(state: str, optimize: bool = False) -> dict:
    """vLLM's pytest (``python -O -m pytest`` if ``optimize``: IN_PROCESS's
    files only), in ``run_tree(state)``, over the patches' test files whole,
    selecting (-k) the tests they add or change: {"outcomes": {(file, node id
    after the file): outcome}, "stdout", "rc", "collected", "deselected"}."""
    tree = run_tree(state)
    patches = [p for p in PATCHES if not optimize or number(p) in IN_PROCESS]
    files = [rel for patch in patches for rel in changed_test_files(patch)]
    names = sorted({name for patch in patches for _f, name in new_tests(patch.name)})
    env = hermetic_env(shim=False, COLUMNS="400")
    env.pop("VLLM_LOGGING_LEVEL")  # vLLM's default (INFO, to stdout), as in its CI
    flags = ["-O"] if optimize else []
    proc = measured_run([suite_python(), *flags, "-m", "pytest", *files, "-k", " or ".join(names),
                         "-rA", "-vv", "--tb=short", "-p", "no:cacheprovider"], cwd=str(tree),
                        env=env, timeout=900)
    # "collecting ... collected N items / D deselected / S selected" (one line when not a tty)
    collected = re.search(r"collected (\d+) items / (\d+) deselected / (\d+) selected", proc.stdout)
    assert collected, proc.stdout[-4000:] + proc.stderr[-2000:]
    outcomes = {(path, node): outcome for outcome, path, node in OUTCOME.findall(proc.stdout)}
    return {"outcomes": outcomes, "stdout": proc.stdout, "stderr": proc.stderr, "rc": proc.returncode,
            "collected": int(collected[1]), "deselected": int(collected[2])}


# -- the patches and the tree ----------------------------------------------------


def test_there_is_one_pr_text_per_patch():
    assert [number(p) for p in PATCHES] == sorted(PR_TEXT)
    assert all(path.is_file() for path in PR_TEXT.values())


def test_each_patch_applies_whole_to_the_release_tree(release):
    rel_root = release_tree()
    for patch in PATCHES:
        proc = git(rel_root["repo"], "apply", "--check", "--verbose", str(patch), check=False)
        assert proc.returncode == 0, (patch.name, proc.stderr)
        assert all(f"Checking patch {rel}..." in proc.stderr for rel in touched(patch)), proc.stderr
    files = [rel for patch in PATCHES for rel in touched(patch)]
    assert len(files) == len(set(files)), "two patches change one file"
    assert git(rel_root["repo"], "status", "--porcelain").stdout == ""  # --check wrote nothing


def test_patches_are_what_make_patches_builds(release):
    proc = subprocess.run([sys.executable, str(UPSTREAM / "make_patches.py"),
                           str(release_tree()["sdist"]), "--check"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("patch", PATCHES, ids=number)
def test_tests_go_where_the_release_keeps_their_kind(patch, release):
    rel_root = release_tree()
    text = patch.read_text()
    for rel in changed_test_files(patch):
        assert f"--- a/{rel}\n" in text, f"{rel}: a new file, not vLLM's own"
        assert HOME[rel] in (rel_root["sdist"] / rel).read_text().splitlines(), rel
    # the Test Plan names exactly the tests the patch adds or changes
    assert plan_tests(patch) == new_tests(patch.name), plan_tests(patch)


def test_patched_files_pass_vllms_ruff(release):
    """vLLM's pre-commit lints and formats with ruff; its settings are in the
    tree's pyproject.toml (the tools venv's ruff here, not vLLM's pin)."""
    ruff = str(Path(sys.executable).parent / "ruff")
    files = [rel for patch in PATCHES for rel in touched(patch)]
    tree = release_tree()["patched"]
    for args in (["check"], ["format", "--check"]):
        proc = subprocess.run([ruff, *args, *files], cwd=tree, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def raised_messages(text: str, exception: str) -> list:
    """The constant text of each ``raise exception(...)``'s message in ``text``
    (the parts of an f-string between its fields)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                and getattr(node.exc.func, "id", None) == exception and node.exc.args):
            parts = [n.value for n in ast.walk(node.exc.args[0])
                     if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            found.append("".join(parts))
    return found


def pinned_assertions(tests_root: Path, messages: list) -> list:
    """``file:line`` of each ``pytest.raises(AssertionError, match=PATTERN)``
    under ``tests_root`` whose PATTERN finds one of ``messages``."""
    hits = []
    for path in sorted(tests_root.rglob("*.py")):
        text = path.read_text(errors="replace")
        if "raises(AssertionError" not in text:
            continue
        for found in re.finditer(r"raises\(\s*AssertionError\s*,\s*match=(r?)([\"'])(.*?)\2", text):
            if any(re.search(found[3], message) for message in messages):
                line = text[:found.start()].count("\n") + 1
                hits.append(f"{path.relative_to(tests_root.parent)}:{line}")
    return hits


def test_no_test_pins_the_exception_a_patch_replaces(release):
    """0003 turns VllmConfig's asserts into ValueError: a test of the tree that
    still expects AssertionError with one of their messages would fail with it.
    On the released tests this finds the one 0003 changes (the check can fail)."""
    rel_root = release_tree()
    config = (rel_root["patched"] / "vllm" / "config" / "vllm.py").read_text()
    released = (rel_root["sdist"] / "vllm" / "config" / "vllm.py").read_text()
    messages = [m for m in raised_messages(config, "ValueError")
                if m not in raised_messages(released, "ValueError")]
    assert len(messages) >= 8, messages  # what 0003 converts
    assert pinned_assertions(rel_root["sdist"] / "tests", messages) == ["tests/test_config.py:475"]
    assert pinned_assertions(rel_root["patched"] / "tests", messages) == []


def message(patch: Path) -> str:
    """The commit message: the headers and body before the diffstat."""
    text = patch.read_text()
    return text[:text.index("\n---\n")]


def subject(patch: Path) -> str:
    found = re.search(r"^Subject: \[PATCH\] (.*?)\n(?! )", patch.read_text(), re.M | re.S)
    assert found, patch.name
    return " ".join(found.group(1).split())


@pytest.mark.parametrize("patch", PATCHES, ids=number)
def test_patch_names_nobody_and_discloses_ai_assistance(patch, release):
    head = message(patch)
    assert subject(patch).startswith(TAGS[number(patch)])
    # no identity: the submitter authors the commit and signs it off (upstream/README.md)
    assert not re.search(r"^(From|Signed-off-by): ", head, re.M), head
    trailers = [line for line in head.splitlines() if line.startswith("Co-authored-by:")]
    assert trailers == [head.splitlines()[-1]] and TRAILER.fullmatch(trailers[0]), trailers
    assert not BARE_O.findall(head), "write python -O: a bare -O is vLLM's compilation level"


def test_the_readme_command_makes_each_patch_the_submitters_signed_off_commit(release, tmp_path):
    """upstream/README.md's command, in a clone of the release tree."""
    readme = (UPSTREAM / "README.md").read_text()
    command = re.search(r"```bash\n\s*(sed .*?)\n\s*```", readme, re.S).group(1)
    command = command.replace("0001-kv-cache-spec-merge-explicit-checks.patch", '"$PATCH"')
    clone = tmp_path / "vllm"
    subprocess.run(["git", "clone", "-q", "--shared", str(release_tree()["repo"]), str(clone)],
                   env=GIT_ENV, check=True, capture_output=True)
    env = {**GIT_ENV, "HOME": str(tmp_path), "GIT_AUTHOR_DATE": "2026-12-03T12:00:00+0000"}
    env.pop("GIT_CONFIG_GLOBAL")
    for key, value in (("user.name", "A Submitter"), ("user.email", "submitter@example.org")):
        subprocess.run(["git", "-C", str(clone), "config", key, value], env=env, check=True)
    for patch in PATCHES:
        subprocess.run(["bash", "-c", command], cwd=clone, env={**env, "PATCH": str(patch)},
                       check=True, capture_output=True, text=True)
        body = subprocess.run(["git", "-C", str(clone), "log", "-1", "--format=%an <%ae>%n%B"],
                              env=env, check=True, capture_output=True, text=True).stdout
        lines = body.strip().splitlines()
        assert lines[0] == "A Submitter <submitter@example.org>"
        assert lines[1] == subject(patch)  # the [Bugfix][...] tags kept
        assert TRAILER.fullmatch(lines[-2]) and lines[-1] == (
            "Signed-off-by: A Submitter <submitter@example.org>"), lines[-2:]


def changed_lines(patch: Path) -> dict:
    """{"vllm": n, "tests": n}: lines added or removed, by top directory."""
    counts, top = {"vllm": 0, "tests": 0}, None
    for line in patch.read_text().split("\n---\n", 1)[1].splitlines():
        if line.startswith("diff --git a/"):
            top = line[len("diff --git a/"):].split("/", 1)[0]
        elif top and line[:1] in "+-" and not line.startswith(("+++ ", "--- ")):
            counts[top] += 1
    return counts


@pytest.mark.parametrize("patch", PATCHES, ids=number)
def test_regression_test_is_small_beside_the_change(patch, release):
    counts = changed_lines(patch)
    assert 0 < counts["tests"] <= max(2 * counts["vllm"], 40), counts
    # upstream/README.md's table gives these numbers
    row = f"| {number(patch)} | {counts['vllm']} | {counts['tests']} |"
    assert row in (UPSTREAM / "README.md").read_text(), row


# -- the PR texts ----------------------------------------------------------------


def section(patch: Path, heading: str, until: str) -> str:
    text = PR_TEXT[number(patch)].read_text()
    return text[text.index(heading):text.index(until)]


def plan_tests(patch: Path) -> frozenset:
    """(file, test function) of the pytest command of the PR's Test Plan, which
    names each test by its node id."""
    plan = section(patch, "## Test Plan", "## Test Result")
    commands = re.findall(r"```bash\n(.*?)\n```", plan, re.S)
    assert len(commands) == 1 and commands[0].startswith("pytest "), commands
    args = shlex.split(commands[0])[1:]
    assert args[-1] == "-v" and all("::" in arg for arg in args[:-1]), args
    return frozenset(tuple(arg.split("::")) for arg in args[:-1])


@pytest.mark.parametrize("patch", PATCHES, ids=number)
def test_pr_text_is_the_template_whole_and_cites_only_vllm_paths(patch, release):
    text = PR_TEXT[number(patch)].read_text()
    lines = text.splitlines()
    assert not [line for line in lines if line.startswith("# ")], "no H1 copy of the title"
    headings = [line for line in lines if line.startswith("## ")]
    assert [h for h in headings if h in TEMPLATE] == list(TEMPLATE) and lines[0] == TEMPLATE[0]
    tail = lines[-len(CHECKLIST):]
    assert [re.sub(r"^- \[[ x]\]", "- [{}]", line) for line in tail] == list(CHECKLIST)
    assert tail[4:7] == [line.format("x") for line in CHECKLIST[4:7]]  # purpose, plan, results
    # the release-notes box: ticked only where the PR says the note is in the draft
    assert tail[8] == CHECKLIST[8].format(" "), "the release note is not in vLLM's draft"
    assert not [word for word in FOREIGN if word in text]
    assert not BARE_O.findall(text), "write python -O: a bare -O is vLLM's compilation level"
    cited = set(CITED.findall(text))
    assert cited, "a PR text with no path"
    tree = run_tree("fixed")
    missing = sorted(path for path in cited if not (tree / path).exists())
    assert missing == [], f"{PR_TEXT[number(patch)].name} cites paths not in the patched tree"


@pytest.mark.parametrize("patch", PATCHES, ids=number)
def test_pr_text_speaks_for_the_submitter_and_leaves_them_blanks(patch, release):
    text = PR_TEXT[number(patch)].read_text()
    assert "<!--" not in text, "an HTML comment renders as nothing once posted"
    blanks = BLANK.findall(text)
    outside = BLANK.sub("", text)
    assert "SUBMITTER" not in outside, "a placeholder not in the **[SUBMITTER: ...]** form"
    assert not re.search(r"submitter|\b(he|she|they) (must|should|runs?|reviews?)\b", outside,
                         re.I), "third person about the submitter outside the blanks"
    assert re.search(r"\bI (wrote|made|measured|changed|kept|read|ran)\b", outside)
    said = " ".join(" ".join(b.split()) for b in blanks)
    for needed in ("gh pr list", "rebase onto main", "Python 3.12", "pre-commit run -a",
                   "your environment", "reviewed every changed line"):
        assert needed in said, needed
    disclosure = " ".join(outside[outside.index("**AI assistance:**"):].split())
    assert disclosure.startswith("**AI assistance:** I wrote this change with an AI assistant")
    assert "`Co-authored-by:`" in disclosure


def test_pr_texts_claim_only_measurements_this_project_makes(release):
    """Every sentence that says "measured" is registered with the tests that
    measure it, and those tests exist (their module defines them)."""
    for num, path in PR_TEXT.items():
        text = " ".join(BLANK.sub("", path.read_text()).split())
        sentences = [s for s in re.split(r"(?<=[.;])\s+", text) if re.search(r"measur", s, re.I)]
        registered = MEASURED[num]
        for sentence in sentences:
            assert [p for p in registered if p in sentence], (path.name, sentence)
        for phrase, tests in registered.items():
            assert phrase in text, (path.name, phrase)
            for test in tests:
                module, name = test.split("::")
                tree = ast.parse((REPO / module).read_text())
                assert name in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, test


def test_first_pr_gives_the_words_for_the_overlapping_pr(release):
    text = PR_TEXT["0001"].read_text()
    purpose = " ".join(text[text.index("## Purpose"):text.index("## Test Plan")].split())
    assert "Follow-up to #55234" in purpose and "#54649" in purpose
    assert "Fixes #54649" not in text  # that issue is closed
    assert "`KVCacheSpec.merge`'s docstring" in purpose
    assert "**Relation to #55187**" in purpose and "should land" in purpose
    # the words for #55187's thread, to post before opening: how the two differ, which should land
    blank = purpose.split("**[SUBMITTER: before opening this PR, post the comment below in #55187's")
    assert len(blank) == 2, "no placeholder asking to post in #55187's thread first"
    comment = blank[1].split("]**", 1)[1].split("**[SUBMITTER:", 1)[0]
    assert comment.strip().startswith("> "), "the comment to post, quoted"
    comment = comment.replace(" > ", " ")
    assert "catches only `AssertionError`" in comment
    assert "should land" in comment and "#55234" in comment


def test_second_and_third_pr_texts_say_what_the_review_asked(release):
    second = " ".join(PR_TEXT["0002"].read_text().split())
    for caller in ("vllm/v1/kv_offload/cpu/spec.py", "ec_connector/mooncake/worker.py",
                   "vllm/v1/worker/block_table.py", "get_forward_context()"):
        assert caller in second, caller
    third = " ".join(PR_TEXT["0003"].read_text().split())
    assert "#49777" in third and "Under `python -O -m pytest`" in third
    assert "`ValidationError` is a `ValueError`" in third


def test_patch_states_the_contract_once(release):
    """One statement of why the merges raise explicitly: KVCacheSpec.merge's
    docstring; no comment repeated at every raise."""
    text = (UPSTREAM / "0001-kv-cache-spec-merge-explicit-checks.patch").read_text()
    assert "+        Raises:\n+            AssertionError:" in text
    assert not re.findall(r"^\+\s*# Explicit", text, re.M)


# -- the tests, run in vLLM's tree ------------------------------------------------


def claimed(patch: Path) -> dict:
    """What the PR's Test Result says the runs printed: the counts with and
    without the fix, and the reasons (backticked) it gives for the failures;
    under "optimized", the same for its python -O -m pytest sentence."""
    results = " ".join(section(patch, "## Test Result", "\n---\n").split())
    with_fix = re.search(r"With this PR: `(\d+ passed)`", results).group(1)
    without = re.search(r"Without it \(v0\.33\.0 as released\): `(\d+ failed)` \((.*?)\)\.", results)
    said = {"with": with_fix, "without": without.group(1),
            "reasons": re.findall(r"`([^`]+)`", without.group(2))}
    optimized = re.search(r"Under `python -O -m pytest`.*?: with this PR `(\d+ passed)`; without it "
                          r"`(\d+ failed)` \((.*?)\)\.", results)
    if optimized:
        said["optimized"] = {"with": optimized.group(1), "without": optimized.group(2),
                             "reasons": re.findall(r"`([^`]+)`", optimized.group(3))}
    return said


def check_runs(runs: dict, patches: list, claims: dict) -> None:
    """``runs`` ({"released": ..., "fixed": ...}, one mode): their whole
    collection succeeded, every selected test failed on the release and passed
    with the patches, and the counts and reasons match ``claims`` (by patch)."""
    for state, run in runs.items():
        assert run["rc"] == (1 if state == "released" else 0), (state, run["stdout"][-6000:])
        assert "error" not in run["stdout"].splitlines()[-1], run["stdout"][-3000:]
        assert run["deselected"] > 0 and run["collected"] == runs["released"]["collected"]
    wanted = {(rel, name) for patch in patches for rel, name in new_tests(patch.name)}
    for state, want in (("released", "FAILED"), ("fixed", "PASSED")):
        outcomes = runs[state]["outcomes"]
        assert {(path, node.split("[")[0]) for path, node in outcomes} == wanted, outcomes
        assert set(outcomes.values()) == {want}, (state, outcomes)
    for patch in patches:
        mine = [key for key in runs["fixed"]["outcomes"]
                if (key[0], key[1].split("[")[0]) in new_tests(patch.name)]
        said = claims[number(patch)]
        assert said["with"] == f"{len(mine)} passed" and said["without"] == f"{len(mine)} failed"
        for reason in said["reasons"]:
            assert reason in runs["released"]["stdout"], (patch.name, reason)
            assert reason not in runs["fixed"]["stdout"], (patch.name, reason)


def test_new_tests_fail_without_the_fix_and_pass_with_it(release):
    """One pytest run per tree state over the three files whole: their whole
    collection succeeds (no collection error; the other tests deselected), every
    selected test fails on the release and passes with the patches, and each
    PR's Test Result gives those counts and reasons. IN_PROCESS's files again
    under python -O -m pytest, as its Test Result says."""
    runs = {state: pytest_run(state) for state in ("released", "fixed")}
    check_runs(runs, PATCHES, {number(patch): claimed(patch) for patch in PATCHES})
    # PR.md: under python -O the other merges return a merged spec and the set
    # picks a candidate (pytest's full diff lists what 0001's child printed)
    printed = dict(re.findall(r"^E\s+\+\s+'(\w+) (\w+)", runs["released"]["stdout"], re.M))
    assert {"rswa": "RSWASpec", "sink": "SinkFullAttentionSpec",
            "sliding_mla": "SlidingWindowMLASpec"}.items() <= printed.items(), printed
    assert printed["block_table_widths"] in ("2", "4") and printed["page_sizes"].isdigit(), printed
    # PR-0002.md: under python -O the other five getters returned instead of raising
    assert {name: "ok" for name in ("world", "tp", "pp", "dcp", "pcp")}.items() <= printed.items()
    optimized = [patch for patch in PATCHES if number(patch) in IN_PROCESS]
    claims = {number(patch): claimed(patch).get("optimized") for patch in optimized}
    assert all(claims.values()), "a Test Result without its python -O -m pytest sentence"
    check_runs({state: pytest_run(state, optimize=True) for state in ("released", "fixed")},
               optimized, claims)


def test_first_pr_reproducer_prints_its_table(release):
    """PR.md's reproducer, as written, under python and python -O on vLLM 0.33.0
    as released and under python -O with the patch: each prints the column of
    the table below it (the first word of each line: a value or an exception)."""
    text = PR_TEXT["0001"].read_text()
    code = re.search(r"```bash\nVLLM_TARGET_DEVICE=cpu python -O -c '\n(.*?)\n'\n```", text,
                     re.S).group(1)
    rows = [[cell.strip().strip("`") for cell in line.strip("|").split("|")]
            for line in text.splitlines() if re.match(r"\| (MLA|full)", line)]
    assert len(rows) == 3 and all(len(row) == 4 for row in rows), rows
    runs = {1: ([], run_tree("released")), 2: (["-O"], run_tree("released")),
            3: (["-O"], run_tree("fixed"))}
    for column, (flags, tree) in runs.items():
        proc = measured_run([suite_python(), *flags, "-c", code], cwd=str(tree),
                            env=hermetic_env(shim=False), timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        printed = [line.split()[0] for line in proc.stdout.strip().splitlines()[-3:]]
        assert printed == [row[column] for row in rows], (column, proc.stdout[-2000:])
