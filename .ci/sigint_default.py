"""Run a command with SIGINT's default disposition: ``python .ci/sigint_default.py CMD ...``.

``.ci/run`` starts some suites in the background, where a non-interactive shell
starts them with SIGINT ignored, and an ignored signal stays ignored in every
process they start: the tests that interrupt a CLI or a worker with SIGINT
need Python's own handler there, as in a terminal.
"""

from __future__ import annotations

import os
import signal
import sys

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python .ci/sigint_default.py COMMAND [ARGS ...]")
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.execvp(sys.argv[1], sys.argv[1:])
