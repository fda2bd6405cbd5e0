"""Both implementations of tickwheel.wheel, for tests that run against each.

``IMPLS`` maps a name to the namespace of one implementation: the pure-Python reference
always, the compiled core when it was built (CI demands it: test_wheel_impl.py fails when
``TICKWHEEL_REQUIRE_COMPILED=1`` and it is not the one in use). The ``wheel_impl``
fixture (conftest.py) rebinds the public names a test module imported to one of them.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, Protocol

from tickwheel.wheel import _driver, _handle, _timeout
from tickwheel.wheel._core import Core, Entry
from tickwheel.wheel._impl import compiled_available

IMPLS: dict[str, types.SimpleNamespace] = {
    "python": types.SimpleNamespace(
        name="python",
        TimingWheel=_driver.TimingWheel,
        Timer=_handle.Timer,
        Timeout=_timeout.Timeout,
    ),
}
if compiled_available():
    from tickwheel.wheel import _cdriver

    IMPLS["c"] = types.SimpleNamespace(
        name="c", TimingWheel=_cdriver.TimingWheel, Timer=_cdriver.Timer, Timeout=_cdriver.Timeout
    )


def check_wheel(wheel: Any) -> None:
    """Assert a wheel's invariants, the core's and the driver's (O(n)): the pure-Python
    wheel's own ``_check()``, or the compiled wheel's through its test hooks."""
    if isinstance(wheel, _driver.TimingWheel):
        wheel._check()
    else:
        from tickwheel.wheel import _cwheel_testing

        _cwheel_testing.check(wheel)


# -- the two cores on integer ticks, behind one interface (the model tests use it) -------


class Item(Entry):
    __slots__ = ("key",)

    def __init__(self, key: int) -> None:
        self.key = key
        self._bucket = None

    def __repr__(self) -> str:
        return f"Item({self.key}, due={self._deadline})"


class Adapter(Protocol):
    """The core operations the model drives, on integer ticks, with timers named by key."""

    def insert(self, key: int, deadline: int) -> int: ...
    def remove(self, key: int) -> bool: ...
    def move(self, key: int, deadline: int) -> int: ...
    def pending(self, key: int) -> bool: ...
    def deadline(self, key: int) -> int: ...
    def advance(self, now: int) -> list[tuple[int, int]]: ...  # (key, deadline) fired
    def next_deadline(self) -> int | None: ...
    def check(self) -> None: ...
    def __len__(self) -> int: ...


class PythonCore:
    def __init__(self, start: int) -> None:
        self.core: Core[Item] = Core(start)
        self.items: dict[int, Item] = {}

    def insert(self, key: int, deadline: int) -> int:
        item = self.items[key] = Item(key)
        return self.core.insert(item, deadline)

    def remove(self, key: int) -> bool:
        return self.core.remove(self.items[key])

    def move(self, key: int, deadline: int) -> int:
        return self.core.move(self.items[key], deadline)

    def pending(self, key: int) -> bool:
        return self.items[key]._bucket is not None

    def deadline(self, key: int) -> int:
        return self.items[key]._deadline

    def advance(self, now: int) -> list[tuple[int, int]]:
        got: list[tuple[int, int]] = []
        while (bucket := self.core.pop_due(now)) is not None:
            for item in list(bucket):
                if item._bucket is bucket:
                    item._bucket = None
                    self.core._len -= 1
                    got.append((item.key, item._deadline))
        return got

    def next_deadline(self) -> int | None:
        return self.core.next_deadline()

    def check(self) -> None:
        self.core._check()

    def __len__(self) -> int:
        return len(self.core)


class _StubLoop:
    """All a wheel needs to be made; the tick-level methods never touch the loop."""

    def __init__(self, start: int) -> None:
        self.start = float(start)

    def time(self) -> float:
        return self.start

    def call_at(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the tick-level core must not arm the loop")


class CompiledCore:
    def __init__(self, start: int) -> None:
        from tickwheel.wheel import _cwheel_testing
        from tickwheel.wheel._cdriver import TimingWheel

        self.hooks = _cwheel_testing
        self.wheel = TimingWheel(tick=1.0, loop=_StubLoop(start))  # type: ignore[arg-type]
        self.timers: dict[int, Any] = {}
        self.keys: dict[int, int] = {}  # id(timer) -> key

    def insert(self, key: int, deadline: int) -> int:
        timer, used = self.hooks.insert(self.wheel, print, deadline)
        self.timers[key] = timer
        self.keys[id(timer)] = key
        return used

    def remove(self, key: int) -> bool:
        return self.timers[key].cancel()

    def move(self, key: int, deadline: int) -> int:
        return self.hooks.move(self.wheel, self.timers[key], deadline)

    def pending(self, key: int) -> bool:
        return bool(self.timers[key].pending())

    def deadline(self, key: int) -> int:
        return int(self.timers[key]._deadline)

    def advance(self, now: int) -> list[tuple[int, int]]:
        return [(self.keys[id(t)], t._deadline) for t in self.hooks.advance(self.wheel, now)]

    def next_deadline(self) -> int | None:
        return self.hooks.next_deadline(self.wheel)

    def check(self) -> None:
        self.hooks.check_core(self.wheel)

    def __len__(self) -> int:
        return len(self.wheel)


#: A core on integer ticks, started at a tick, per implementation.
CORES: dict[str, Callable[[int], Adapter]] = {"python": PythonCore}
if "c" in IMPLS:
    CORES["c"] = CompiledCore
