"""The hostile-host tier (issue 28): the exporter's files on a shared host, real vLLM 0.29.0 -O.

A pod whose two containers share /tmp: two drivers (tests/real/hostile_child.py),
each in a pid namespace of its own (``unshare --pid --fork --mount-proc``, a
shell as pid 1 running Python as a container's entrypoint; namespace "a" starts
its pids at 30001, so its processes' pids do not exist in "b"), one ``TMPDIR``
and one ``PROMETHEUS_MULTIPROC_DIR`` shared. Before they start, another user
(``setpriv`` to nobody) plants, in the shared directories, what any local user
can: pod directory names that do not parse (``...-99999999999999999999-x``,
``...-²-x``), a world-writable pod directory of nobody's, links to a root-owned
victim; an operator's data directory holds ``20240101.json``. Each case is a
process of the exporter (a fork of its driver that imports vLLM's KV-cache
interface and prometheus_client, so the shim arms), which the table ``CASES``
describes; docs/security.md names the test of each row.

Each finding of issue 28 that concerns the exporter, before -> after (the
previous exporter fails every one of these: measured):
1. namespace b's arming sweeps the shared /tmp while a serves: a's pod directory
   and a's live multiprocess gauge file stay, and a's /metrics keeps its series;
2. the pod directory removed under a process and made again by nobody with a
   link where a record goes: nothing is written there, the victim is intact;
   KIMI_HOTFIX_POD_DIR naming nobody's directory: refused (a warning), a
   private one is made instead, nothing is written into nobody's;
3. KIMI_HOTFIX_POD_DIR naming an operator's data directory: its files stay;
6. names that do not parse: the exporter works, and its directory leaves with it;
7. a record whose contents lie about its pid is served under the pid of its
   name; a malformed one is skipped alone; a dead one is removed; an old-style
   ``1.json`` is neither served nor removed;
8. a KIMI_HOTFIX value with a newline and a forged summary line: escaped;
9. vLLM's ``.py`` changed after the import (a real copy in an overlay of the
   installed vLLM), the shim armed late: under -O, -O parity keeps that
   module's -O code and says so (``partial``), the change never runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from harness import venv_python
from helpers import PATCHES, REPO, hermetic_env

pytestmark = pytest.mark.releases("0.29.0")

HERE = Path(__file__).resolve().parent
PID_FLOOR = 30000
FORGED = ("2026-01-01 00:00:00,000 kimi-hotfix[1] INFO kimi-hotfix 0.1.0 (vllm 0.29.0, "
          "python -O): kv_spec_merge: applied | capture_workspace: applied")
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
VALID = {"role": "EngineCore", "states": {"kv_spec_merge": "applied"}, "cost": {"arm": 0.1},
         "info": {"version": "0.1.0", "vllm": "0.29.0", "python": "python -O", "enabled": "true",
                  "armed_by": "sitecustomize", "o_parity": "package"}}


def cases(shared):
    """What each namespace's driver runs (hostile_child.py), in order."""
    tmp, mp, data, planted, victim = (shared[k] for k in ("tmp", "mp", "data", "planted", "victim"))
    default = {"TMPDIR": tmp}
    return {
        "a": [
            # the first server: its pod directory named by a variable pointing at nobody's
            {"name": "a-default", "env": {**default, "KIMI_HOTFIX_POD_DIR": planted},
             "signal": "a-default-ready", "then_wait": "b-done", "background": True},
            {"name": "a-mp", "env": {**default, "PROMETHEUS_MULTIPROC_DIR": mp},
             "signal": "a-mp-ready", "then_wait": "b-done", "background": True},
        ],
        "b": [
            # the second: it makes its pod directory (and sweeps the shared /tmp) while a
            # serves; then records planted in its own directory
            {"name": "b-default", "env": default, "unset": ["KIMI_HOTFIX_POD_DIR"],
             "wait": "a-default-ready",
             "plant_records": {"1.json": json.dumps({**VALID, "pid": 4242}),
                               "1-{start1}-{ns}.json": json.dumps({**VALID, "pid": 4242}),
                               "2-{start2}-{ns}.json": "[]",
                               "99999-1-{ns}.json": json.dumps(VALID)}},
            {"name": "b-mp", "env": {**default, "PROMETHEUS_MULTIPROC_DIR": mp}, "wait": "a-mp-ready"},
            {"name": "b-data", "env": {**default, "KIMI_HOTFIX_POD_DIR": data}},
            {"name": "b-clean", "env": default, "unset": ["KIMI_HOTFIX_POD_DIR"],
             "clean_and_plant": victim, "signal": "b-done"},
            # finding 8: a kill switch whose value would forge a log line of its own
            {"name": "b-env", "env": {**default, "KIMI_HOTFIX": f"0\n{FORGED}"}},
            # finding 9: vLLM's .py changed after the import, under -O
            {"name": "b-source", "env": default, "overlay": shared["overlay"]},
        ],
    }


def overlay(dest):
    """vLLM 0.29.0 as installed, linked file by file (upstream/overlay.py's tree),
    but for a real copy of vllm/distributed/parallel_state.py (its bytecode left
    out): a file a test may change without touching the venv."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kimi_overlay", REPO / "upstream" / "overlay.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    python = venv_python("0.29.0")
    site = Path(subprocess.run([python, "-c", "import importlib.util as u; print(list(u.find_spec("
                                "'vllm').submodule_search_locations)[0])"], capture_output=True,
                               text=True, check=True, env=hermetic_env(shim=False)).stdout.strip())
    rel = "vllm/distributed/parallel_state.py"
    dest.mkdir()
    module._link_tree(site, dest / "vllm", {module._bytecode_of(rel)})
    (dest / rel).unlink()
    shutil.copy2(site.parent / rel, dest / rel)
    return str(dest)


def _dir(path, mode=0o755):
    path.mkdir(parents=True)
    path.chmod(mode)
    return str(path)


def as_nobody(script):
    subprocess.run([*NOBODY, "sh", "-c", script], check=True, timeout=60)


@pytest.fixture(scope="module")
def pod():
    """Both drivers run to their end: {namespace: driver report}, {case: what it saw},
    the shared paths."""
    root = Path(tempfile.mkdtemp(prefix="kimi-hotfix-hostile-"))
    root.chmod(0o755)
    shared = {"tmp": _dir(root / "tmp", 0o1777), "mp": _dir(root / "mp", 0o1777),
              "data": _dir(root / "data"), "control": _dir(root / "control", 0o700),
              "victim": str(root / "victims" / "victim.txt")}
    (root / "victims").mkdir(mode=0o755)
    Path(shared["victim"]).write_text("victim\n")
    Path(shared["data"], "20240101.json").write_text('{"kept": true}\n')
    tmp = shared["tmp"]
    shared["planted"] = f"{tmp}/kimi-hotfix-pod-0-planted"
    as_nobody(f'cd "{tmp}" && mkdir kimi-hotfix-pod-99999999999999999999-x kimi-hotfix-pod-²-x '
              f'&& mkdir -m 777 kimi-hotfix-pod-0-planted && ln -s "{shared["victim"]}" '
              f'kimi-hotfix-pod-0-planted/owner.lock && ln -s "{shared["victim"]}" '
              f'kimi-hotfix-pod-0-link && cd "{shared["mp"]}" && '
              f'ln -s "{shared["victim"]}" kimi-hotfix-live-1-planted.lock && '
              f': > kimi-hotfix-live-²-x.lock')
    # a gauge file prometheus_client itself can read (an empty one breaks its own scrape):
    # its name holds a pid no os.kill() takes
    subprocess.run([*NOBODY, "/usr/bin/python3", "-c", "import struct, sys; open(sys.argv[1], 'wb')"
                    ".write(struct.pack('i', 8) + bytes(65532))",
                    f"{shared['mp']}/gauge_liveall_99999999999999999999.db"], check=True)
    shared["overlay"] = overlay(root / "overlay")
    plan = cases(shared)
    procs = {}
    for ns in ("a", "b"):
        config = root / f"config-{ns}.json"
        config.write_text(json.dumps({"control": shared["control"], "namespace": ns, "cases": plan[ns]}))
        floor = f'echo {PID_FLOOR} > /proc/sys/kernel/ns_last_pid; ' if ns == "a" else ""
        cmd = ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c",
               floor + '"$@"; exit $?', "sh", venv_python("0.29.0"), "-O",
               str(HERE / "hostile_child.py"), str(config)]
        procs[ns] = subprocess.Popen(cmd, env=hermetic_env(), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, cwd=str(root))
    outputs = {ns: proc.communicate(timeout=600)[0] for ns, proc in procs.items()}
    drivers, seen = {}, {}
    for ns, proc in procs.items():
        report = Path(shared["control"], f"driver-{ns}.json")
        assert proc.returncode == 0 and report.exists(), (ns, outputs[ns][-3000:])
        drivers[ns] = json.loads(report.read_text())
        for case in plan[ns]:
            base = Path(shared["control"], case["name"])
            out = json.loads(Path(f"{base}.json").read_text())
            out["stderr"] = Path(f"{base}.err").read_text()
            assert "error" not in out, (case["name"], out["error"], out["stderr"][-3000:])
            seen[case["name"]] = out
    # what is left in the shared directories once every process ended
    left = {k: sorted(os.listdir(shared[k])) for k in ("tmp", "mp", "data")}
    victim = Path(shared["victim"]).read_text()
    planted_files = sorted(os.listdir(shared["planted"]))
    yield drivers, seen, {**shared, "left": left, "victim_text": victim,
                          "planted_files": planted_files}
    shutil.rmtree(root, ignore_errors=True)


def test_two_pid_namespaces_keep_each_others_pod_files(release, pod):
    """Finding 1: b's arming (its sweep of the shared /tmp, its multiprocess
    writes) while a serves leaves a's pod directory, a's gauge file and a's
    /metrics whole; the pod directories are private and leave with their makers."""
    drivers, seen, shared = pod
    assert drivers["a"]["ns"] != drivers["b"]["ns"]
    a, a_mp, b = seen["a-default"], seen["a-mp"], seen["b-default"]
    assert a["pid"] > PID_FLOOR and b["pid"] < PID_FLOOR  # a's pids do not exist in b
    assert a["armed_scrape"] == a["scrape"] == [str(a["pid"])], a  # whole before and after b
    assert a["pod_mode"] == a["pod_mode_after"] == "0o700"
    assert f"{a['pid']}-" in " ".join(a["pod_listing"]) and "owner.lock" in a["pod_listing"]
    assert a_mp["armed_scrape"] == [str(a_mp["pid"])]
    assert str(a_mp["pid"]) in a_mp["scrape"], a_mp  # its gauge file outlived b's writes
    assert f"gauge_liveall_{a_mp['pid']}.db" in a_mp["multiproc_listing"]
    # every pod directory of the shim left with its maker; nobody's are still there
    assert [e for e in shared["left"]["tmp"] if e.startswith("kimi-hotfix-pod-0-")
            and e not in ("kimi-hotfix-pod-0-planted", "kimi-hotfix-pod-0-link")] == []
    assert not [e for e in shared["left"]["mp"] if e.startswith("gauge_liveall_3")], shared["left"]


def test_hostile_names_and_planted_directories_lose_only_themselves(release, pod):
    """Findings 2 and 6: names that do not parse (an int too large for os.kill, a
    digit that is not ASCII) and nobody's planted directories and links: the
    exporter of every process works; the directory a variable names is refused
    where it is nobody's; nothing is written through a link or into nobody's
    directory; the planted things are left alone."""
    _, seen, shared = pod
    for name in ("a-default", "b-default", "b-mp", "b-data", "b-clean"):
        assert str(seen[name]["pid"]) in seen[name]["armed_scrape"], (name, seen[name])
        assert "Traceback" not in seen[name]["stderr"], seen[name]["stderr"][-3000:]
    a = seen["a-default"]
    assert a["pod"] != shared["planted"] and "KIMI_HOTFIX_POD_DIR=" in a["stderr"]
    assert "is not a private directory of this user" in a["stderr"]
    assert shared["planted_files"] == ["owner.lock"]  # nobody's link, nothing of ours
    assert shared["victim_text"] == "victim\n"
    for planted in ("kimi-hotfix-pod-99999999999999999999-x", "kimi-hotfix-pod-²-x",
                    "kimi-hotfix-pod-0-planted", "kimi-hotfix-pod-0-link"):
        assert planted in shared["left"]["tmp"], shared["left"]["tmp"]
    for planted in ("gauge_liveall_99999999999999999999.db", "kimi-hotfix-live-1-planted.lock",
                    "kimi-hotfix-live-²-x.lock"):
        assert planted in shared["left"]["mp"], shared["left"]["mp"]


def test_a_pod_directory_removed_and_made_again_by_another_user_is_not_written(release, pod):
    """Finding 2: a /tmp cleaner removed the directory, nobody made it again
    first and put a link where the process's record goes: the process writes
    nothing there (the victim is intact) and says so once."""
    _, seen, shared = pod
    clean = seen["b-clean"]
    assert shared["victim_text"] == "victim\n"
    assert clean["pod_mode_after"] == "0o777"  # nobody's directory now: not ours to use
    assert clean["stderr"].count("metrics: writing this process's states failed: the pod "
                                 "directory") == 1


def test_the_collector_trusts_names_not_contents(release, pod):
    """Finding 7: a record naming live pid 1 whose contents say pid 4242 is served
    as pid 1; a malformed one ([]) is skipped alone; a dead one is removed; an
    old-style 1.json is neither served nor removed."""
    _, seen, _ = pod
    b = seen["b-default"]
    assert b["scrape"] == sorted([str(b["pid"]), "1"]), b
    assert "4242" not in b["scrape_text"]
    assert 'pid="1",python="python -O",role="EngineCore"' in b["scrape_text"], b["scrape_text"]
    assert "1.json" in b["pod_listing"] and not any(e.startswith("99999-") for e in b["pod_listing"])
    assert any(e.startswith("2-") for e in b["pod_listing"])  # malformed: skipped, kept


def test_an_operators_data_directory_is_never_swept(release, pod):
    """Finding 3: KIMI_HOTFIX_POD_DIR pointed at an existing data directory."""
    _, seen, shared = pod
    assert seen["b-data"]["pod"] == shared["data"]
    assert "20240101.json" in shared["left"]["data"]


def test_a_vllm_source_changed_after_import_is_never_compiled_under_O(release, pod):
    """Finding 9: parallel_state.py changed after vLLM imported it (its assert now
    runs code), the shim armed late by vLLM's plugin loader: under -O the running
    getter has no assert to compare the changed one with, and the file changed
    after the process started (issue 36: Python's own rule decides what ran),
    so -O parity keeps that module's -O code and names it (``partial``); the
    changed code never runs."""
    _, seen, _ = pod
    case = seen["b-source"]
    assert case["file"].endswith("overlay/vllm/distributed/parallel_state.py"), case
    assert case["late_state"].startswith("applied (partial: "), case
    assert ("vllm.distributed.parallel_state (" in case["late_state"]
            and "changed after this process started" in case["late_state"]), case
    assert case["pwned"] is None and case["late_call"] == "None", case  # vLLM's own, under -O


def test_an_environment_value_never_forges_a_log_line(release, pod):
    """Finding 8: KIMI_HOTFIX set to a value holding a newline and a whole summary
    line: the shim is off (it fails closed) and every process line says so, with
    the value escaped (no line of its own, no `|` to split a state on)."""
    _, seen, _ = pod
    env = seen["b-env"]
    lines = env["stderr"].splitlines()
    assert not any(line.startswith(FORGED[:40]) for line in lines), env["stderr"]
    summaries = [line for line in lines if "INFO kimi-hotfix 0.1.0 (vllm" in line]
    assert summaries and all("disabled (KIMI_HOTFIX=0\\x0a2026-01-01" in line and
                             line.count(" | ") == len(PATCHES) - 1 for line in summaries), summaries
