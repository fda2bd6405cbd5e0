"""Installing the project: the C core is built where a compiler exists, and a missing
compiler falls back to the pure-Python wheel without failing the install.

Each test copies the sources to a scratch directory, makes a fresh venv and runs a real
``pip install --no-deps .`` (build isolation on: pip fetches the build requirements from
its configured index, as any user's install does), then imports the result in that venv.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import venv

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = ("pyproject.toml", "setup.py", "README.md", "wheel", "durable")

# A small wheel test for the installed package: order, never early, a timeout.
SMOKE = """
import asyncio
import tickwheel.wheel as w

async def main():
    loop = asyncio.get_running_loop()
    wheel = w.TimingWheel()
    fired = []
    start = loop.time()
    # Deadlines from one instant (schedule_at): on a loaded machine the process can be
    # preempted between two schedule(delay) calls, which moves a later call's deadline.
    for i, delay in enumerate([0.03, 0.0, 0.01, 0.02, 0.0]):
        record = lambda i=i, d=delay: fired.append((i, loop.time() - start - d))
        wheel.schedule_at(start + delay, record)
    wheel.schedule(0.05, print).cancel()
    await asyncio.sleep(0.1)
    assert [i for i, _ in fired] == [1, 4, 2, 3, 0], fired
    assert all(late >= 0 for _, late in fired), fired
    try:
        async with w.timeout(0.01):
            await asyncio.sleep(1)
    except TimeoutError:
        pass
    else:
        raise AssertionError("no timeout")
    assert wheel.stats().implementation == w.IMPLEMENTATION
    print(w.IMPLEMENTATION)

asyncio.run(main())
"""


def _install(tmp_path: pathlib.Path, env: dict[str, str]) -> tuple[pathlib.Path, str]:
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
        else:
            shutil.copy2(path, src / name)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    proc = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "-v", "."],
        cwd=src,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return python, proc.stdout + proc.stderr


def _run_smoke(python: pathlib.Path, tmp_path: pathlib.Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKWHEEL_")}
    proc = subprocess.run(
        [str(python), "-c", SMOKE],
        cwd=tmp_path,  # not the sources: the installed package must be the one imported
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.slow
def test_install_builds_the_c_core(tmp_path: pathlib.Path) -> None:
    python, log = _install(tmp_path, dict(os.environ))
    assert "C core not built" not in log
    assert _run_smoke(python, tmp_path) == "c"


@pytest.mark.slow
def test_install_without_a_compiler_falls_back(tmp_path: pathlib.Path) -> None:
    python, log = _install(tmp_path, {**os.environ, "CC": "false"})
    assert "tickwheel: C core not built" in log
    assert "using the pure-Python wheel" in log
    assert _run_smoke(python, tmp_path) == "python"
