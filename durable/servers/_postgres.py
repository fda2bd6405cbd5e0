"""Start and stop private PostgreSQL servers on free loopback ports.

Used by the test suite (and the benchmarks): each server is a fresh cluster made by
``initdb`` in a temporary directory, started with ``pg_ctl`` on 127.0.0.1 and a port the
kernel handed out, with its Unix socket inside that directory, and stopped by the pid of
its postmaster (never by name, so a PostgreSQL that the machine already runs is never
touched).

The binaries (``initdb``, ``pg_ctl``, ``postgres``) are found in this order:

1. the directory ``$TICKWHEEL_POSTGRES_BIN``;
2. ``pg_ctl`` on ``PATH`` (its directory);
3. ``pg_config --bindir``, when ``pg_config`` is on ``PATH`` (client-only installs that
   name the server's directory, Homebrew, PGDG packages);
4. the newest ``/usr/lib/postgresql/<major>/bin`` (Debian and Ubuntu packages);
5. the binaries shipped by the ``pgserver`` package, when it is installed (it has no
   build for Python 3.13, so there one of the others must provide them).

No source found is an error (:class:`PostgresServerError`), never a skip.

``initdb`` and ``postgres`` refuse to run as root. When this process is root, the
server runs as an unprivileged user: ``$TICKWHEEL_POSTGRES_USER``, else ``postgres``,
else ``nobody``; the data directory is handed to that user and the binaries are run
through ``setpriv`` (util-linux). As any other user, they run as that user.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pwd
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path

from tickwheel.durable.servers._redis import free_port

from ._processes import log_tail

__all__ = ["PostgresServer", "PostgresServerError", "find_postgres_bin"]

# How long initdb, a start and a stop may take. initdb with fsync on is ~1 s on a quiet
# machine; a loaded CI machine has been seen to take ten times that.
_INITDB_TIMEOUT = 120.0
_START_TIMEOUT = 60.0
_STOP_TIMEOUT = 20.0
_NEEDED = ("initdb", "pg_ctl", "postgres")


class PostgresServerError(RuntimeError):
    """PostgreSQL binaries could not be found, or a server could not be started."""


def _has_all(directory: str | os.PathLike[str]) -> bool:
    return all(os.access(Path(directory) / name, os.X_OK) for name in _NEEDED)


def _major(path: str) -> tuple[int, ...]:
    found = re.search(r"/postgresql/([0-9.]+)/bin", path)
    return tuple(int(p) for p in found.group(1).split(".") if p) if found else ()


def find_postgres_bin() -> Path:
    """Return the directory that holds ``initdb``, ``pg_ctl`` and ``postgres``.

    Raises:
        PostgresServerError: if no source in the module's order provides them.
    """
    env = os.environ.get("TICKWHEEL_POSTGRES_BIN")
    if env:
        if not _has_all(env):
            raise PostgresServerError(
                f"TICKWHEEL_POSTGRES_BIN={env!r} does not hold executable {', '.join(_NEEDED)}"
            )
        return Path(env)
    on_path = shutil.which("pg_ctl")
    if on_path:
        directory = Path(os.path.realpath(on_path)).parent
        if _has_all(directory):
            return directory
    from_config = _pg_config_bindir()
    if from_config is not None and _has_all(from_config):
        return from_config
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_major, reverse=True):
        if _has_all(candidate):
            return Path(candidate)
    # Located without importing it (its import starts nothing, but pulls in its deps).
    spec = importlib.util.find_spec("pgserver")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        bundled = Path(root) / "pginstall" / "bin"
        if _has_all(bundled):
            return bundled
    raise PostgresServerError(
        "no PostgreSQL binaries found (looked at $TICKWHEEL_POSTGRES_BIN, pg_ctl on PATH, "
        "`pg_config --bindir`, /usr/lib/postgresql/*/bin and the pgserver package): "
        "install PostgreSQL (initdb, pg_ctl, postgres), set TICKWHEEL_POSTGRES_BIN to "
        "their directory, or `pip install pgserver` (Python 3.12 and older)"
    )


def _pg_config_bindir() -> Path | None:
    """The directory ``pg_config --bindir`` names, or None without a working pg_config."""
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        return None
    try:
        out = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(out) if out else None


def _run_as() -> pwd.struct_passwd | None:
    """The user to run the server as when this process is root, else None."""
    if os.geteuid() != 0:
        return None
    names = [os.environ.get("TICKWHEEL_POSTGRES_USER", ""), "postgres", "nobody"]
    for name in filter(None, names):
        with contextlib.suppress(KeyError):
            user = pwd.getpwnam(name)
            if user.pw_uid != 0:
                return user
    raise PostgresServerError(
        "running as root and no unprivileged user found to run PostgreSQL as: "
        "set TICKWHEEL_POSTGRES_USER"
    )


class PostgresServer:
    """One PostgreSQL cluster in a temporary directory, served on 127.0.0.1.

    Args:
        port: TCP port; a free one when None.
        data_dir: where the cluster lives; a fresh temporary directory when None
            (removed on :meth:`stop`). A given directory that holds a cluster already is
            reused, so a test can restart a server on the same data.
        fsync: keep fsync on (the default: a crash test must see what a real server
            keeps); off only for throwaway speed.
        extra_conf: further ``name=value`` settings (``postgres -c``).
        bin_dir: directory of the binaries; found with :func:`find_postgres_bin` when
            None.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        fsync: bool = True,
        extra_conf: dict[str, str] | None = None,
        bin_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.bin_dir = Path(bin_dir) if bin_dir is not None else find_postgres_bin()
        self.port = port if port is not None else free_port()
        self._own_dir = data_dir is None
        self.base_dir = (
            Path(data_dir)
            if data_dir is not None
            else Path(tempfile.mkdtemp(prefix="tickwheel-pg-"))
        )
        self.fsync = fsync
        self.extra_conf = dict(extra_conf or {})
        self.user = _run_as()
        self.process: subprocess.Popen[bytes] | None = None  # the postmaster

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while it runs."""
        return self.process.pid if self.process is not None else None

    @property
    def data_dir(self) -> Path:
        """The cluster's data directory (PGDATA)."""
        return self.base_dir / "data"

    @property
    def socket_dir(self) -> Path:
        """The directory of the server's Unix socket."""
        return self.base_dir / "sock"

    @property
    def url(self) -> str:
        """The ``postgresql://`` URL of the ``postgres`` database, superuser ``postgres``."""
        return self.url_for("postgres")

    def url_for(self, database: str) -> str:
        """The URL of ``database`` on this server."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _cmd(self, *argv: str) -> list[str]:
        if self.user is None:
            return list(argv)
        return [
            "setpriv",
            f"--reuid={self.user.pw_uid}",
            f"--regid={self.user.pw_gid}",
            "--clear-groups",
            "--",
            *argv,
        ]

    def _env(self) -> dict[str, str]:
        env = dict(os.environ, LC_ALL="C", TZ="UTC")
        if self.user is not None:
            env["HOME"] = str(self.base_dir)
        return env

    def _run(self, argv: list[str], timeout: float) -> None:
        try:
            done = subprocess.run(
                self._cmd(*argv),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                env=self._env(),
                cwd=self.base_dir,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise PostgresServerError(f"{argv[0]} did not finish in {timeout}s") from exc
        if done.returncode != 0:
            out = (done.stdout + done.stderr).decode(errors="replace").strip()
            raise PostgresServerError(
                f"{Path(argv[0]).name} exited with {done.returncode}: {out} | {self._log_tail()}"
            )

    def _chown(self, path: Path) -> None:
        if self.user is not None:
            os.chown(path, self.user.pw_uid, self.user.pw_gid)

    def initdb(self) -> None:
        """Create the cluster (trust auth on loopback, superuser ``postgres``)."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.base_dir.chmod(0o755)
        self._chown(self.base_dir)
        self._run(
            [
                str(self.bin_dir / "initdb"),
                "-D", str(self.data_dir),
                "-U", "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
            ],
            _INITDB_TIMEOUT,
        )  # fmt: skip

    def start(self) -> PostgresServer:
        """Create the cluster if needed, start it and wait until it accepts connections.

        Raises:
            PostgresServerError: if initdb or the start fails or times out (the server
                log's tail is in the message).
        """
        if self.process is not None and self.process.poll() is None:
            raise PostgresServerError(f"server on port {self.port} is already running")
        if not (self.data_dir / "PG_VERSION").exists():
            self.initdb()
        self.socket_dir.mkdir(exist_ok=True)
        self._chown(self.socket_dir)
        conf = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.socket_dir),
            "fsync": "on" if self.fsync else "off",
            "max_connections": "200",
            **self.extra_conf,
        }
        argv = [str(self.bin_dir / "postgres"), "-D", str(self.data_dir)]
        for name, value in conf.items():
            argv += ["-c", f"{name}={value}"]
        log = (self.base_dir / "server.log").open("ab")
        try:
            self.process = subprocess.Popen(
                self._cmd(*argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env(),
                cwd=self.base_dir,
                start_new_session=True,  # a Ctrl-C of the test run does not hit it first
            )
        finally:
            log.close()
        deadline = time.monotonic() + _START_TIMEOUT
        while not self._ready():
            if self.process.poll() is not None:
                raise PostgresServerError(
                    f"postgres exited with {self.process.returncode}: {self._log_tail()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise PostgresServerError(
                    f"postgres did not answer in {_START_TIMEOUT}s: {self._log_tail()}"
                )
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Stop the server (SIGINT: a fast shutdown, as ``pg_ctl stop -m fast``; SIGKILL
        of its pid after a timeout) and remove a temporary directory."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the postmaster at once (a crash); the data is kept for a restart.

        Its backends notice the postmaster is gone and exit (waited for here: they hold
        the shared memory a restart needs); the next start recovers from the WAL.
        """
        proc = self.process
        if proc is not None and proc.poll() is None:
            children = self._children_of(proc.pid)
            proc.kill()
            proc.wait()
            deadline = time.monotonic() + _STOP_TIMEOUT
            while any(self._alive(c) for c in children) and time.monotonic() < deadline:
                time.sleep(0.02)
        self.process = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- helpers -------------------------------------------------------------------

    def _ready(self) -> bool:
        """True once this server accepts a session: its reply to a startup packet is an
        authentication message (``R``), not an error such as "starting up" (``E``)."""
        body = b"user\x00postgres\x00database\x00postgres\x00\x00"
        packet = struct.pack(">ii", len(body) + 8, 196608) + body  # protocol 3.0
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(packet)
                ok = s.recv(1) == b"R"
                with contextlib.suppress(OSError):
                    s.sendall(b"X\x00\x00\x00\x04")  # Terminate
                return ok
        except OSError:
            return False

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        with contextlib.suppress(OSError):
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            return state != "Z"
        return True

    @staticmethod
    def _children_of(pid: int | None) -> list[int]:
        if pid is None:
            return []
        out: list[int] = []
        for stat in glob.glob("/proc/[0-9]*/stat"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(stat).read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid and fields[0] != "Z":
                    out.append(int(Path(stat).parent.name))
        return out

    def _log_tail(self, lines: int = 20) -> str:
        return log_tail(self.base_dir / "server.log", lines)
