"""The drop-in promise, version by version: tickwheel's ``timeout`` against the running
Python's ``asyncio.timeout``.

Each scenario runs twice on a fresh loop, once with ``asyncio.timeout``/``timeout_at``
and once with tickwheel's (on both implementations: the ``wheel_impl`` fixture), and
returns what a caller can observe: the exception that escaped, its ``__cause__`` /
``__context__`` chain and the members of an exception group (types, identities,
``__suppress_context__``), ``expired()``, ``when()``, ``repr()``, the task's
``cancelling()`` count, and the texts of the errors a misuse raises. The two must be
equal. asyncio changed here between versions (3.13 chains a foreign exception raised
while a timeout expires to a ``TimeoutError``, also inside a ``TaskGroup``'s exception
group, and converts subclasses of ``CancelledError``), so equality is checked on each
interpreter ``.ci/run`` runs; a few pinned facts make sure the scenarios really reach
the version-specific paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from vloop import VirtualLoop

import tickwheel.wheel

pytestmark = pytest.mark.usefixtures("wheel_impl")

PY313 = sys.version_info >= (3, 13)

Scenario = Callable[[Any], Awaitable[Any]]
SCENARIOS: dict[str, Scenario] = {}


def scenario(fn: Scenario) -> Scenario:
    SCENARIOS[fn.__name__] = fn
    return fn


class Ours:
    """Stands in for the asyncio module's names; looked up per call, so the
    ``wheel_impl`` fixture's rebinding of the default wheel applies."""

    @staticmethod
    def timeout(delay: float | None) -> Any:
        return tickwheel.wheel.timeout(delay)

    @staticmethod
    def timeout_at(when: float | None) -> Any:
        return tickwheel.wheel.timeout_at(when)


def shape(exc: BaseException | None, seen: tuple[int, ...] = ()) -> Any:
    """What code that inspects an exception sees of it, as plain data."""
    if exc is None:
        return None
    if id(exc) in seen:
        return f"<cycle {seen.index(id(exc))}>"
    seen = (*seen, id(exc))
    out: dict[str, Any] = {
        "type": type(exc).__name__,
        "args": [a if isinstance(a, (str, int)) else type(a).__name__ for a in exc.args]
        if not isinstance(exc, BaseExceptionGroup)
        else [exc.args[0]],
        "suppress_context": exc.__suppress_context__,
        "cause": shape(exc.__cause__, seen),
    }
    ctx = exc.__context__
    out["context"] = "=cause" if ctx is not None and ctx is exc.__cause__ else shape(ctx, seen)
    if isinstance(exc, BaseExceptionGroup):
        out["group"] = [shape(e, seen) for e in exc.exceptions]
    return out


def chain_types(exc: BaseException | None) -> list[str]:
    """The ``__context__`` chain's types, outermost first."""
    out = []
    while exc is not None and len(out) < 10:
        out.append(type(exc).__name__)
        exc = exc.__context__
    return out


async def outcome(aw: Awaitable[Any]) -> Any:
    """The result of ``aw``, or the shape of what it raised, and the task's count."""
    task = asyncio.current_task()
    assert task is not None
    try:
        result: Any = ("ok", await aw)
    except BaseException as exc:  # the shape is the observation
        result = ("raised", shape(exc))
    return (*result, task.cancelling())


def norm_repr(cm: Any) -> str:
    """repr with the deadline's digits folded (the two loops' clocks differ a little)."""
    return re.sub(r"when=-?[0-9.e+-]+", "when=<t>", repr(cm))


class Boom(Exception):
    pass


class MyCancelled(asyncio.CancelledError):
    pass


async def forever() -> None:
    await asyncio.sleep(3600)


# -- the scenarios -----------------------------------------------------------------


@scenario
async def plain_expiry(ns: Any) -> Any:
    cm = ns.timeout(0.01)

    async def body() -> None:
        async with cm:
            await forever()

    return await outcome(body()), cm.expired(), norm_repr(cm)


@scenario
async def no_expiry(ns: Any) -> Any:
    cm = ns.timeout(10)

    async def body() -> int:
        async with cm:
            await asyncio.sleep(0)
        return 1

    return await outcome(body()), cm.expired(), norm_repr(cm)


@scenario
async def foreign_exception_while_expiring(ns: Any) -> Any:
    """The body turns the timeout's cancellation into another exception: 3.13 puts a
    TimeoutError (caused by the CancelledError) into its context."""
    cm = ns.timeout(0.01)

    async def body() -> None:
        async with cm:
            try:
                await forever()
            except asyncio.CancelledError:
                raise Boom("during cancel") from None

    return await outcome(body()), cm.expired()


@scenario
async def foreign_exception_in_finally(ns: Any) -> Any:
    cm = ns.timeout(0.01)

    async def body() -> None:
        async with cm:
            try:
                await forever()
            finally:
                raise Boom("in finally")

    return await outcome(body()), cm.expired()


@scenario
async def foreign_exception_deep_in_the_chain(ns: Any) -> Any:
    """Boom <- KeyError <- CancelledError: the TimeoutError goes in before the
    CancelledError, wherever it is in the chain."""
    cm = ns.timeout(0.01)

    async def body() -> None:
        async with cm:
            try:
                await forever()
            except asyncio.CancelledError:
                try:
                    raise KeyError("k")
                except KeyError:
                    raise Boom("deep") from None

    return await outcome(body()), cm.expired()


@scenario
async def foreign_exception_without_cancelled_in_chain(ns: Any) -> Any:
    cm = ns.timeout(0.01)

    async def body() -> None:
        async with cm:
            with contextlib.suppress(asyncio.CancelledError):
                await forever()
            try:
                raise KeyError("k")
            except KeyError:
                raise Boom("later") from None

    return await outcome(body()), cm.expired()


@scenario
async def cancelled_subclass_while_expiring(ns: Any) -> Any:
    """3.13 turns any CancelledError subclass into TimeoutError; 3.11/3.12 only the
    class itself."""
    cm = ns.timeout(0.01)

    async def body() -> None:
        async with cm:
            try:
                await forever()
            except asyncio.CancelledError:
                raise MyCancelled("sub") from None

    return await outcome(body()), cm.expired()


@scenario
async def swallowed_cancellation(ns: Any) -> Any:
    cm = ns.timeout(0.01)

    async def body() -> str:
        async with cm:
            with contextlib.suppress(asyncio.CancelledError):
                await forever()
        return "went on"

    return await outcome(body()), cm.expired(), norm_repr(cm)


@scenario
async def expired_then_foreign_after_swallow(ns: Any) -> Any:
    """An unrelated exception, raised after the body swallowed the cancellation."""
    cm = ns.timeout(0.01)

    async def body() -> None:
        async with cm:
            with contextlib.suppress(asyncio.CancelledError):
                await forever()
            raise Boom("unrelated")

    return await outcome(body()), cm.expired()


@scenario
async def exception_without_expiry(ns: Any) -> Any:
    cm = ns.timeout(10)

    async def body() -> None:
        async with cm:
            try:
                raise KeyError("k")
            except KeyError:
                raise Boom("plain") from None

    return await outcome(body()), cm.expired()


@scenario
async def outer_cancel_wins(ns: Any) -> Any:
    """The task is cancelled from outside as well as by the timeout: CancelledError."""
    cms: list[Any] = []

    async def body() -> None:
        cm = ns.timeout(0.01)
        cms.append(cm)
        async with cm:
            await forever()

    task = asyncio.ensure_future(outcome(body()))
    await asyncio.sleep(0.01)
    await asyncio.sleep(0)
    task.cancel()
    return await task, cms[0].expired()


@scenario
async def outer_cancel_before_expiry(ns: Any) -> Any:
    cms: list[Any] = []

    async def body() -> None:
        cm = ns.timeout(10)
        cms.append(cm)
        async with cm:
            await forever()

    task = asyncio.ensure_future(outcome(body()))
    await asyncio.sleep(0)
    task.cancel("outside")
    return await task, cms[0].expired()


@scenario
async def nested_inner_expires(ns: Any) -> Any:
    outer, inner = ns.timeout(10), ns.timeout(0.01)

    async def body() -> None:
        async with outer, inner:
            await forever()

    return await outcome(body()), outer.expired(), inner.expired()


@scenario
async def nested_outer_expires(ns: Any) -> Any:
    outer, inner = ns.timeout(0.01), ns.timeout(10)

    async def body() -> None:
        async with outer, inner:
            await forever()

    return await outcome(body()), outer.expired(), inner.expired()


@scenario
async def nested_both_expire_same_deadline(ns: Any) -> Any:
    loop = asyncio.get_running_loop()
    when = loop.time() + 0.01
    outer, inner = ns.timeout_at(when), ns.timeout_at(when)

    async def body() -> None:
        async with outer, inner:
            await forever()

    return await outcome(body()), outer.expired(), inner.expired()


@scenario
async def nested_inner_caught_then_outer(ns: Any) -> Any:
    outer = ns.timeout(0.05)
    seen: list[Any] = []

    async def body() -> None:
        async with outer:
            try:
                async with ns.timeout(0.01) as inner:
                    await forever()
            except TimeoutError as exc:
                seen.append((inner.expired(), shape(exc)))
            await forever()

    return await outcome(body()), outer.expired(), seen


@scenario
async def taskgroup_timeout_outside_child_raises_on_cancel(ns: Any) -> Any:
    """The timeout cancels the parent; the TaskGroup cancels its child, which raises:
    an ExceptionGroup leaves the block (3.13 puts TimeoutErrors into its members')
    contexts)."""
    cm = ns.timeout(0.01)

    async def child() -> None:
        try:
            await forever()
        except asyncio.CancelledError:
            raise Boom("child") from None

    async def body() -> None:
        async with cm, asyncio.TaskGroup() as tg:
            tg.create_task(child())
            await forever()

    return await outcome(body()), cm.expired()


@scenario
async def taskgroup_timeout_outside_children_cancelled(ns: Any) -> Any:
    cm = ns.timeout(0.01)

    async def body() -> None:
        async with cm, asyncio.TaskGroup() as tg:
            tg.create_task(forever())
            tg.create_task(forever())
            await forever()

    return await outcome(body()), cm.expired()


@scenario
async def taskgroup_child_fails_first(ns: Any) -> Any:
    cm = ns.timeout(10)

    async def child() -> None:
        await asyncio.sleep(0.01)
        raise Boom("first")

    async def body() -> None:
        async with cm, asyncio.TaskGroup() as tg:
            tg.create_task(child())
            tg.create_task(forever())
            await forever()

    return await outcome(body()), cm.expired()


@scenario
async def taskgroup_child_fails_as_timeout_expires(ns: Any) -> Any:
    """A child fails in the same iteration as the deadline."""
    loop = asyncio.get_running_loop()
    when = loop.time() + 0.01
    cm = ns.timeout_at(when)

    async def child() -> None:
        await asyncio.sleep(0.01)
        raise Boom("together")

    async def body() -> None:
        async with cm, asyncio.TaskGroup() as tg:
            tg.create_task(child())
            await forever()

    return await outcome(body()), cm.expired()


@scenario
async def taskgroup_parent_body_raises_on_cancel(ns: Any) -> Any:
    cm = ns.timeout(0.01)

    async def body() -> None:
        async with cm, asyncio.TaskGroup() as tg:
            tg.create_task(forever())
            try:
                await forever()
            except asyncio.CancelledError:
                raise Boom("parent") from None

    return await outcome(body()), cm.expired()


@scenario
async def timeout_inside_taskgroup_child(ns: Any) -> Any:
    results: list[Any] = []

    async def child() -> None:
        async with ns.timeout(0.01) as cm:
            try:
                await forever()
            finally:
                results.append(cm.expired())

    async def body() -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(child())
            tg.create_task(asyncio.sleep(0.02))

    return await outcome(body()), results


@scenario
async def taskgroup_inside_timeout_inside_taskgroup(ns: Any) -> Any:
    async def inner() -> None:
        async with ns.timeout(0.01), asyncio.TaskGroup() as tg:
            tg.create_task(forever())

    async def body() -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(inner())

    return await outcome(body())


@scenario
async def taskgroup_parent_raises_and_child_fails(ns: Any) -> Any:
    """The body and a child both fail after the expiry (3.13's TaskGroup re-cancels a
    parent that is being cancelled from outside: the count must stay in step)."""
    cm = ns.timeout(0.01)

    async def child() -> None:
        try:
            await forever()
        except asyncio.CancelledError:
            raise KeyError("child") from None

    async def body() -> None:
        async with cm, asyncio.TaskGroup() as tg:
            tg.create_task(child())
            try:
                await forever()
            except asyncio.CancelledError:
                raise Boom("parent") from None

    return await outcome(body()), cm.expired()


@scenario
async def eager_tasks(ns: Any) -> Any:
    """Timeouts entered by tasks that start eagerly (3.12's eager_task_factory runs a
    new task's first step inside create_task)."""
    loop = asyncio.get_running_loop()
    factory = getattr(asyncio, "eager_task_factory", None)
    if factory is not None:
        loop.set_task_factory(factory)
    seen: list[Any] = []

    async def child(delay: float) -> str:
        async with ns.timeout(delay) as cm:
            seen.append(norm_repr(cm))
            await asyncio.sleep(0.02)
        return "done"

    try:
        async with asyncio.TaskGroup() as tg:
            slow = tg.create_task(outcome(child(0.01)))
            fast = tg.create_task(outcome(child(1)))
    finally:
        loop.set_task_factory(None)
    return slow.result(), fast.result(), seen


@scenario
async def exit_before_past_deadline_fires(ns: Any) -> Any:
    loop = asyncio.get_running_loop()
    cm = ns.timeout(10)

    async def body() -> str:
        async with cm:
            cm.reschedule(loop.time() - 1)  # due at the next iteration: not yet
        return "left in time"

    first = await outcome(body())
    await asyncio.sleep(0)
    return first, cm.expired(), norm_repr(cm)


@scenario
async def reschedule_and_when(ns: Any) -> Any:
    loop = asyncio.get_running_loop()
    seen: list[Any] = []
    cm = ns.timeout(None)
    seen.append((cm.when(), norm_repr(cm)))

    async def body() -> None:
        async with cm:
            seen.append((cm.when(), repr(cm)))  # active, no deadline: "when=None"
            when = loop.time() + 10
            cm.reschedule(when)
            seen.append((cm.when() == when, norm_repr(cm)))
            cm.reschedule(None)
            seen.append(cm.when())
            cm.reschedule(loop.time() + 0.01)
            await forever()

    seen.append(await outcome(body()))
    seen.append((cm.expired(), cm.when() is not None, norm_repr(cm)))
    return seen


@scenario
async def reschedule_after_expiry_in_block(ns: Any) -> Any:
    """Rescheduling once the timeout fired (the block still running) is refused."""
    cm = ns.timeout(0.01)
    errors: list[str] = []

    async def body() -> None:
        async with cm:
            try:
                await forever()
            except asyncio.CancelledError:
                try:
                    cm.reschedule(None)
                except RuntimeError as exc:
                    errors.append(str(exc))
                errors.append(norm_repr(cm))
                raise

    return await outcome(body()), errors


@scenario
async def misuse_errors(ns: Any) -> Any:
    texts: list[Any] = []

    def attempt(fn: Callable[[], Any]) -> None:
        try:
            fn()
            texts.append("ok")
        except BaseException as exc:
            texts.append((type(exc).__name__, str(exc)))

    async def attempt_async(aw: Awaitable[Any]) -> None:
        try:
            await aw
            texts.append("ok")
        except BaseException as exc:
            texts.append((type(exc).__name__, str(exc)))

    cm = ns.timeout(10)
    attempt(lambda: cm.reschedule(1.0))  # not entered
    await attempt_async(cm.__aexit__(None, None, None))  # exit before enter
    async with cm:
        pass
    attempt(lambda: cm.reschedule(1.0))  # finished
    await attempt_async(cm.__aenter__())  # entered twice
    await attempt_async(cm.__aexit__(None, None, None))  # exited twice
    texts.append(norm_repr(cm))
    expired = ns.timeout(0)
    try:
        async with expired:
            await forever()
    except TimeoutError:
        pass
    attempt(lambda: expired.reschedule(None))
    await attempt_async(expired.__aexit__(None, None, None))
    texts.append(norm_repr(expired))
    return texts


@scenario
async def past_deadlines(ns: Any) -> Any:
    loop = asyncio.get_running_loop()
    seen: list[Any] = []
    for make in (lambda: ns.timeout(0), lambda: ns.timeout(-1), lambda: ns.timeout_at(0)):
        cm = make()

        async def body(cm: Any = cm) -> None:
            async with cm:
                seen.append(cm.expired())  # not before the next iteration
                await asyncio.sleep(0)

        seen.append((await outcome(body()), cm.expired()))
    cm = ns.timeout_at(loop.time() + 10)

    async def swallowed(cm: Any = cm) -> str:
        async with cm:
            cm.reschedule(loop.time() - 1)
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                return "cancelled"
            return "not yet"

    seen.append((await outcome(swallowed()), cm.expired()))
    return seen


@scenario
async def outside_a_task(ns: Any) -> Any:
    loop = asyncio.get_running_loop()
    got = loop.create_future()

    def callback() -> None:
        step = ns.timeout(1).__aenter__()
        try:
            step.send(None)
        except BaseException as exc:
            got.set_result((type(exc).__name__, str(exc)))
        finally:
            step.close()

    loop.call_soon(callback)
    return await got


# -- the runner --------------------------------------------------------------------


LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "virtual": VirtualLoop,
    "asyncio": asyncio.new_event_loop,
}


def observe(factory: Callable[[], asyncio.AbstractEventLoop], fn: Scenario, ns: Any) -> Any:
    loop = factory()
    try:
        return loop.run_until_complete(fn(ns))
    finally:
        loop.close()


def expected(name: str, factory: Callable[[], asyncio.AbstractEventLoop] = VirtualLoop) -> Any:
    return observe(factory, SCENARIOS[name], asyncio)


#: Scenarios where two events meet at the deadline's instant: compared on the virtual
#: clock only. On a real clock the wheel fires up to one tick after the deadline (its
#: documented bound) where asyncio's heap fires at it, so which event wins is a race.
SAME_INSTANT = {"outer_cancel_wins", "taskgroup_child_fails_as_timeout_expires"}


@pytest.mark.parametrize(
    ("loop_name", "name"),
    [(lp, n) for lp in LOOPS for n in SCENARIOS if lp == "virtual" or n not in SAME_INSTANT],
)
def test_like_asyncio(loop_name: str, name: str) -> None:
    loop_factory = LOOPS[loop_name]
    theirs = observe(loop_factory, SCENARIOS[name], asyncio)
    ours = observe(loop_factory, SCENARIOS[name], Ours)
    assert ours == theirs


# -- pinned facts: the scenarios above reach each version's own path ----------------


def _escaped(result: Any) -> Any:
    (kind, value, _cancelling), *_ = result
    assert kind == "raised"
    return value


def test_pinned_foreign_exception_chain() -> None:
    got = _escaped(expected("foreign_exception_in_finally"))
    assert got["type"] == "Boom"
    if PY313:
        te = got["context"]
        assert te["type"] == "TimeoutError" and te["context"] == "=cause"
        assert te["cause"]["type"] == "CancelledError"
    else:
        assert got["context"]["type"] == "CancelledError"


def test_pinned_cancelled_subclass() -> None:
    got = _escaped(expected("cancelled_subclass_while_expiring"))
    assert got["type"] == ("TimeoutError" if PY313 else "MyCancelled")


def test_pinned_taskgroup_members() -> None:
    got = _escaped(expected("taskgroup_timeout_outside_child_raises_on_cancel"))
    assert got["type"] == "ExceptionGroup"
    member = got["group"][0]
    assert member["type"] == "Boom"
    assert member["context"]["type"] == ("TimeoutError" if PY313 else "CancelledError")


def test_pinned_plain_expiry_chain() -> None:
    got = _escaped(expected("plain_expiry"))
    assert got["type"] == "TimeoutError"
    assert got["cause"]["type"] == "CancelledError"
    assert got["context"] == "=cause" and got["suppress_context"]
