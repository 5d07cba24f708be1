"""The decisions read code structure, never text a comment or a string holds.

On the released sources themselves (read from each venv's vLLM, nothing
imported) and on variants of them: one that only *mentions* what the upstream
fix does (a comment, a docstring, a string), one that *checks and raises*
where the fix routes or bounds, and one with the fix's own form written in.
Only the fix's form may read "fixed"; everything else stays "needed", the
safe side. (That the decisions run on the real modules inside the shim is in
test_recoverssm.py and test_check.py.)
"""

from __future__ import annotations

import ast
import textwrap

import pytest

from kimi_hotfix.patches import capture_workspace, kda_overlong_rows

from harness import venv_python, vllm_location

CAPTURE = ("vllm/v1/worker/gpu/cudagraph_utils.py", "CudaGraphManager", "_init_candidates")
KDA = ("vllm/models/kimi_k3/nvidia/kda_metadata.py", "KimiK3KDAMetadataBuilder", "build")


def method(release, where, insert=""):
    """The parsed method of ``release``'s file, ``insert`` (code, indented as a
    body statement) placed before its first statement."""
    path, cls, name = where
    text = (vllm_location(venv_python(release)) / path).read_text()
    (node,) = [f for c in ast.parse(text).body if isinstance(c, ast.ClassDef) and c.name == cls
               for f in c.body if isinstance(f, ast.FunctionDef) and f.name == name]
    lines = text.splitlines(keepends=True)
    first = node.body[0].lineno - 1
    if isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant):
        first = node.body[0].end_lineno  # after the docstring
    body_indent = lines[node.body[0].lineno - 1][:node.body[0].col_offset]
    added = textwrap.indent(textwrap.dedent(insert), body_indent)
    source = "".join(lines[node.lineno - 1:first]) + added + "".join(lines[first:node.end_lineno])
    return ast.parse(textwrap.dedent(source))


CAPTURE_MENTIONS = '''
# RecoverSSM: use_kda_recoverssm bounds mixed captures, num_tokens <= max_decode_tokens
"""use_kda_recoverssm: if num_tokens <= max_decode_tokens plan the graph"""
note = "self.vllm_config.cache_config.use_kda_recoverssm and num_tokens <= max_decode_tokens"
'''
CAPTURE_RAISES = '''
if self.vllm_config.cache_config.use_kda_recoverssm and not (
        max(self.compilation_config.cudagraph_capture_sizes)
        <= self.max_num_reqs * self.decode_query_len):
    raise ValueError("capture sizes exceed the RecoverSSM workspace")
'''
CAPTURE_LOGS = '''
if self.vllm_config.cache_config.use_kda_recoverssm and (
        max(self.compilation_config.cudagraph_capture_sizes)
        <= self.max_num_reqs * self.decode_query_len):
    logger.debug("capture sizes fit the RecoverSSM workspace: %s",
                 max(self.compilation_config.cudagraph_capture_sizes))
'''
CAPTURE_FILTERS = '''
if self.vllm_config.cache_config.use_kda_recoverssm:
    limit = self.max_num_reqs * self.decode_query_len
    self.compilation_config.cudagraph_capture_sizes = [
        s for s in self.compilation_config.cudagraph_capture_sizes if s <= limit]
'''


@pytest.mark.releases("0.29.0")
def test_capture_decision_reads_the_bound_not_the_name(release):
    bounds = capture_workspace.bounds_in
    assert bounds(method(release, CAPTURE)) is False
    assert bounds(method("0.30.0", CAPTURE)) is True  # the upstream fix (PR #55774)
    assert bounds(method("0.33.0", CAPTURE)) is True
    assert bounds(method(release, CAPTURE, CAPTURE_MENTIONS)) is False
    assert bounds(method(release, CAPTURE, CAPTURE_RAISES)) is False
    assert bounds(method(release, CAPTURE, CAPTURE_LOGS)) is False  # issue 20 item 9
    assert bounds(method(release, CAPTURE, CAPTURE_FILTERS)) is True


KDA_MENTIONS = '''
# 0.31 routes them: spec_sequence_masks_cpu &= query_lens <= self.num_spec + 1
"""spec_sequence_masks_cpu &= (query_start_loc_cpu.diff() <= self.num_spec + 1)"""
'''
KDA_RAISES = '''
if self.use_recoverssm and not bool(
        (common_attn_metadata.query_start_loc_cpu.diff() <= self.num_spec + 1).all()):
    raise ValueError("KDA RecoverSSM row over capacity")
'''
KDA_REDUCES = '''
fits = (common_attn_metadata.query_start_loc_cpu.diff() <= self.num_spec + 1).all()
if self.use_recoverssm and not fits:
    raise ValueError("KDA RecoverSSM row over capacity")
'''
KDA_ROUTES = '''
rows = common_attn_metadata.query_start_loc_cpu.diff()
keep = common_attn_metadata.is_prefilling.logical_not()
keep = keep & (rows <= self.num_spec + 1)
spec_rows = rows[keep]
'''
KDA_METRIC = '''
rows = common_attn_metadata.query_start_loc_cpu.diff()
fits = common_attn_metadata.is_prefilling.logical_not() & (rows <= self.num_spec + 1)
self.kda_stats["rows_within_capacity"] = int(fits.sum())
'''


@pytest.mark.releases("0.30.0")
def test_kda_decision_reads_the_routing_not_the_text(release):
    structure = kda_overlong_rows.structure_of
    assert structure(method(release, KDA)) == (True, False)
    assert structure(method("0.33.0", KDA)) == (True, True)  # routes since 0.31.0
    assert structure(method("0.29.0", KDA)) == (True, False)
    assert structure(method(release, KDA, KDA_MENTIONS)) == (True, False)
    assert structure(method(release, KDA, KDA_RAISES)) == (True, False)
    assert structure(method(release, KDA, KDA_REDUCES)) == (True, False)
    assert structure(method(release, KDA, KDA_ROUTES)) == (True, True)
    # issue 20 item 9: a capacity mask computed for a metric routes nothing
    assert structure(method(release, KDA, KDA_METRIC)) == (True, False)


@pytest.mark.releases("0.28.0")
def test_no_recoverssm_path_reads_not_affected(release):
    """0.28.0's KDA builder has no RecoverSSM path: the attribute is not read
    anywhere in its code (a mention in text would not count either)."""
    path, *_ = KDA
    if not (vllm_location(venv_python(release)) / path).exists():
        pytest.fail(f"{release} has no {path}: the test's premise is wrong")
    assert kda_overlong_rows.structure_of(method(release, KDA))[0] is False
    assert kda_overlong_rows.structure_of(
        method(release, KDA, "# self.use_recoverssm\nnote = 'self.use_recoverssm'\n"))[0] is False
