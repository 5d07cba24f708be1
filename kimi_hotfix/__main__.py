"""``python -m kimi_hotfix status|check [--json]``: see kimi_hotfix.cli.

Also runs as ``python /path/to/shim/kimi_hotfix status``, which works under
``-I``/``-E`` too, where PYTHONPATH (and so ``-m``) cannot find the package.
"""

import os
import sys

if not __package__:  # run as a directory: make the package importable
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    sys.path.insert(0, os.path.dirname(here))

from kimi_hotfix.cli import main  # noqa: E402

sys.exit(main())
