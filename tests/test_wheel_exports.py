"""The public names of tickwheel.wheel are pinned: changing them is an API change."""

from __future__ import annotations

import pytest

import tickwheel.wheel

# Every test here runs on both implementations (tests/wheel_impls.py).
pytestmark = pytest.mark.usefixtures("wheel_impl")


def test_wheel_all_is_pinned() -> None:
    assert sorted(tickwheel.wheel.__all__) == [
        "DEFAULT_TICK",
        "IMPLEMENTATION",
        "Timeout",
        "Timer",
        "TimingWheel",
        "WheelClosed",
        "WheelError",
        "WheelEventLoop",
        "WheelFull",
        "WheelStats",
        "WheelTimerHandle",
        "WheelUVLoop",
        "get_wheel",
        "new_event_loop",
        "new_uvloop_event_loop",
        "sleep",
        "timeout",
        "timeout_at",
    ]
    for name in tickwheel.wheel.__all__:
        obj = getattr(tickwheel.wheel, name)
        if name not in ("DEFAULT_TICK", "IMPLEMENTATION"):
            assert obj.__module__.startswith("tickwheel.wheel."), name


def test_drop_in_names_match_asyncio() -> None:
    import asyncio
    import inspect

    for name in ("timeout", "timeout_at", "sleep"):
        ours = inspect.signature(getattr(tickwheel.wheel, name))
        theirs = inspect.signature(getattr(asyncio, name))
        assert list(ours.parameters) == list(theirs.parameters), name


def test_core_imports_neither_asyncio_nor_time() -> None:
    import ast
    import pathlib

    source = pathlib.Path(tickwheel.wheel.__file__).with_name("_core.py").read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"asyncio", "time", "uvloop", "selectors"}
