"""`python -m ckpteval.deploy`: the entry point's name before the builtin server moved to `ckpteval.server`.

Kept for job scripts written before then: resuming such an invocation runs its job script as it was written.
New job scripts run `python -m ckpteval.server`, which this forwards to.
"""

from __future__ import annotations

import sys

from ckpteval.server.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
