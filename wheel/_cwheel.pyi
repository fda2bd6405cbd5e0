# The compiled core (wheel/_cwheel.c and the parts in wheel/csrc/). Its public faces are
# _cdriver.TimingWheel (a subclass of Wheel), Timer and Timeout, with the same API as the
# pure-Python classes. The tests' hooks into it are in _cwheel_testing.
import asyncio
import contextvars
from collections.abc import Callable
from types import TracebackType
from typing import Any, final

from ._handle import Timer as _PyTimer

NLEVELS: int

@final
class Timer:
    def cancel(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def pending(self) -> bool: ...
    def when(self) -> float: ...
    def reschedule(self, delay: float) -> bool: ...
    def reschedule_at(self, when: float) -> bool: ...
    @property
    def callback(self) -> Callable[..., object] | None: ...
    @property
    def args(self) -> tuple[Any, ...]: ...
    @property
    def context(self) -> contextvars.Context | None: ...
    @property
    def _wheel(self) -> Wheel: ...
    @property
    def _deadline(self) -> int: ...
    @property
    def _fired(self) -> bool: ...

class Wheel:
    _tick: float
    _loop: asyncio.AbstractEventLoop
    _time: Callable[[], float]
    _context: contextvars.Context
    _handle: asyncio.TimerHandle | None
    _max_pending: int | None
    _capacity: float
    _armed_tick: float
    _fired: int
    _wakeups: int
    _cancelled: int
    _late_max: float
    _late_sum: float
    _closed: bool
    @property
    def _len(self) -> int: ...
    @property
    def _levels(self) -> int: ...
    @property
    def _elapsed(self) -> int: ...
    def __len__(self) -> int: ...
    def schedule(
        self,
        delay: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> _PyTimer: ...
    def schedule_at(
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> _PyTimer: ...
    def next_when(self) -> float | None: ...
    def _run(self) -> None: ...
    def _drain(self) -> list[_PyTimer]: ...
    def _disarm(self) -> None: ...
    # The wheel-timed loops' handles (csrc/handle.h): filed by _file, fired onto the
    # list _set_due gave.
    def _file(self, handle: asyncio.TimerHandle, when: float) -> asyncio.TimerHandle: ...
    def _set_due(self, due: list[Any]) -> None: ...
    def _init_core(
        self,
        tick: float,
        loop: asyncio.AbstractEventLoop,
        time: Callable[[], float],
        context: contextvars.Context,
        max_pending: int | None,
        elapsed: int,
        capacity: float,
    ) -> None: ...

@final
class Timeout:
    def __init__(self, wheel: Wheel, when: float | None) -> None: ...
    def when(self) -> float | None: ...
    def reschedule(self, when: float | None) -> None: ...
    def expired(self) -> bool: ...
    async def __aenter__(self) -> Timeout: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None: ...
    def _on_timeout(self) -> None: ...
    @property
    def _timer(self) -> Timer | None: ...
    @property
    def _state(self) -> str: ...
    @property
    def _wheel(self) -> Wheel: ...

def _setup(
    closed: type[Exception],
    full: type[Exception],
    slow_when_after: Callable[[Wheel, Any], tuple[float, float]],
    slow_check_when: Callable[[Any], float],
    timer_repr: Callable[[Timer], str],
    current_task: Callable[[], asyncio.Task[Any] | None],
    cancelled_error: type[BaseException],
) -> None: ...
def _make_loop_handle(
    base: type[asyncio.TimerHandle],
    handle_cancel: Callable[[asyncio.Handle], None],
    check_when: Callable[[Any], float],
) -> type[asyncio.TimerHandle]: ...
