"""What the tools say about capture_workspace (kimi_hotfix.tools.about): its upstream
fix, the releases it concerns, the symptoms, how it decides, its probe."""

from kimi_hotfix.tools.about import About

ABOUT = About(
    upstream="PR #55774",
    summary="RecoverSSM: no mixed CUDA graph above max_num_seqs * (1 + k) tokens",
    decides=("RecoverSSM present (CacheConfig.use_kda_recoverssm) and the AST of "
             "_init_candidates: no if-statement bounds mixed captures by it"),
    symptoms=("ValueError: KDA RecoverSSM speculative decode query length exceeds its "
              "activation capacity",
              "at startup, while capturing CUDA graphs (--use-replayssm)"),
    fixed_in="0.30.0",
    affects_from="0.29.0",
    probe_title=("capture plan for 48 seqs, k=8, Hopper capture sizes (to 512): "
                 "largest mixed graph vs RecoverSSM workspace"),
)
