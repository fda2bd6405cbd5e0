"""Start and stop a private RabbitMQ node on free loopback ports.

For tests of the AMQP handoff. The node has its own name, AMQP and distribution ports,
data, log and config under a temporary directory, its own Erlang cookie (``HOME`` is
that directory) and its own ``epmd`` on a free port, so a RabbitMQ the machine already
runs (and its epmd) is never touched. ``rabbitmq-server`` runs with
``RUNNING_UNDER_SYSTEMD`` set, so the script execs the Erlang VM: the pid held is the
node's, and it is stopped by that pid (SIGTERM is a clean shutdown), and epmd by its
own. A node killed with :meth:`RabbitServer.kill` restarts on its data with
:meth:`RabbitServer.start`.

The script is found in this order:

1. ``$TICKWHEEL_RABBITMQ_SERVER``;
2. Debian's ``/usr/lib/rabbitmq/bin/rabbitmq-server`` (the script itself: the
   ``/usr/sbin`` wrapper switches to the ``rabbitmq`` user when run as root);
3. ``rabbitmq-server`` on ``PATH``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from ._processes import kill_now, log_tail, stop_gently
from ._redis import free_port

__all__ = ["RabbitServer", "RabbitServerError", "find_rabbitmq_server"]

# A node boots in ~4 s here; a loaded machine or a restart that recovers its queues
# may take several times that.
_START_TIMEOUT = 60.0
# How long SIGTERM may take before SIGKILL.
_STOP_TIMEOUT = 20.0
_DEBIAN = "/usr/lib/rabbitmq/bin/rabbitmq-server"


class RabbitServerError(RuntimeError):
    """A RabbitMQ node could not be found or started. Permanent for this environment."""


def find_rabbitmq_server() -> str:
    """Return the path of a rabbitmq-server script.

    Raises:
        RabbitServerError: if none of ``$TICKWHEEL_RABBITMQ_SERVER``, Debian's location
            and ``PATH`` provides one.
    """
    env = os.environ.get("TICKWHEEL_RABBITMQ_SERVER")
    if env:
        if not os.access(env, os.X_OK):
            raise RabbitServerError(f"TICKWHEEL_RABBITMQ_SERVER={env!r} is not an executable file")
        return env
    if os.access(_DEBIAN, os.X_OK):
        return _DEBIAN
    found = shutil.which("rabbitmq-server")
    if found:
        return found
    raise RabbitServerError(
        "no rabbitmq-server found: install it (Debian: rabbitmq-server) or set"
        " TICKWHEEL_RABBITMQ_SERVER"
    )


def _find_epmd() -> str:
    found = shutil.which("epmd")
    if found:
        return found
    for path in sorted(Path("/usr/lib/erlang").glob("erts-*/bin/epmd")):
        return str(path)
    raise RabbitServerError("no epmd found (Erlang's port mapper, shipped with erlang-base)")


class RabbitServer:
    """One RabbitMQ node, a child process on 127.0.0.1, with its own epmd.

    Args:
        data_dir: where the node keeps everything; a fresh temporary one when None
            (removed by :meth:`stop`), kept across :meth:`kill` and :meth:`start`.
        binary: the rabbitmq-server script; :func:`find_rabbitmq_server` when None.
    """

    def __init__(
        self, *, data_dir: str | os.PathLike[str] | None = None, binary: str | None = None
    ) -> None:
        self.binary = binary or find_rabbitmq_server()
        self._own_dir = data_dir is None
        self.data_dir = (
            Path(data_dir)
            if data_dir is not None
            else Path(tempfile.mkdtemp(prefix="tickwheel-rabbitmq-"))
        )
        self.port = free_port()  # AMQP
        self.dist_port = free_port()  # Erlang distribution
        self.epmd_port = free_port()
        self.node = f"tickwheel{self.port}@localhost"
        self.process: subprocess.Popen[bytes] | None = None
        self.epmd: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The ``amqp://`` URL of this node (the default guest user, vhost ``/``)."""
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    @property
    def pid(self) -> int | None:
        """The node's pid (the Erlang VM's) while it runs."""
        return self.process.pid if self.process is not None else None

    def environment(self) -> dict[str, str]:
        """The environment the node is started with."""
        d = self.data_dir
        env = dict(os.environ)
        env.update(
            HOME=str(d / "home"),  # the Erlang cookie
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            ERL_EPMD_PORT=str(self.epmd_port),
            ERL_EPMD_ADDRESS="127.0.0.1",
            RABBITMQ_MNESIA_BASE=str(d / "mnesia"),
            RABBITMQ_LOG_BASE=str(d / "log"),
            RABBITMQ_CONFIG_FILE=str(d / "rabbitmq"),  # .conf is added
            RABBITMQ_ADVANCED_CONFIG_FILE=str(d / "advanced.config"),
            RABBITMQ_CONF_ENV_FILE=str(d / "rabbitmq-env.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(d / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(d / "rabbitmq.pid"),
            RUNNING_UNDER_SYSTEMD="1",  # the script execs the VM: our pid is the node's
        )
        return env

    def start(self) -> RabbitServer:
        """Start epmd and the node, and wait until it speaks AMQP on its port.

        Raises:
            RabbitServerError: if it exits or does not answer within the start timeout.
        """
        if self.process is not None and self.process.poll() is None:
            raise RabbitServerError(f"node {self.node} is already running")
        d = self.data_dir
        (d / "home").mkdir(parents=True, exist_ok=True)
        (d / "rabbitmq.conf").write_text("loopback_users = none\n")
        (d / "enabled_plugins").write_text("[].\n")
        env = self.environment()
        if self.epmd is None or self.epmd.poll() is not None:
            self.epmd = subprocess.Popen(
                [_find_epmd(), "-port", str(self.epmd_port), "-address", "127.0.0.1"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        with open(d / "out.log", "ab") as out:
            self.process = subprocess.Popen(
                [self.binary],
                env=env,
                cwd=d,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RabbitServerError(
                    f"rabbitmq-server exited with {self.process.returncode}: {self._log_tail()}"
                )
            if self._ready():
                return self
            time.sleep(0.1)
        self.kill()
        raise RabbitServerError(f"rabbitmq did not answer in {_START_TIMEOUT}s")

    def _ready(self) -> bool:
        """True once the port answers an AMQP 0-9-1 protocol header with a frame."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                s.sendall(b"AMQP\x00\x00\x09\x01")
                return s.recv(8)[:1] == b"\x01"  # a method frame (connection.start)
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM the node and its epmd (SIGKILL after a timeout); remove a temporary
        data dir."""
        for proc in (self.process, self.epmd):
            stop_gently(proc, _STOP_TIMEOUT)
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the node at once (a crash; epmd stays); its data is kept."""
        kill_now(self.process)

    def __enter__(self) -> RabbitServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _log_tail(self, lines: int = 10) -> str:
        return log_tail(self.data_dir / "out.log", lines)
