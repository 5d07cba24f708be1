"""What the tools say about kda_overlong_rows (kimi_hotfix.tools.about): its upstream
fix, the releases it concerns, the symptoms, how it decides, its probe."""

from kimi_hotfix.tools.about import About

ABOUT = About(
    upstream="PR #55774 follow-up",
    summary="RecoverSSM: rows longer than num_spec + 1 take the non-speculative path",
    decides=("the AST of build: it reads self.use_recoverssm and no mask ANDed with "
             "'<= self.num_spec + 1' selects rows (indexes something)"),
    symptoms=("ValueError: KDA RecoverSSM speculative decode query length exceeds its "
              "activation capacity",
              "at startup, in eager dummy runs (adaptive verification profiling); on "
              "0.30.0 too"),
    fixed_in="0.31.0",
    affects_from="0.29.0",
    probe_title=("KDA build with RecoverSSM, k=8: an eager 48 x 10-token batch and a step "
                 "with a 12-token row"),
)
