"""Lower the CPU priority of one thread: how priority 2's work yields the cores to priority 1's.

Linux gives every thread its own nice value, and raising it (lowering the priority) needs no
privilege, so this works in an unprivileged container too; it cannot be undone without
CAP_SYS_NICE, which is why the lowered work runs on threads of its own (the engine's normal
lane, ``chat``'s FAQ answer workers) rather than lowering and restoring a shared thread.
Threads a lowered thread starts inherit its nice value.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)


def lower_this_thread(increment: int, what: str) -> None:
    """Lower the calling thread's priority by ``increment`` nice levels, at most to 19.
    ``what`` names the thread in the warning logged where that is not possible."""
    if increment <= 0:
        return
    if not sys.platform.startswith("linux"):
        log.warning("per-thread nice needs Linux; %s runs at the process's priority", what)
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + increment, 19))
    except OSError as e:
        log.warning("could not lower %s by %d nice levels: %s", what, increment, e)
