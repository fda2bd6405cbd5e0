"""The task registry: registration, lookup and its errors."""

from __future__ import annotations

import asyncio

import pytest

from tickwheel.durable import TaskContext, TaskRegistry
from tickwheel.durable.runtime._tasks import call_task


def _ctx(payload: object = None) -> TaskContext:
    return TaskContext("id", "t", payload, 1_000, 1, 0, False)


def test_decorator_bare_and_named() -> None:
    reg = TaskRegistry()

    @reg.task
    async def remind(ctx: TaskContext) -> None:
        pass

    @reg.task(name="billing.charge")
    def charge(ctx: TaskContext) -> None:
        pass

    # The default name is the __qualname__; the decorator returns a handle of the
    # function (the registry holds the function itself).
    default = "test_decorator_bare_and_named.<locals>.remind"
    assert reg.get(default) is remind.fn and remind.name == default
    assert reg["billing.charge"] is charge.fn
    assert default in reg and "charge" not in reg
    assert sorted(reg) == ["billing.charge", default] and len(reg) == 2
    assert reg.get("nope") is None


def test_duplicate_name_is_refused() -> None:
    reg = TaskRegistry()
    reg.register(lambda ctx: None, name="x")
    with pytest.raises(ValueError, match="'x' is already registered"):

        @reg.task(name="x")
        def other(ctx: TaskContext) -> None:
            pass

    assert len(reg) == 1


def test_non_callable_and_bad_names_are_refused() -> None:
    reg = TaskRegistry()
    with pytest.raises(TypeError, match="fn must be callable"):
        reg.register(42, name="n")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fn must be callable"):
        reg.task("not a function")  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="name must be 1 to 128"):
        reg.register(lambda ctx: None, name="")
    with pytest.raises(ValueError, match="name must be 1 to 128"):
        reg.register(lambda ctx: None, name="x" * 129)
    with pytest.raises(TypeError, match="name must be a str"):
        reg.register(lambda ctx: None, name=7)  # type: ignore[arg-type]
    assert len(reg) == 0


def test_unknown_lookup_names_the_known_tasks() -> None:
    reg = TaskRegistry()
    reg.register(lambda ctx: None, name="a")
    with pytest.raises(KeyError, match=r"no task named 'b'; known: \['a'\]"):
        reg["b"]


def test_call_task_runs_sync_and_async_functions() -> None:
    async def coro(ctx: TaskContext) -> object:
        await asyncio.sleep(0)
        return ("async", ctx.payload)

    def plain(ctx: TaskContext) -> object:
        return ("sync", ctx.payload)

    assert asyncio.run(call_task(coro, _ctx(1))) == ("async", 1)
    assert asyncio.run(call_task(plain, _ctx(2))) == ("sync", 2)
    assert _ctx().key == ("id", 1_000)
