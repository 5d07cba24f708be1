"""sitecustomize.py's functions in-process, loaded under its own name with its
start-up guard already taken (so loading it changes nothing here): the
trigger asks the finders after it and wraps only a real loader, and lets go
of its search flag; ``inactive`` writes the one line and says whether strict
mode asks to raise; ``retire`` takes the trigger off sys.meta_path by a new
list. Python's start-up, chaining and arming: test_bootstrap.py, in children."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

import pytest

from helpers import REPO, VLLM_COMPLETE


@pytest.fixture
def boot(monkeypatch):
    monkeypatch.setitem(sys.modules, "kimi_hotfix_sitecustomize", object())  # the guard: taken
    spec = importlib.util.spec_from_file_location("sitecustomize", REPO / "sitecustomize.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "sitecustomize", module)
    spec.loader.exec_module(module)
    assert not any(type(f).__name__ == "VllmImportTrigger" for f in sys.meta_path)
    return module


def test_the_trigger_wraps_vllms_loader_and_lets_go_of_its_search(boot, monkeypatch):
    monkeypatch.syspath_prepend(str(VLLM_COMPLETE))
    trigger = boot.VllmImportTrigger()
    assert trigger.find_spec("vllm_other") is None and trigger.find_spec("vllm.config") is None
    spec = trigger.find_spec("vllm")
    assert spec.name == "vllm" and isinstance(spec.loader, boot.ArmingLoader)
    assert isinstance(spec.loader.loader, importlib.machinery.SourceFileLoader)
    assert spec.loader.is_package("vllm") is True  # everything else: the real loader's
    assert boot.SEARCHING is False
    again = trigger.find_spec("vllm")  # asked again (find_spec, then the import): found again
    assert again is not None and isinstance(again.loader, boot.ArmingLoader)
    monkeypatch.setattr(boot, "ARMED", True)
    assert trigger.find_spec("vllm") is None  # armed: nothing to do


def test_no_vllm_anywhere_finds_nothing(boot):
    assert boot.find_vllm(boot.VllmImportTrigger(), None, None) is None and boot.SEARCHING is False


@pytest.mark.parametrize("value, strict", [("1", True), ("on", True), (" TRUE ", True), ("yes", True),
                                           ("", False), ("0", False), ("2", False), ("strict", False)])
def test_inactive_logs_one_line_and_says_whether_to_raise(boot, monkeypatch, capsys, value, strict):
    monkeypatch.setenv("KIMI_HOTFIX_STRICT", value)
    monkeypatch.delenv("KIMI_HOTFIX_LOG_LEVEL", raising=False)
    assert boot.inactive(ImportError("no wrapt")) is strict
    (line,) = capsys.readouterr().err.splitlines()
    assert line.endswith(" WARNING kimi-hotfix inactive: cannot load kimi_hotfix.runtime.core "
                         "(ImportError('no wrapt')); vLLM runs unpatched")
    assert " kimi-hotfix[" in line


@pytest.mark.parametrize("level, shown", [("error", False), ("CRITICAL", False), ("warning", True),
                                          ("debug", True)])
def test_inactive_is_quiet_only_above_warning(boot, monkeypatch, capsys, level, shown):
    monkeypatch.setenv("KIMI_HOTFIX_LOG_LEVEL", level)
    monkeypatch.delenv("KIMI_HOTFIX_STRICT", raising=False)
    assert boot.inactive(ValueError("x")) is False
    assert bool(capsys.readouterr().err) is shown


def test_retire_takes_the_trigger_off_by_a_new_list(boot, monkeypatch):
    trigger = boot.VllmImportTrigger()
    before = [trigger, *sys.meta_path]
    monkeypatch.setattr(sys, "meta_path", before)
    boot.retire()
    assert sys.meta_path == before[1:] and sys.meta_path is not before
    assert before[0] is trigger  # the old list, which another thread may walk, is untouched
    same = sys.meta_path
    boot.retire()
    assert sys.meta_path is same  # nothing to take off: no new list


def write_site(directory, body):
    directory.mkdir()
    (directory / "sitecustomize.py").write_text(body)
    return str(directory / "sitecustomize.py")


def test_chain_runs_the_next_sitecustomize_after_this_directory_only(boot, monkeypatch, tmp_path):
    write_site(tmp_path / "before", "import os\nos.environ['KIMI_TEST_RAN'] += 'before,'\n")
    after = write_site(tmp_path / "after", "import os\nos.environ['KIMI_TEST_RAN'] += 'after,'\n")
    write_site(tmp_path / "later", "import os\nos.environ['KIMI_TEST_RAN'] += 'later,'\n")
    monkeypatch.setenv("KIMI_TEST_RAN", "")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "before"), str(REPO), str(tmp_path / "after"),
                                      str(tmp_path / "later")])
    boot.chain()
    # an entry before this one (a launcher's, which chained to this bootstrap) is not run again
    assert os.environ["KIMI_TEST_RAN"] == "after," and boot.CHAINED == [after]
    assert sys.modules["sitecustomize"].__file__ == after  # `import sitecustomize` names theirs


def test_a_sitecustomize_that_raises_leaves_the_name_to_this_bootstrap(boot, monkeypatch, tmp_path):
    write_site(tmp_path / "broken", "raise RuntimeError('container sitecustomize failed')\n")
    monkeypatch.setattr(sys, "path", [str(REPO), str(tmp_path / "broken")])
    with pytest.raises(RuntimeError, match="container sitecustomize failed"):
        boot.chain()  # site.py reports it as it would without the shim
    assert sys.modules["sitecustomize"] is sys.modules["kimi_hotfix_sitecustomize"]
    assert boot.CHAINED == []
