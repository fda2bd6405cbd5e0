"""Build hook: compile the wheel's C core (tickwheel.wheel._cwheel) when possible, and
its test hooks (tickwheel.wheel._cwheel_testing) beside it.

pyproject.toml holds the metadata. The extensions are optional: with no compiler or no
Python headers (or any other build error) the install goes on, says so, and the
pure-Python wheel runs with the same behaviour.
"""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

CORE = "tickwheel.wheel._cwheel"
# The parts _cwheel.c includes (one translation unit) and _cwheel_testing.c shares.
PARTS = sorted(p.as_posix() for p in Path("wheel", "csrc").glob("*.h"))


class OptionalBuildExt(build_ext):
    """build_ext that reports a failed compile and carries on without the extension."""

    _core_failed = False

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # any failure means: fall back
            self._fell_back(exc)

    def build_extension(self, ext: Extension) -> None:
        if ext.name != CORE and self._core_failed:
            return  # the test hooks are of no use without the core
        try:
            super().build_extension(ext)
        except Exception as exc:
            if ext.name == CORE:
                self._core_failed = True
                self._fell_back(exc)
            else:
                print(f"tickwheel: {ext.name} not built ({_reason(exc)})", file=sys.stderr)

    @staticmethod
    def _fell_back(exc: BaseException) -> None:
        print(
            f"tickwheel: C core not built ({_reason(exc)}); using the pure-Python wheel",
            file=sys.stderr,
        )


def _reason(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__


setup(
    ext_modules=[
        Extension(
            CORE,
            sources=["wheel/_cwheel.c"],
            depends=PARTS,
            extra_compile_args=["-O2"],
            optional=True,
        ),
        # The hooks the tests drive the compiled core with, kept out of the module users
        # import (wheel/_cwheel_testing.c says what they are).
        Extension(
            "tickwheel.wheel._cwheel_testing",
            sources=["wheel/_cwheel_testing.c"],
            depends=PARTS,
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
