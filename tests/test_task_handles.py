"""Typed task handles (durable/runtime/_handles.py, _payloads.py): ``@registry.task``
returns a handle that schedules with a checked payload (a dataclass, a TypedDict or a
pydantic model) and the handler gets the type back; the string-and-dict API still works.
A real redis-server; the typing check runs mypy --strict over tests/typing/typed_app.py.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal, TypedDict

import pydantic
import pytest
from durable_support import open_scheduler, run, snapshot
from spill_support import running_worker, until

from tickwheel.durable import SyncScheduler, TaskContext, TaskHandle, TaskRegistry
from tickwheel.durable.servers._redis import RedisServer

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Address:
    city: str
    zip: str | None = None


@dataclass
class ReminderArgs:
    user: int
    text: str = ""
    tags: list[str] = field(default_factory=list)
    address: Address | None = None
    channel: Literal["mail", "sms"] = "mail"


class ChargeArgs(TypedDict):
    order: str
    cents: int


class Refund(pydantic.BaseModel):
    order: str
    cents: int = pydantic.Field(gt=0)


def _registry(seen: list[Any]) -> tuple[TaskRegistry, Any, Any, Any, Any]:
    reg = TaskRegistry()

    @reg.task
    async def remind(ctx: TaskContext, args: ReminderArgs) -> None:
        seen.append(("remind", args, ctx.payload))

    @reg.task(name="charge")
    def charge(ctx: TaskContext, args: ChargeArgs) -> None:
        seen.append(("charge", args, ctx.payload))

    @reg.task(name="refund")
    async def refund(ctx: TaskContext, args: Refund) -> None:
        seen.append(("refund", args, ctx.payload))

    @reg.task(name="plain")
    def plain(ctx: TaskContext) -> None:
        seen.append(("plain", ctx.payload, None))

    return reg, remind, charge, refund, plain


def test_handles_are_callable_and_know_their_types() -> None:
    seen: list[Any] = []
    reg, remind, charge, refund, plain = _registry(seen)
    assert isinstance(remind, TaskHandle) and remind.payload_type is ReminderArgs
    assert charge.payload_type is ChargeArgs and refund.payload_type is Refund
    assert plain.payload_type is None and plain.name == "plain"
    assert remind.name.endswith("remind") and remind.name in reg
    assert remind.__name__ == "remind"  # the function's metadata
    charge(SimpleNamespace(payload=None), {"order": "o", "cents": 1})  # the function itself
    assert seen == [("charge", {"order": "o", "cents": 1}, None)]  # as given, unchecked
    with pytest.raises(TypeError, match="dataclass, a TypedDict or a pydantic"):
        reg.task(payload=int)(lambda ctx, p: None)
    with pytest.raises(TypeError, match="payload= needs a task taking"):
        reg.task(name="one", payload=ReminderArgs)(lambda ctx: None)


def test_wrong_payloads_are_refused_naming_the_field(redis_server: RedisServer) -> None:
    _reg, remind, charge, refund, _ = _registry([])

    async def main() -> None:
        async with open_scheduler(redis_server.url) as s:
            await s.open()
            before = await snapshot(s)
            bad: list[tuple[Any, Any, type[Exception], str]] = [
                (remind, {"user": 1}, TypeError, "payload must be ReminderArgs, got dict"),
                (remind, ReminderArgs(user="1"), TypeError, r"payload\.user must be int"),  # type: ignore[arg-type]
                (remind, ReminderArgs(user=True), TypeError, r"payload\.user must be int"),
                (remind, ReminderArgs(1, tags=["a", 2]), TypeError, r"payload\.tags\[1\]"),  # type: ignore[list-item]
                (remind, ReminderArgs(1, address=Address(5)), TypeError, r"address\.city"),  # type: ignore[arg-type]
                (remind, ReminderArgs(1, channel="fax"), ValueError, r"payload\.channel"),  # type: ignore[arg-type]
                (charge, {"order": "o"}, ValueError, r"payload\.cents is missing"),
                (charge, {"order": "o", "cents": 1, "x": 0}, ValueError, r"payload\.x is not"),
                (charge, {"order": "o", "cents": "1"}, TypeError, r"payload\.cents must be int"),
                (refund, {"order": "o", "cents": 0}, ValueError, r"payload\.cents: "),
                (refund, {"order": 5, "cents": 1}, ValueError, r"payload\.order: "),
                (refund, ["o", 1], TypeError, "payload must be Refund"),
            ]
            for handle, payload, exc, match in bad:
                with pytest.raises(exc, match=match):
                    await handle.schedule(payload, id="x", scheduler=s)
                with pytest.raises(exc, match=match):
                    handle.spec(payload, id="x")
            assert await snapshot(s) == before

    run(main())


def test_the_handler_gets_its_type_back(redis_server: RedisServer) -> None:
    seen: list[Any] = []
    reg, remind, charge, refund, plain = _registry(seen)

    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=1) as s:
            reg.bind(s)
            args = ReminderArgs(42, "hi", ["a"], Address("Paris", None), "sms")
            await remind.schedule(args, id="r", delay=0)
            await charge.schedule({"order": "o1", "cents": 100}, id="c", delay=0)
            await refund.schedule(Refund(order="o2", cents=5), id="f", delay=0)
            await plain.schedule(b"raw", id="p", delay=0)
            await s.schedule("p2", "plain", {"k": 1}, delay=0)  # the string-and-dict API
            await s.schedule_many([remind.spec(ReminderArgs(7), id="r7")])
            async with running_worker(s, reg, poll_interval=0.05):
                assert await until(lambda: len(seen) == 6, 10)
        by_id = {(kind, repr(value)) for kind, value, _ in seen}
        assert ("remind", repr(args)) in by_id and ("remind", repr(ReminderArgs(7))) in by_id
        got = {kind: (value, ctx_payload) for kind, value, ctx_payload in seen}
        assert got["charge"] == ({"order": "o1", "cents": 100}, {"order": "o1", "cents": 100})
        value, ctx_payload = got["refund"]
        assert isinstance(value, Refund) and value == Refund(order="o2", cents=5)
        assert ctx_payload is value  # the context carries the typed payload too
        plains = [v for k, v, _ in seen if k == "plain"]
        assert len(plains) == 2 and b"raw" in plains and {"k": 1} in plains

    run(main())


def test_follow_up_through_the_context_and_the_sync_form(redis_server: RedisServer) -> None:
    seen: list[Any] = []
    reg = TaskRegistry()

    @reg.task
    async def step(ctx: TaskContext, args: ReminderArgs) -> None:
        seen.append(args.user)
        if args.user < 3:
            await step.schedule(
                ReminderArgs(args.user + 1), id=f"step:{args.user + 1}", scheduler=ctx
            )

    async def main() -> None:
        async with open_scheduler(redis_server.url, shards=1) as s:
            sync = SyncScheduler.from_url(redis_server.url, s.keys.namespace, shards=1)
            try:
                with pytest.raises(RuntimeError, match="no SyncScheduler"):
                    step.schedule_sync(ReminderArgs(1), id="step:1")
                reg.bind(sync)
                with pytest.raises(TypeError, match=r"payload\.user"):
                    step.schedule_sync(ReminderArgs("1"), id="step:1")  # type: ignore[arg-type]
                result = await asyncio.to_thread(step.schedule_sync, ReminderArgs(1), id="step:1")
                assert result.status.name == "CREATED"
            finally:
                sync.close()
            with pytest.raises(RuntimeError, match="no scheduler"):
                await step.schedule(ReminderArgs(1), id="step:x")
            async with running_worker(s, reg, poll_interval=0.05):
                assert await until(lambda: len(seen) == 3, 10)
            assert seen == [1, 2, 3]

    run(main())


def test_mypy_strict_catches_a_wrong_payload() -> None:
    """tests/typing/typed_app.py passes ``mypy --strict``, and its wrong payloads are
    marked ``# type: ignore[<code>]``: --strict (warn_unused_ignores) fails on an ignore
    whose line is not that error, so each marked mistake is one mypy catches."""
    app = ROOT / "tests" / "typing" / "typed_app.py"
    assert app.read_text().count("  # type: ignore[") == 5
    with tempfile.TemporaryDirectory() as tmp:
        # mypy cannot follow the editable install's import hook (.ci/typecheck): the
        # sources under their import names, by symlinks.
        (Path(tmp) / "tickwheel").mkdir()
        (Path(tmp) / "tickwheel" / "durable").symlink_to(ROOT / "durable")
        (Path(tmp) / "tickwheel" / "wheel").symlink_to(ROOT / "wheel")
        proc = subprocess.run(
            [
                sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                "--follow-imports=silent", "--config-file", os.devnull,
                "--python-version", "3.11", str(app),
            ],
            check=False,
            cwd=tmp,
            env=dict(os.environ, MYPYPATH=tmp),
            capture_output=True,
            text=True,
            timeout=240,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
