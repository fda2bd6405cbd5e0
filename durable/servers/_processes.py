"""What every server process here shares: stopping it by its pid, and its log's tail for
an error message."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from pathlib import Path

__all__ = ["kill_now", "log_tail", "stop_gently"]


def stop_gently(
    proc: subprocess.Popen[bytes] | None, timeout: float, sig: int = signal.SIGTERM
) -> None:
    """Send ``sig`` to ``proc`` (if it still runs) and wait; SIGKILL it after ``timeout``
    seconds."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kill_now(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL ``proc`` at once (a crash) and reap it."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


def log_tail(path: Path, lines: int) -> str:
    """The last ``lines`` lines of the log at ``path`` on one line, or "(no log)"."""
    with contextlib.suppress(OSError):
        text = path.read_text(errors="replace")
        return " | ".join(text.splitlines()[-lines:])
    return "(no log)"
