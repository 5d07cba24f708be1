"""The patch registry: one module (or subpackage) per patch, named here.

Each defines ``PATCH``, an instance of a ``kimi_hotfix.base.Patch`` subclass,
and its header says why it exists, what it changes, the upstream fix and the
vLLM release that carries it, and how the patch decides it is no longer
needed. Importing them imports neither vLLM nor wrapt: that happens in
``check``/``apply``/``probe``, after vLLM loaded them. Adding a patch is its
module plus one name below (DEVELOPING.md); the README's table is generated
from the patches' metadata (scripts/docs).
"""

PATCH_MODULES = ("kv_spec_merge", "capture_workspace", "kda_overlong_rows", "inner_dp_group",
                 "config_checks")
