"""A process that arms and then execs keeps its pod directory (issue 36 item 2).

A launcher imports vLLM in its own process (the shim arms, makes the pod
directory and holds the lock on its ``owner.lock``) and then ``exec``s the
server: the same pid, a new image, close-on-exec descriptors gone. Here, for
real: a child arms on the stand-in vLLM, execs a new interpreter that arms
again, and, while that image lives, a second process of the same user arms
(it sweeps the pod directories whose lock nobody holds). The exec'd image
must still have its directory and its record, own it (it removes it at exit),
and log no warning; a process that merely inherited the lock's descriptor
(started without closing it) must not take the ownership, and closes it.
Stand-in vLLM (shim mechanics; the real vLLM and pid namespaces:
tests/real/test_hostile.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from helpers import REPO, VLLM_COMPLETE, hermetic_env, warning_lines

TARGET = "import vllm.v1.kv_cache_interface"  # a patch's target: the shim arms, the exporter installs
BEFORE = f"""
import os, sys
{TARGET}
from kimi_hotfix.runtime import metrics
print("before", os.getpid(), metrics._pod, flush=True)
os.execv(sys.executable, [sys.executable, "-c", *sys.argv[1:]])
"""
AFTER = f"""
import json, os, sys, time
{TARGET}
from kimi_hotfix.runtime import metrics
work = sys.argv[1]
pod = metrics._pod
out = {{"pid": os.getpid(), "pod": pod, "owner": metrics._owner == os.getpid(),
        "lock_fd": metrics._lock_fd is not None}}
open(os.path.join(work, "ready"), "w").close()
deadline = time.monotonic() + 120
while not os.path.exists(os.path.join(work, "go")) and time.monotonic() < deadline:
    time.sleep(0.05)
out["survived"] = os.path.isdir(pod)
out["records"] = sorted(n for n in os.listdir(pod) if n.endswith(".json")) if out["survived"] else []
if sys.argv[2] == "child":  # a process that inherits the lock's descriptor without closing it
    import subprocess
    code = ("import os\\n{TARGET}\\nfrom kimi_hotfix.runtime import metrics\\n"
            "print(metrics._owner == os.getpid(), metrics._lock_fd is not None)")
    proc = subprocess.run([sys.executable, "-c", code], close_fds=False, capture_output=True,
                          text=True, timeout=120)
    out["inheritor"] = proc.stdout.split()
print("KIMI_JSON:" + json.dumps(out), flush=True)
"""


def run(tmp_path, mode):
    work = tmp_path / "work"
    work.mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = hermetic_env(TMPDIR=str(tmp))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(VLLM_COMPLETE)])
    first = subprocess.Popen([sys.executable, "-c", BEFORE, AFTER, str(work), mode], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (work / "ready").exists():
            if first.poll() is not None or time.monotonic() > deadline:
                out, err = first.communicate(timeout=60)
                raise AssertionError(f"the exec'd image never got ready (exit {first.returncode})"
                                     f"\n{out}\n{err}")
            time.sleep(0.05)
        # a second process of the same user arms now: it sweeps unowned pod directories
        second = subprocess.run([sys.executable, "-c", TARGET], env=env, capture_output=True,
                                text=True, timeout=120)
        assert second.returncode == 0, second.stderr
        (work / "go").touch()
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err
    before = next(line.split() for line in out.splitlines() if line.startswith("before "))
    result = json.loads(next(line for line in out.splitlines()
                             if line.startswith("KIMI_JSON:"))[len("KIMI_JSON:"):])
    return before, result, err, tmp


def test_an_execd_image_keeps_and_owns_its_pod_directory(tmp_path):
    before, after, err, tmp = run(tmp_path, "plain")
    assert int(before[1]) == after["pid"]  # the same process, after exec
    assert after["pod"] == before[2]  # the inherited KIMI_HOTFIX_POD_DIR
    assert after["survived"] is True, "the second process swept the exec'd image's directory"
    assert after["owner"] is True and after["lock_fd"] is True
    assert after["records"] == [n for n in after["records"] if n.startswith(f"{after['pid']}-")]
    assert len(after["records"]) == 1
    assert warning_lines(err) == []
    assert not os.path.exists(after["pod"])  # the owner removed it at exit
    assert [n for n in os.listdir(tmp) if n.startswith("kimi-hotfix-pod-")] == []


def test_a_process_that_inherits_the_lock_never_owns_the_directory(tmp_path):
    _, after, err, _ = run(tmp_path, "child")
    assert after["owner"] is True and after["survived"] is True
    assert after["inheritor"] == ["False", "False"]  # not the owner; its copy closed
    assert warning_lines(err) == []
    assert not os.path.exists(after["pod"])
