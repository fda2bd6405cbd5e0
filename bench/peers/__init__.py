"""The libraries tickwheel is measured against, and the only place in bench/ that drives them.

- ``bench.peers.queues``: the Redis delayed-job libraries (arq, BullMQ's Python port, saq,
  streaq) behind one :class:`~bench.peers.queues.Peer` interface;
- ``bench.peers.postgres``: the PostgreSQL job queues (procrastinate, pgqueuer), one
  round of the Postgres mode's figures each;
- ``bench.peers.loops``: asyncio's own event loop and uvloop, the wheel's peers;
- ``python -m bench.peers kill-worker``: one library's worker as a process, for the
  SIGKILL row of ``python -m bench``.

Each submodule imports only its own libraries, so that a child process counted under
callgrind (the loops) does not load the job queues.
"""
