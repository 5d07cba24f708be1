"""What the tools say about kv_spec_merge (kimi_hotfix.tools.about): its upstream
fix, the releases it concerns, the symptoms, how it decides, its probe."""

from kimi_hotfix.tools.about import About

ABOUT = About(
    upstream="PR #55234 (issue #54649)",
    summary="the draft capability merges with any(): target and draft share one MLA group",
    decides="a behaviour probe: MLAAttentionSpec.merge(target, draft) keeps the capability",
    symptoms=(
        ("illegal memory access in CUDA-graph replay (DSpark/DCP draft, python -O)",
         "the DSpark draft's MLA layers in their own KV-cache group (plain Python, or -O with "
         "its asserts restored)"),
    ),
    fixed_in="0.30.0",
    affects_from="0.29.0",
    probe_title="vLLM's planner groups Kimi-K3 MLA target + DSpark draft + KDA layers",
    wraps_note="the merge of every spec class that carries the draft capability",
)
