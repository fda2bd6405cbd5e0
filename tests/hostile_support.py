"""The sink registry of ``spill_support`` with tasks that raise what no task should:
for a ``tickwheel worker`` subprocess (``hostile_support:registry``), never imported by
the test process itself (it adds to ``spill_support.registry``)."""

from __future__ import annotations

from spill_support import registry  # type: ignore[import-not-found]

from tickwheel.durable import TaskContext

__all__ = ["registry"]


@registry.task(name="hostile.exit")
async def hostile_exit(ctx: TaskContext) -> None:
    raise SystemExit(3)


@registry.task(name="hostile.interrupt")
def hostile_interrupt(ctx: TaskContext) -> None:
    raise KeyboardInterrupt


@registry.task(name="hostile.generator_exit")
async def hostile_generator_exit(ctx: TaskContext) -> None:
    raise GeneratorExit
