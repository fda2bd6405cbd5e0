"""Instruction counts under callgrind: what an operation costs, whatever the machine's load.

One command, ``python -m bench.probes.callgrind KIND``, one module per kind:

- ``wheel``: the wheel's and the loops' operations (schedule + cancel, reschedule,
  fire, a timeout block), per operation, in the client process;
- ``server``: the server scenario's servers, per request;
- ``durable-client``: the durable hot paths, per job, in the client process;
- ``durable-redis``: the durable hot paths (claim, ack, batches), per job, in
  redis-server;
- ``single``: one awaited single schedule, tickwheel beside its peers: round trips and
  instructions on both sides of the socket.

``_tools`` holds what they share: counting a process run twice (the difference over the
extra operations), and a redis-server under callgrind zeroed and dumped on demand.
"""
