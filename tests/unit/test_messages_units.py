"""kimi_hotfix.runtime.messages in-process: the process role in JSON log lines (vLLM's
``PREFIX::NAME`` title, read from /proc/PID/cmdline, else "main"). The JSON
format end to end: test_lifecycle.py, in child interpreters."""

from __future__ import annotations

import subprocess
import time

import pytest

from kimi_hotfix.runtime import identity


def test_the_main_process_without_a_title_is_main():
    assert identity.role() == "main"  # pytest's process: MainProcess, a path in its title


@pytest.mark.parametrize("title, role", [
    ("VLLM::EngineCore", "EngineCore"),
    ("VLLM::Worker_TP0", "Worker_TP0"),
    ("/usr/bin/python::x", ""),  # a path, not a title
    ("VLLM::a b", ""),  # a command line with arguments
    ("::Name", ""),
    ("VLLM::", ""),
    ("python3", ""),
])
def test_title_role_reads_vllms_process_title(title, role):
    proc = subprocess.Popen([title, "60"], executable="/bin/sleep")  # argv[0] is the title
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # until the exec has set its command line
            with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
                if f.read().split(b"\0", 1)[0] == title.encode():
                    break
            time.sleep(0.01)
        assert identity.title_role(proc.pid) == role
    finally:
        proc.kill()
        proc.wait(30)


def test_title_role_of_no_such_process_is_empty():
    assert identity.title_role(2 ** 22 + 17) == ""  # above any pid_max: nothing to read
