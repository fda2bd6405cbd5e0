"""The :class:`Scheduler` methods that only await a collaborator's (its producer's):
written once, with the collaborator's signature and docstring."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Coroutine
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

if TYPE_CHECKING:
    from ._scheduler import Scheduler

__all__ = ["forward_to"]

P = ParamSpec("P")
R = TypeVar("R")


def forward_to(
    to: str, method: Callable[Concatenate[Any, P], Awaitable[R]]
) -> Callable[Concatenate[Scheduler, P], Coroutine[Any, Any, R]]:
    """A :class:`Scheduler` method that awaits ``method`` on the collaborator held in
    ``self.<to>``: the signature and the docstring are the collaborator's, written once."""
    get = attrgetter(to)

    @functools.wraps(method)
    async def forward(self: Scheduler, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return await method(get(self), *args, **kwargs)

    forward.__qualname__ = f"Scheduler.{method.__name__}"
    return forward
