"""A case function for ``tools/fuzz_runner.py``'s tests, in a module of its own: each
worker process imports it, and the test module's imports would cost seconds a worker."""

from __future__ import annotations

import os
import signal
import time


def stuck_or_dead(number: int) -> int:
    """Case 2 hangs where no signal handler runs, case 4 kills its worker; the others
    answer ``number * 10``."""
    if number == 2:
        time.sleep(600)
    if number == 4:
        os.kill(os.getpid(), signal.SIGKILL)
    return number * 10
