"""What a long command prints: a line or two per step on the terminal, the rest in a log file.

The build steps run libraries that write to stdout and stderr on their own, from Python and from
C++ (PyTorch's ONNX exporter, ONNX Runtime's quantizer, transformers), hundreds of lines of them
on a fresh ``make serve``. Inside ``step()`` file descriptors 1 and 2 point at the step's log
file, so all of that lands there, warnings and tracebacks included; the step's own lines and
progress bars go to the terminal through ``Console``. When the step fails, the terminal gets
the error, the end of the log and the log's path.

``SWITCHBOARD_VERBOSE=1`` leaves stdout and stderr alone (everything on the terminal).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from switchboard import paths

LOG_DIR = paths.LOGS
TAIL_LINES = 40


class Console:
    """The terminal a step reports to while its stdout and stderr go to its log."""

    def __init__(self, name: str, stream, log_path: Path | None):
        self.name, self.stream, self.log_path = name, stream, log_path
        self._t0 = time.monotonic()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def line(self, text: str) -> None:
        """One line on the terminal (and in the log, where it dates what follows)."""
        if self.stream is not None:
            print(f"[{self.name}] {text}", file=self.stream, flush=True)
        if self.log_path is not None or self.stream is None:
            logging.getLogger("switchboard.console").info("[%s] %s", self.name, text)

    def bar(self, total: int | None = None, desc: str = "", unit: str = "it", **kwargs) -> tqdm:
        """A progress bar on the terminal; none when the terminal is a file or a pipe (CI logs
        keep the step's lines only)."""
        return tqdm(
            total=total,
            desc=f"[{self.name}] {desc}",
            unit=unit,
            file=self.stream,
            leave=False,
            disable=not _isatty(self.stream),
            dynamic_ncols=True,
            **kwargs,
        )


def detached(name: str) -> Console:
    """A console for code run as a library (tests, notebooks): lines go to logging, no bars."""
    return Console(name, None, None)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def verbose() -> bool:
    return os.environ.get("SWITCHBOARD_VERBOSE", "") not in ("", "0", "false")


def _shown(path: Path) -> Path:
    """``path`` relative to the working directory when it lies under it (as a person types it)."""
    try:
        return path.resolve().relative_to(Path.cwd())
    except ValueError:
        return path


@contextlib.contextmanager
def step(name: str, log_path: Path | None = None) -> Iterator[Console]:
    """Run a step with its stdout and stderr (file descriptors 1 and 2, so C++ output too) in
    ``log_path`` (default ``build/logs/<name>.log``, rewritten each run).

    A failure prints the last lines of the log and its path on the terminal and raises
    ``SystemExit`` with the error, which Python prints last (``SystemExit(0)`` is success).
    """
    if verbose():
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        yield Console(name, sys.stdout, None)
        return
    log_path = Path(log_path or LOG_DIR / f"{name}.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(saved[0]), "w", buffering=1, encoding="utf-8", errors="replace")
    log = open(log_path, "w", buffering=1, encoding="utf-8", errors="replace")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    saved_streams = sys.stdout, sys.stderr  # not always fd 1 and 2 (pytest replaces them)
    sys.stdout = sys.stderr = log
    root, handler = logging.getLogger(), logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root.addHandler(handler)
    saved_level = root.level
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    console = Console(name, terminal, _shown(log_path))
    failure: str | int | None = None
    try:
        yield console
    except SystemExit as e:
        if e.code in (None, 0):
            raise
        failure = e.code
    except KeyboardInterrupt:
        failure = "interrupted"
    except BaseException as e:  # noqa: BLE001 - every failure is reported the same way
        traceback.print_exc()
        failure = f"{type(e).__name__}: {e}"
    finally:
        log.flush()
        sys.stdout, sys.stderr = saved_streams
        logging.captureWarnings(False)
        root.removeHandler(handler)
        root.setLevel(saved_level)
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        if failure is not None:
            tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-TAIL_LINES:]
            print(f"FAILED: {failure}", file=log)
            print("\n".join(tail), file=terminal)
            print(f"[{name}] full log: {_shown(log_path)}", file=terminal, flush=True)
        log.close()
        terminal.close()
    if failure is not None:
        # The error itself is the last line on the terminal (printed by Python on exit).
        raise SystemExit(failure)
