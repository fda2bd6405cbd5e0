"""Which implementation runs: IMPLEMENTATION, stats(), TICKWHEEL_PURE, and CI's demand."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from vloop import VirtualLoop
from wheel_impls import IMPLS

import tickwheel.wheel
from tickwheel.wheel import IMPLEMENTATION, TimingWheel
from tickwheel.wheel._impl import compiled_available


def test_implementation_is_reported_by_stats() -> None:
    assert IMPLEMENTATION in ("c", "python")
    loop = VirtualLoop()
    try:
        wheel = TimingWheel(loop=loop)
        assert wheel.stats().implementation == IMPLEMENTATION
    finally:
        loop.close()


def test_pure_env_forces_python() -> None:
    env = {**os.environ, "TICKWHEEL_PURE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", "import tickwheel.wheel as w; print(w.IMPLEMENTATION)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "python"


def test_compiled_is_in_use_when_required() -> None:
    """IMPLEMENTATION names what runs: the C core whenever it was built and
    TICKWHEEL_PURE is not set, and the public TimingWheel, Timer and Timeout are that
    implementation's, whose wheels report it in stats(). Fails (never skips) under
    TICKWHEEL_REQUIRE_COMPILED=1 unless the C core runs."""
    impl = tickwheel.wheel.IMPLEMENTATION
    pure = os.environ.get("TICKWHEEL_PURE", "") not in ("", "0")
    assert impl == ("python" if pure or not compiled_available() else "c")
    for name in ("TimingWheel", "Timer", "Timeout"):
        assert getattr(tickwheel.wheel, name) is getattr(IMPLS[impl], name), name
    loop = VirtualLoop()
    try:
        assert tickwheel.wheel.TimingWheel(loop=loop).stats().implementation == impl
    finally:
        loop.close()
    if os.environ.get("TICKWHEEL_REQUIRE_COMPILED", "") not in ("", "0"):
        assert impl == "c", "TICKWHEEL_REQUIRE_COMPILED=1 but the pure-Python wheel is in use"


def test_compiled_wheel_refuses_until_initialised() -> None:
    """The C base type alone (no __init__) raises instead of crashing."""
    if "c" not in IMPLS:  # a fallback install: nothing compiled to check
        assert tickwheel.wheel.IMPLEMENTATION == "python"
        return
    from tickwheel.wheel import _cwheel

    bare = _cwheel.Wheel()
    with pytest.raises(RuntimeError, match="not initialised"):
        bare.schedule(1.0, print)
    with pytest.raises(RuntimeError, match="not initialised"):
        bare._run()  # a wake-up reaching a wheel the GC cleared
    assert len(bare) == 0
    assert bare.next_when() is None
