"""tritonserver's log as the supervisor reads it: the line a crashing server writes before it
spends minutes symbolizing a stack trace (switchboard.ops.supervisor restarts it at once)."""

from __future__ import annotations

import re
from pathlib import Path

# What tritonserver writes as it crashes (src/triton_signal.cc's ErrorSignalHandler, SIGABRT or
# SIGSEGV) before it symbolizes a stack trace, which can take minutes before the process ends.
FATAL_SIGNAL = re.compile(rb"Signal \((6|11)\) received\.")


class CrashLog:
    """tritonserver's log, read for the line it writes as it crashes: a server that aborted
    (2.51's race when a stub is killed) answers nothing yet runs on while it writes its stack
    trace, so a reload sent to it waits out its whole timeout."""

    def __init__(self, path: Path):
        self.path, self.offset, self.tail = path, 0, b""

    def mark(self) -> None:
        """Only what the log gets from now on counts (call as a server starts)."""
        try:
            self.offset = self.path.stat().st_size
        except OSError:
            self.offset = 0
        self.tail = b""

    def crashed(self) -> str | None:
        """The crash line, once the log has one since ``mark``; None otherwise."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                new = f.read()
        except OSError:
            return None
        self.offset += len(new)
        text = self.tail + new
        self.tail = text[-64:]  # a line split across two reads
        found = FATAL_SIGNAL.search(text)
        if found is None:
            return None
        self.tail = text[found.end() :][-64:]  # reported once
        return f"tritonserver crashed ({found.group().decode()} in {self.path.name})"
