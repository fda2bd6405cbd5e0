"""Typed payloads: a task's payload type checked at schedule time and rebuilt for its handler.

A typed task (``async def send(ctx: TaskContext, args: ReminderArgs)``) names its payload
type; :class:`PayloadType` is that type's codec:

- :meth:`PayloadType.encode` checks a value before anything is written (a wrong type
  or a missing field is an error naming the field, e.g. ``payload.user``) and turns it
  into the JSON value that is stored (a dict);
- :meth:`PayloadType.decode` makes the type again from the stored dict, in the worker,
  for the handler.

Three kinds of type: a dataclass (instances only; fields checked against their
annotations), a ``TypedDict`` (a dict with its required keys and no others, each value
checked), a pydantic model (validated by pydantic; pydantic is imported only for a type
that is a pydantic model). The checks cover the annotations JSON payloads use: ``int``,
``float``, ``str``, ``bool``, ``None``, ``Any``, unions and ``Optional``, ``Literal``,
``list[X]``, ``dict[str, X]`` and nested dataclasses and TypedDicts; a value of another
annotation is checked with ``isinstance`` when the annotation is a class, else taken
as it is. The stored value still goes through the JSON payload codec, which refuses
what does not come back equal.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin, is_typeddict

__all__ = ["PayloadType"]


def _name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or repr(tp)


def _is_pydantic(tp: Any) -> bool:
    return isinstance(tp, type) and any(
        (c.__module__ or "").startswith("pydantic") for c in tp.__mro__[1:]
    )


def _hints(tp: Any) -> dict[str, Any]:
    """The annotations of a dataclass or TypedDict, resolved (a name that cannot be
    resolved, e.g. a class local to a function, is taken as ``Any``)."""
    try:
        return typing.get_type_hints(tp)
    except Exception:
        return dict.fromkeys(getattr(tp, "__annotations__", {}), Any)


def _wrong(path: str, tp: Any, value: Any) -> TypeError:
    return TypeError(f"{path} must be {_name(tp)}, got {type(value).__name__} {value!r:.60}")


def _check(value: Any, tp: Any, path: str) -> None:
    """Raise naming ``path`` if ``value`` does not fit the annotation ``tp``."""
    if tp is Any or tp is object:
        return
    if tp is None or tp is type(None):
        if value is not None:
            raise _wrong(path, None, value)
        return
    origin, args = get_origin(tp), get_args(tp)
    if origin is Union or origin is types.UnionType:
        errors: list[Exception] = []
        for arm in args:
            try:
                _check(value, arm, path)
            except (TypeError, ValueError) as exc:
                if _shallow(value, arm):  # the arm it is meant for: its error is the one
                    errors.append(exc)
                continue
            return
        if len(errors) == 1:
            raise errors[0]
        raise TypeError(
            f"{path} must be {' | '.join(_name(a) for a in args)}, got {type(value).__name__}"
        )
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{path} must be one of {list(args)!r}, got {value!r:.60}")
        return
    if origin is list:
        if not isinstance(value, list):
            raise _wrong(path, list, value)
        for k, item in enumerate(value):
            _check(item, args[0] if args else Any, f"{path}[{k}]")
        return
    if origin is dict:
        if not isinstance(value, dict):
            raise _wrong(path, dict, value)
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{path} keys must be str, got {type(key).__name__}")
            _check(item, args[1] if len(args) == 2 else Any, f"{path}[{key!r}]")
        return
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _wrong(path, float, value)
        return
    if tp is int and isinstance(value, bool):
        raise _wrong(path, int, value)
    if is_typeddict(tp):
        _check_typeddict(value, tp, path)
        return
    if isinstance(tp, type):
        if not isinstance(value, tp):
            raise _wrong(path, tp, value)
        if dataclasses.is_dataclass(tp):
            hints = _hints(tp)
            for f in dataclasses.fields(tp):
                _check(getattr(value, f.name), hints.get(f.name, Any), f"{path}.{f.name}")


def _shallow(value: Any, tp: Any) -> bool:
    """Whether ``value`` is of ``tp``'s outer class (not looking inside)."""
    outer = get_origin(tp) or tp
    if is_typeddict(tp):
        return isinstance(value, dict)
    return isinstance(outer, type) and isinstance(value, outer)


def _check_typeddict(value: Any, tp: Any, path: str) -> None:
    if not isinstance(value, dict):
        raise _wrong(path, tp, value)
    hints = _hints(tp)
    missing = sorted(set(tp.__required_keys__) - value.keys())
    if missing:
        raise ValueError(f"{path}.{missing[0]} is missing ({_name(tp)} requires it)")
    unknown = sorted(str(k) for k in value.keys() - hints.keys())
    if unknown:
        raise ValueError(f"{path}.{unknown[0]} is not a field of {_name(tp)}")
    for key, item in value.items():
        _check(item, hints[key], f"{path}.{key}")


def _build(tp: Any, data: Any) -> Any:
    """The value of annotation ``tp`` from its stored JSON form."""
    origin, args = get_origin(tp), get_args(tp)
    if origin is Union or origin is types.UnionType:
        if data is None:
            return None
        arms = [a for a in args if a is not type(None)]
        return _build(arms[0], data) if len(arms) == 1 else data
    if origin is list and args and isinstance(data, list):
        return [_build(args[0], item) for item in data]
    if origin is dict and len(args) == 2 and isinstance(data, dict):
        return {k: _build(args[1], v) for k, v in data.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and isinstance(data, dict):
        hints = _hints(tp)
        return tp(**{k: _build(hints.get(k, Any), v) for k, v in data.items()})
    if is_typeddict(tp) and isinstance(data, dict):
        hints = _hints(tp)
        return {k: _build(hints.get(k, Any), v) for k, v in data.items()}
    if _is_pydantic(tp):
        return tp.model_validate(data)
    return data


class PayloadType:
    """The codec of one payload type (a dataclass, a TypedDict or a pydantic model).

    Raises:
        TypeError: if ``tp`` is none of those.
    """

    __slots__ = ("kind", "tp")

    def __init__(self, tp: Any) -> None:
        if _is_pydantic(tp):
            self.kind = "pydantic"
        elif is_typeddict(tp):
            self.kind = "typeddict"
        elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
            self.kind = "dataclass"
        else:
            raise TypeError(
                f"a task's payload type must be a dataclass, a TypedDict or a pydantic"
                f" model, got {tp!r}"
            )
        self.tp = tp

    @property
    def name(self) -> str:
        return _name(self.tp)

    def encode(self, value: Any) -> Any:
        """Check ``value`` and return its stored form (a dict).

        Raises:
            TypeError, ValueError: naming the field (``payload.<field>``).
        """
        if self.kind == "dataclass":
            _check(value, self.tp, "payload")
            return dataclasses.asdict(value)
        if self.kind == "typeddict":
            _check_typeddict(value, self.tp, "payload")
            return value
        return self._encode_pydantic(value)

    def _encode_pydantic(self, value: Any) -> Any:
        import pydantic  # noqa: PLC0415  (the type is a pydantic model: it is installed)

        if not isinstance(value, self.tp | dict):
            raise _wrong("payload", self.tp, value)
        try:
            data = value if isinstance(value, dict) else value.model_dump()
            model = self.tp.model_validate(data)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in ("payload", *first["loc"]))
            raise ValueError(f"{where}: {first['msg']}") from None
        return model.model_dump(mode="json")

    def decode(self, stored: Any) -> Any:
        """The payload type's value from its stored form (what the handler gets)."""
        return _build(self.tp, stored)
