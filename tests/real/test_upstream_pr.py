"""upstream/ is ready to send: each patch, its regression test and its PR text.

- Each patch is a ``git format-patch`` with a ``[Bugfix][Scope]`` subject, that
  names nobody (no ``From:`` author header, no ``Signed-off-by:``: the
  submitter certifies the DCO) and discloses AI assistance with the trailer
  vLLM's contributing guide asks for; it is what upstream/make_patches.py
  builds from vLLM 0.33.0's files and upstream/tests/ (nothing edited by hand
  since).
- Each PR text is vLLM's template whole (``## Purpose``, ``## Test Plan``,
  ``## Test Result``, the checklist block, the closing line; no H1 copy of the
  title), in the first person: what only the submitter can do or know sits in
  ``<!-- SUBMITTER: ... -->`` blanks, and no other sentence speaks of the
  submitter. It names its base and the re-runs (in a blank), discloses AI
  assistance, writes ``python -O`` (a bare ``-O`` is vLLM's compilation level),
  and every path it cites exists in the patched vLLM tree: the installed 0.33.0
  package plus the test files the patch adds to. It cites nothing of this
  project.
- Every sentence of a PR text that says "measured" is in ``MEASURED`` with the
  tests of this project that make that measurement, and each of those tests
  exists: a PR text cannot claim a measurement no test here makes.
- Each regression test is added to the file where vLLM keeps its kind of test
  (upstream/make_patches.py's ``TEST_BASES``), holds only cases that fail
  without its fix, and has at most twice the patch's ``vllm/`` lines (40 where
  the change is a few lines).
- Each regression test, run with the PR's Test Plan command from a tree laid
  out as vLLM's repository (upstream/overlay.py), passes with its fix and fails
  without it, on the released wheel, with the counts its Test Result gives: one
  pytest run per patch with its fix, one run of all three on the release.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness import upstream_overlay, venv_python, vllm_location
from helpers import REPO, hermetic_env

pytestmark = pytest.mark.releases("0.33.0")
UPSTREAM = REPO / "upstream"
PATCHES = sorted(UPSTREAM.glob("000*.patch"))
PR_TEXT = {"0001": UPSTREAM / "PR.md", "0002": UPSTREAM / "PR-0002.md",
           "0003": UPSTREAM / "PR-0003.md"}
TAGS = {"0001": "[Bugfix][Core] ", "0002": "[Bugfix][Distributed] ", "0003": "[Bugfix][Config] "}
TRAILER = "Co-authored-by: Claude"  # vLLM's contributing guide, "AI Assisted Contributions"
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
BLANK = re.compile(r"<!-- SUBMITTER: (.*?)-->", re.S)
# Each sentence of a PR text that says "measured" (by a phrase of it) and the
# tests of this project that make the measurement. Not measured here, so not
# said to be: 0003's Mamba align and compile-range-0 cases under python -O and
# 0002's get_forward_context (both read from the code).
MEASURED = {
    "0001": {
        "I measured on CPU with the v0.33.0 release under `python -O`: `is_kv_cache_spec_uniform`": [
            "tests/real/test_upstream_pr.py::test_regression_tests_fail_without_their_fixes",
            "tests/real/test_upstream_pr.py::test_first_pr_reproducer_prints_its_table",
            "tests/real/test_kv_spec_merge.py::test_without_the_shim_O_reproduces_the_bug"],
        "I measured the kept `cache_dtype_str` changing": [
            "tests/real/test_kv_spec_merge.py::"
            "test_without_the_shim_O_keeps_a_cache_dtype_chosen_by_the_hash_seed"],
        "I also measured it end to end": [
            "tests/e2e/test_served.py::test_full_first_without_shim_dies_at_engine_start_under_O"],
    },
    "0002": {
        "I measured on CPU with the v0.33.0 release under `python -O` that the barrier": [
            "tests/real/test_o_parity.py::test_cpu_offload_barrier_needs_the_getter_to_raise",
            "tests/real/test_upstream_pr.py::test_regression_tests_fail_without_their_fixes"],
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


def make_patches_module():
    spec = importlib.util.spec_from_file_location("kimi_make_patches", UPSTREAM / "make_patches.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def overlay_module():
    return upstream_overlay("0.33.0")["module"]


def number(patch: Path) -> str:
    return patch.name[:4]


def subject(patch: Path) -> str:
    text = patch.read_text()
    found = re.search(r"^Subject: \[PATCH\] (.*?)\n(?! )", text, re.M | re.S)
    assert found, patch.name
    return " ".join(found.group(1).split())


def test_there_is_one_pr_text_per_patch():
    assert [number(p) for p in PATCHES] == sorted(PR_TEXT)
    assert all(path.is_file() for path in PR_TEXT.values())


def message(patch: Path) -> str:
    """The commit message: the headers and body before the diffstat."""
    text = patch.read_text()
    return text[:text.index("\n---\n")]


@pytest.mark.parametrize("patch", PATCHES, ids=number)
def test_patch_names_nobody_and_discloses_ai_assistance(patch, release):
    head = message(patch)
    assert subject(patch).startswith(TAGS[number(patch)])
    # no identity: the submitter authors the commit and signs it off (upstream/README.md)
    assert not re.search(r"^(From|Signed-off-by): ", head, re.M), head
    assert head.splitlines()[-1] == TRAILER
    assert not BARE_O.findall(head), "write python -O: a bare -O is vLLM's compilation level"


def test_the_readme_command_makes_each_patch_the_submitters_signed_off_commit(release, tmp_path):
    """upstream/README.md's command, on the 0.33.0 files each patch changes."""
    readme = (UPSTREAM / "README.md").read_text()
    command = re.search(r"```bash\n\s*(sed .*?)\n\s*```", readme, re.S).group(1)
    command = command.replace("0001-kv-cache-spec-merge-explicit-checks.patch", '"$PATCH"')
    site = vllm_location(venv_python(release))
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_DATE": "2026-12-03T12:00:00+0000"}

    def git(*args, **kwargs):
        return subprocess.run(["git", *args], cwd=tmp_path, env=env, check=True, text=True,
                              capture_output=True, **kwargs).stdout

    git("init", "-q")
    git("config", "user.name", "A Submitter")
    git("config", "user.email", "submitter@example.org")
    for patch in PATCHES:
        for rel in overlay_module().patch_paths(patch):
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_bytes((site / rel).read_bytes())
        for rel in overlay_module().added_paths(patch):  # vLLM's test files, as far as known here
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text(make_patches_module().stand_in(rel))
    git("add", "-A")
    git("commit", "-q", "-m", "vLLM 0.33.0 as released")
    for patch in PATCHES:
        subprocess.run(["bash", "-c", command], cwd=tmp_path, env={**env, "PATCH": str(patch)},
                       check=True, capture_output=True, text=True)
        body = git("log", "-1", "--format=%an <%ae>%n%B")
        lines = body.strip().splitlines()
        assert lines[0] == "A Submitter <submitter@example.org>"
        assert lines[1] == subject(patch)  # the [Bugfix][...] tags kept
        assert lines[-2:] == [TRAILER, "Signed-off-by: A Submitter <submitter@example.org>"]


def test_patches_are_what_make_patches_builds(release):
    tree = vllm_location(venv_python(release))
    proc = subprocess.run([sys.executable, str(UPSTREAM / "make_patches.py"), str(tree), "--check"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@functools.cache
def patched_tree(patch_name: str) -> Path:
    dest = Path(tempfile.mkdtemp(prefix="kimi-upstream-")) / "vllm-tree"
    site = vllm_location(venv_python("0.33.0"))
    overlay_module().make_overlay(site, UPSTREAM / patch_name, dest)
    return dest


@pytest.mark.parametrize("patch", PATCHES, ids=number)
def test_patch_adds_its_regression_test_to_vllms_file(patch, release):
    """The test hunks add upstream/tests/<path>'s added imports and tests to the
    file vLLM keeps (TEST_BASES); the overlay runs that same text."""
    make = make_patches_module()
    added = overlay_module().added_paths(patch)
    assert added and all(rel in make.TEST_BASES for rel in added)
    text = patch.read_text()
    for rel in added:
        assert f"--- a/{rel}\n" in text  # a change to vLLM's file, not a new one
        _own, imports, appended = make.sections(rel)
        hunk = text.split(f"+++ b/{rel}\n", 1)[1].split("\ndiff --git ", 1)[0]
        plus = [line[1:] for line in hunk.splitlines() if line.startswith("+")]
        assert plus == [*imports, "", "", *appended]
        assert (patched_tree(patch.name) / rel).read_text() == (UPSTREAM / rel).read_text()


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


def plan_command(patch: Path) -> list:
    """The pytest command of the PR's Test Plan, as arguments."""
    text = PR_TEXT[number(patch)].read_text()
    plan = text[text.index("## Test Plan"):text.index("## Test Result")]
    line = re.search(r"```bash\n(pytest .*)\n```", plan).group(1)
    return shlex.split(line)[1:]


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
    assert not [word for word in FOREIGN if word in text]
    assert not BARE_O.findall(text), "write python -O: a bare -O is vLLM's compilation level"
    cited = set(CITED.findall(text))
    assert cited, "a PR text with no path"
    tree = patched_tree(patch.name)
    missing = sorted(path for path in cited if not (tree / path).exists())
    assert missing == [], f"{PR_TEXT[number(patch)].name} cites paths not in the patched tree"
    command = plan_command(patch)
    assert {arg.split("::")[0] for arg in command if arg.startswith("tests/")} == set(
        overlay_module().added_paths(patch))


@pytest.mark.parametrize("patch", PATCHES, ids=number)
def test_pr_text_speaks_for_the_submitter_and_leaves_them_blanks(patch, release):
    text = PR_TEXT[number(patch)].read_text()
    blanks = BLANK.findall(text)
    outside = BLANK.sub("", text)
    assert "<!--" not in outside, "a comment that is not a SUBMITTER blank"
    assert not re.search(r"submitter|\b(he|she|they) (must|should|runs?|reviews?)\b", outside,
                         re.I), "third person about the submitter outside the blanks"
    assert re.search(r"\bI (wrote|made|measured|changed|kept|read)\b", outside)
    said = " ".join(" ".join(b.split()) for b in blanks)
    for needed in ("search open PRs", "gh pr list", "rebase onto main", "Python 3.12",
                   "pre-commit run -a", "your environment", "reviewed every changed line"):
        assert needed in said, needed
    results = " ".join(outside[outside.index("## Test Result"):].split())
    assert "v0.33.0 release wheel, not `main`" in results
    disclosure = " ".join(outside[outside.index("**AI assistance:**"):].split())
    assert disclosure.startswith("**AI assistance:** I wrote this change with an AI assistant")
    assert TRAILER in disclosure


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


def test_first_pr_follows_up_its_relatives(release):
    text = PR_TEXT["0001"].read_text()
    purpose = " ".join(text[text.index("## Purpose"):text.index("## Test Plan")].split())
    assert "Follow-up to #55234" in purpose and "#54649" in purpose
    assert "Fixes #54649" not in text  # that issue is closed
    assert "#55187" in purpose and "cc #55187's author" in purpose
    assert "`KVCacheSpec.merge`'s docstring" in purpose
    assert "page-size bucketing catches `(AssertionError, ValueError)`" in purpose


def test_second_and_third_pr_texts_say_what_the_review_asked(release):
    second = " ".join(PR_TEXT["0002"].read_text().split())
    assert "get_forward_context()" in second and "cuda_communicator.py" in second
    assert "moonep.py" in second and "not folded into" in second
    third = " ".join(PR_TEXT["0003"].read_text().split())
    assert "#49777" in third and "read those two from the code" in third


def test_patch_states_the_contract_once(release):
    """One statement of why the merges raise explicitly: KVCacheSpec.merge's
    docstring; no comment repeated at every raise."""
    text = (UPSTREAM / "0001-kv-cache-spec-merge-explicit-checks.patch").read_text()
    assert "+        Raises:\n+            AssertionError:" in text
    assert not re.findall(r"^\+\s*# Explicit", text, re.M)


def _pytest(tree: Path, args, release, output: list = None) -> dict:
    """{(file, node id after the file name): outcome} of vLLM's pytest run in
    ``tree`` with ``args`` (a Test Plan's); its stdout appended to ``output``."""
    proc = subprocess.run([venv_python(release), "-m", "pytest", *args, "-v", "-p", "no:cacheprovider"],
                          cwd=str(tree), env=hermetic_env(shim=False), capture_output=True, text=True,
                          timeout=900)
    found = re.findall(r"^(tests/\S+?)::(\S+) (PASSED|FAILED|SKIPPED|ERROR)", proc.stdout, re.M)
    assert found, proc.stdout[-4000:] + proc.stderr[-2000:]
    if output is not None:
        output.append(proc.stdout)
    return {(path, name): outcome for path, name, outcome in found}


def claimed(patch: Path, which: str) -> str:
    """What the PR's Test Result says the run printed, with or without the fix."""
    results = " ".join(PR_TEXT[number(patch)].read_text().split("## Test Result")[1].split())
    pattern = (r"With this PR: `(\d+ passed)`" if which == "with"
               else r"Without it \(v0\.33\.0 as released\): `(\d+ failed)`")
    return re.search(pattern, results).group(1)


@pytest.mark.parametrize("patch", PATCHES, ids=number)
def test_regression_test_passes_with_its_fix(patch, release):
    tests = overlay_module().added_paths(patch)
    outcomes = _pytest(patched_tree(patch.name), plan_command(patch), release)
    assert set(outcomes.values()) == {"PASSED"}, outcomes
    assert {path for path, _ in outcomes} == set(tests)
    assert claimed(patch, "with") == f"{len(outcomes)} passed"


def test_regression_tests_fail_without_their_fixes(release, tmp_path):
    """The three Test Plans on vLLM 0.33.0 as released, in one pytest run: every
    test they select fails there (the patches add only cases that need the fix)."""
    tests = [rel for patch in PATCHES for rel in overlay_module().added_paths(patch)]
    released = overlay_module().make_tree(vllm_location(venv_python(release)), tmp_path / "released",
                                          {rel: (UPSTREAM / rel).read_text() for rel in tests})
    outcomes = {}
    plans = [plan_command(patch) for patch in PATCHES]
    # one run: the node ids and files of all three; a -k applies to its own file alone
    selected = [arg for plan in plans for arg in plan if arg.startswith("tests/")]
    output: list = []
    ran = _pytest(released, [*selected, "-vv"], release, output)
    for patch, plan in zip(PATCHES, plans):
        keyword = plan[plan.index("-k") + 1] if "-k" in plan else None
        mine = {key: o for key, o in ran.items() if key[0] in overlay_module().added_paths(patch)
                and (keyword is None or keyword in key[1])}
        outcomes.update(mine)
        assert mine and set(mine.values()) == {"FAILED"}, (patch.name, mine)
        assert claimed(patch, "without") == f"{len(mine)} failed", (patch.name, mine)
    assert set(ran) == set(outcomes), "a test no Test Plan selects"
    # PR.md: under python -O the other merges return a merged spec and the set
    # picks a candidate (pytest's full diff lists what 0001's child printed)
    printed = re.findall(r"^E\s+\+\s+'(\w+) (\w+)", output[0], re.M)
    assert {"rswa": "RSWASpec", "sink": "SinkFullAttentionSpec",
            "sliding_mla": "SlidingWindowMLASpec"}.items() <= dict(printed).items(), printed
    assert dict(printed)["block_table_widths"] in ("2", "4"), printed
    assert dict(printed)["page_sizes"].isdigit(), printed


def test_first_pr_reproducer_prints_its_table(release, tmp_path):
    """PR.md's reproducer, as written, under python and python -O on vLLM 0.33.0
    as released and under python -O with the patch: each prints the column of
    the table below it (the first word of each line: a value or an exception)."""
    text = PR_TEXT["0001"].read_text()
    code = re.search(r"```bash\nVLLM_TARGET_DEVICE=cpu python -O -c '\n(.*?)\n'\n```", text,
                     re.S).group(1)
    rows = [[cell.strip().strip("`") for cell in line.strip("|").split("|")]
            for line in text.splitlines() if re.match(r"\| (MLA|full)", line)]
    assert len(rows) == 3 and all(len(row) == 4 for row in rows), rows
    released = tmp_path / "released"
    released.mkdir()
    runs = {1: ([], released), 2: (["-O"], released), 3: (["-O"], patched_tree(
        "0001-kv-cache-spec-merge-explicit-checks.patch"))}
    for column, (flags, tree) in runs.items():
        proc = subprocess.run([venv_python(release), *flags, "-c", code], cwd=str(tree),
                              env=hermetic_env(shim=False, PYTHONPATH=str(tree)),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        printed = [line.split()[0] for line in proc.stdout.strip().splitlines()[-3:]]
        assert printed == [row[column] for row in rows], (column, proc.stdout[-2000:])
