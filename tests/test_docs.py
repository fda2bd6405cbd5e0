"""The docs pages' Python examples, so that none goes stale (tests/test_readme.py does the
same for the README's).

A ```python block is run when the last non-blank line before it is a marker comment:

- ``<!-- runnable -->``: executed as a script, with ``$REDIS_URL`` naming a redis-server
  of the test's own (started here, stopped after it);
- ``<!-- runnable: postgres -->``: the same, with ``$POSTGRES_URL`` naming an empty
  database of the test's own on the session's PostgreSQL.

Every other ```python block (marked ``<!-- compile-only: why -->``, or not marked, as a
page another change adds may be) is compiled, top-level ``await`` allowed: it needs a
framework, a server of the reader's or the surrounding prose, and can only be checked
for syntax. The getting-started pages must keep runnable examples.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)
MARKER = re.compile(r"<!-- (runnable|runnable: postgres|compile-only: [^>]+) -->")
# Pages whose examples must run, not only compile.
MUST_RUN = (
    "guide-first-job.md",
    "guide-recurring.md",
    "guide-payments.md",
    "guide-wheel-server.md",
    "wheel.md",
    "durable.md",
)


@dataclass(frozen=True)
class Block:
    page: str  # path under docs/
    line: int  # line of the opening fence
    kind: str  # "run", "postgres" or "compile"
    code: str


def docs_blocks() -> list[Block]:
    found = []
    for path in sorted(DOCS.rglob("*.md")):
        text = path.read_text(encoding="utf-8")
        for fence in FENCE.finditer(text):
            before = text[: fence.start()].rstrip().rsplit("\n", 1)[-1].strip()
            marker = MARKER.fullmatch(before)
            label = marker.group(1) if marker else "compile-only"
            kind = {"runnable": "run", "runnable: postgres": "postgres"}.get(label, "compile")
            found.append(
                Block(
                    page=path.relative_to(DOCS).as_posix(),
                    line=text.count("\n", 0, fence.start()) + 1,
                    kind=kind,
                    code=fence.group(1),
                )
            )
    return found


BLOCKS = docs_blocks()


def _id(block: Block) -> str:
    return f"{block.page}:{block.line}"


def test_the_getting_started_pages_keep_runnable_examples() -> None:
    running = {b.page for b in BLOCKS if b.kind != "compile"}
    assert set(MUST_RUN) <= running, sorted(set(MUST_RUN) - running)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "compile"], ids=_id)
def test_compile_only_examples_compile(block: Block) -> None:
    compile(block.code, _id(block), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


@pytest.mark.redis
@pytest.mark.filterwarnings("ignore::tickwheel.durable.ServerConfigWarning")  # test Redis: no AOF
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind != "compile"], ids=_id)
def test_runnable_examples_run(
    block: Block, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    redis = request.getfixturevalue("private_redis")
    monkeypatch.setenv("REDIS_URL", redis.url)
    if block.kind == "postgres":
        monkeypatch.setenv("POSTGRES_URL", request.getfixturevalue("pg_url"))
    # Each block is a script of its own: a fresh namespace, as `python file.py` gets.
    exec(compile(block.code, _id(block), "exec", dont_inherit=True), {"__name__": "__main__"})


def test_the_home_page_has_the_readmes_quick_start() -> None:
    def commands(text: str) -> list[str]:
        section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
        return [c.strip() for c in re.findall(r"```sh\n(.*?)```", section, re.S)]

    readme = commands((ROOT / "README.md").read_text(encoding="utf-8"))
    assert commands((DOCS / "index.md").read_text(encoding="utf-8")) == readme


def test_every_cited_test_exists() -> None:
    """A page that cites ``tests/test_x.py`` or ``tests/test_x.py::test_name`` (the
    "how it works" page does, for every guarantee) names a file and a test that exist."""
    cited = 0
    for path in sorted(DOCS.rglob("*.md")):
        text = path.read_text(encoding="utf-8")
        for file, name in re.findall(r"\b(tests/[\w/]+\.py)(?:::(\w+))?", text):
            assert (ROOT / file).is_file(), f"{path.name} cites {file}"
            if name:
                source = (ROOT / file).read_text(encoding="utf-8")
                assert re.search(rf"^(async )?def {name}\(", source, re.M), (
                    f"{path.name} cites {file}::{name}"
                )
                cited += 1
    assert cited >= 30  # how-it-works.md's table
