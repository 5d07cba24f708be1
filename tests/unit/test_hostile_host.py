"""The pod files against a hostile host (issue 28), shim mechanics without vLLM.

The exporter's own file handling (kimi_hotfix.runtime.metrics), in this process, on
directories made here; the real vLLM processes, other pid namespaces and
another uid: tests/real/test_hostile.py; two real servers in two pid
namespaces: tests/e2e (``sfe-O`` and ``mla-O-spawn``).

- the collector's directory, fuzzed with Hypothesis (names and contents of
  entries: files, links, directories): a scrape never raises, always serves this
  process and the one valid record of a live process (its pid label from the
  file name), serves nothing else, removes only records of this pid namespace
  whose process is provably gone, and nothing it did not name;
- the sweep of ``$TMPDIR``, fuzzed the same way: it never raises, and removes
  only this user's pod directories whose ``owner.lock`` nobody holds;
- ``audit`` where HOME is unset and the uid has no passwd entry (another uid,
  by ``setpriv``), and with cache entries of the wrong shape.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kimi_hotfix.runtime import metrics, scrape

from helpers import REPO, VLLM_COMPLETE, hermetic_env

NS = metrics._pid_ns()
PARENT = os.getppid()
PARENT_START = metrics._start_time(PARENT)
VALID = {"role": "EngineCore", "info": {k: "x" for k in metrics.INFO_LABELS},
         "states": {"kv_spec_merge": "applied"}, "cost": {"arm": 0.1}}
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
contents = st.one_of(
    st.binary(max_size=64),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({}, optional={k: json_values for k in VALID}).map(
        lambda d: json.dumps({**VALID, **d}).encode()),
)
pids = st.one_of(st.integers(0, 10**25), st.sampled_from([1, PARENT, os.getpid()]))
names = st.one_of(
    st.text(min_size=1, max_size=40).filter(lambda n: "/" not in n and "\0" not in n
                                            and n not in (".", "..") and len(n.encode()) < 200),
    st.builds(lambda pid, start, ns, ext: f"{pid}-{start}-{ns}{ext}", pids,
              st.sampled_from(["", "0", "1", PARENT_START, "²", "99999999999999999999999"]),
              st.sampled_from([NS, "1", "", "٣"]), st.sampled_from([".json", ".json.tmp", ""])),
    st.sampled_from(["20240101.json", "1.json", "owner.lock", "99999999999999999999.json"]),
)
kinds = st.sampled_from(["file", "link", "dir"])


def plant(root, entries, victim):
    for name, data, kind in entries:
        path = os.path.join(root, name)
        if os.path.lexists(path):
            continue
        if kind == "link":
            os.symlink(victim, path)
        elif kind == "dir":
            os.mkdir(path)
        else:
            with open(path, "wb") as f:
                f.write(data)


@pytest.fixture(autouse=True)
def _restore():
    saved = metrics._pod
    yield
    metrics._pod = saved


@SETTINGS
@given(entries=st.lists(st.tuples(names, contents, kinds), max_size=8))
def test_a_scrape_serves_only_live_records_whatever_the_directory_holds(entries):
    root = tempfile.mkdtemp()  # 0700, this user's
    victim = os.path.join(tempfile.mkdtemp(), "victim.json")
    try:
        with open(victim, "w") as f:
            f.write(json.dumps({**VALID, "role": "Victim"}))
        live = f"{PARENT}-{PARENT_START}-{NS}.json"  # a real live process of this namespace
        with open(os.path.join(root, live), "w") as f:
            json.dump({**VALID, "pid": 4242}, f)  # the contents lie about the pid
        plant(root, entries, victim)
        before = set(os.listdir(root))
        metrics._pod = root
        records = scrape._pod_records()  # never raises
        assert records[0]["pid"] == os.getpid()
        served = {rec["pid"]: rec for rec in records[1:]}
        assert set(served) == {PARENT}, served  # the label from the name, not the contents
        assert served[PARENT]["role"] == "EngineCore"
        removed = before - set(os.listdir(root))
        for name in removed:  # only names of this module, this namespace, a process gone
            found = metrics.RECORD.fullmatch(name)
            assert found and found.group(3) == NS and scrape._alive(int(found.group(1)),
                                                                     found.group(2)) is False, name
        assert os.path.exists(victim) and "Victim" in open(victim).read()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(os.path.dirname(victim), ignore_errors=True)


def _pod_dir(tmp, held):
    """A pod directory of this user, its owner.lock held by a live process or not."""
    made = tempfile.mkdtemp(prefix=f"{metrics.POD_PREFIX}{os.geteuid()}-", dir=tmp)
    fd = os.open(os.path.join(made, metrics.OWNER), os.O_RDWR | os.O_CREAT, 0o600)
    if held:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return made, fd
    os.close(fd)
    return made, None


@SETTINGS
@given(entries=st.lists(st.tuples(
    st.one_of(names, names.map(lambda n: metrics.POD_PREFIX + n),
              names.map(lambda n: f"{metrics.POD_PREFIX}{os.geteuid()}-{n}")),
    contents, kinds), max_size=8))
def test_the_sweep_removes_only_this_users_dead_pod_directories(entries):
    tmp = tempfile.mkdtemp()
    victim = tempfile.mkdtemp()
    fds = []
    try:
        live, fd = _pod_dir(tmp, held=True)
        fds.append(fd)
        dead, _ = _pod_dir(tmp, held=False)
        plant(tmp, entries, victim)
        before = set(os.listdir(tmp))
        metrics._sweep_pods(tmp)  # never raises
        assert before - set(os.listdir(tmp)) == {os.path.basename(dead)}
        assert os.path.isdir(victim)
    finally:
        for fd in fds:
            os.close(fd)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(victim, ignore_errors=True)


CREATOR = """
import sys, time
from kimi_hotfix.runtime import metrics
metrics._open_pod()
print(metrics._pod, flush=True)
time.sleep(120)
"""


def test_a_sigkilled_creators_pod_directory_is_swept_and_a_live_ones_is_not(tmp_path):
    """docs/operations.md: the next creator removes the directories whose lock
    nobody holds (a creator SIGKILLed): a real process makes its pod directory
    as the exporter does, and the kernel releases its lock when it is killed."""
    env = hermetic_env(TMPDIR=str(tmp_path), PYTHONPATH=str(REPO))
    creator = subprocess.Popen([sys.executable, "-c", CREATOR], env=env,
                               stdout=subprocess.PIPE, text=True)
    try:
        made = creator.stdout.readline().strip()
        assert os.path.dirname(made) == str(tmp_path) and os.path.isdir(made), made
        metrics._sweep_pods(str(tmp_path))
        assert os.path.isdir(made)  # its creator lives: kept
        creator.send_signal(signal.SIGKILL)
        creator.wait(timeout=30)
        assert os.path.isdir(made)  # no exit handler ran
        metrics._sweep_pods(str(tmp_path))
        assert not os.path.exists(made)
    finally:
        creator.kill()
        creator.wait(30)
        creator.stdout.close()


def test_a_pod_directory_of_another_user_or_through_a_link_is_never_used(tmp_path):
    """KIMI_HOTFIX_POD_DIR is used only where it is this user's directory, not a
    link, and writable by no one else; otherwise nothing is written into it."""
    private = tempfile.mkdtemp()
    link = os.path.join(tempfile.mkdtemp(), "link")
    os.symlink(private, link)
    shared = tempfile.mkdtemp()
    os.chmod(shared, 0o777)
    other = tempfile.mkdtemp()
    os.chown(other, 65534, 65534)  # nobody's (the tests run as root)
    try:
        assert metrics._open_dir(private) is not None
        for refused in (link, shared, other, os.path.join(private, "missing")):
            assert metrics._open_dir(refused) is None, refused
    finally:
        for d in (private, os.path.dirname(link), shared, other):
            shutil.rmtree(d, ignore_errors=True)


AUDIT = ("import sys, json; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
         "from kimi_hotfix.tools.audit import scan\n"
         "r = scan.scan(use_cache=True)\n"
         "print('KIMI_JSON:' + json.dumps(dict(r['cache'], hits=r['cache_hits'])))\n")


@pytest.fixture
def world_readable_tree():
    """The package and the stand-in vLLM where another uid can read them."""
    root = tempfile.mkdtemp()
    os.chmod(root, 0o755)
    shutil.copytree(REPO / "kimi_hotfix", os.path.join(root, "repo", "kimi_hotfix"),
                    ignore=shutil.ignore_patterns("__pycache__", "_vendor"))
    shutil.copytree(VLLM_COMPLETE, os.path.join(root, "standin"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(os.path.join(root, "standin", "vllm", "steer.py"), "w") as f:  # a site to scan
        f.write("def check(x):\n    assert x, 'x'\n\n\ndef planner(x):\n    try:\n"
                "        check(x)\n    except AssertionError:\n        return 0\n    return 1\n")
    subprocess.run(["chmod", "-R", "a+rX", root], check=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _python():
    for candidate in ("/usr/bin/python3", shutil.which("python3")):
        if candidate and subprocess.run([candidate, "-c", "import sys; sys.exit(sys.version_info < (3, 9))"],
                                        capture_output=True).returncode == 0:
            return candidate
    raise AssertionError("no system python3 another uid can run")


def test_audit_runs_where_home_is_unset_and_the_uid_has_no_passwd_entry(world_readable_tree):
    env = {k: v for k, v in hermetic_env(shim=False).items()
           if k not in ("HOME", "KIMI_HOTFIX_CACHE", "XDG_CACHE_HOME")}
    proc = subprocess.run(["setpriv", "--reuid=4242", "--regid=4242", "--clear-groups", _python(),
                           "-c", AUDIT, os.path.join(world_readable_tree, "repo"),
                           os.path.join(world_readable_tree, "standin")],
                          capture_output=True, text=True, env=env, cwd="/", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cache = json.loads(proc.stdout.split("KIMI_JSON:")[1])
    assert cache["writable"] is False and cache["directory"] is None
    assert "HOME is unset" in cache["why"]


def test_audit_cache_entries_of_the_wrong_shape_are_misses(tmp_path, world_readable_tree):
    env = hermetic_env(shim=False, KIMI_HOTFIX_CACHE=str(tmp_path))
    args = [_python(), "-c", AUDIT, os.path.join(world_readable_tree, "repo"),
            os.path.join(world_readable_tree, "standin")]
    first = json.loads(subprocess.run(args, capture_output=True, text=True, env=env,
                                      check=True).stdout.split("KIMI_JSON:")[1])
    entries = sorted((tmp_path / "audit").rglob("*.json"))
    assert entries and first["written"] == len(entries)
    for i, entry in enumerate(entries):  # each a different wrong shape
        entry.write_text(json.dumps([[], {}, {"defs": 1}, {"imports": {}, "star": [], "defs": {
            "f": {"line": "x"}}, "classes": {}, "sites": []}, "x"][i % 5]))
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = json.loads(proc.stdout.split("KIMI_JSON:")[1])
    assert again["hits"] == 0 and again["written"] == len(entries)  # every one a miss, rewritten
    third = json.loads(subprocess.run(args, capture_output=True, text=True, env=env,
                                      check=True).stdout.split("KIMI_JSON:")[1])
    assert third["hits"] == len(entries) and third["written"] == 0  # the control: good ones hit
