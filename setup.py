"""Build hook: compile the wheel's C core (tickwheel.wheel._cwheel) when possible.

pyproject.toml holds the metadata. The extension is optional: with no compiler or no
Python headers (or any other build error) the install goes on, says so, and the
pure-Python wheel runs with the same behaviour.
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that reports a failed compile and carries on without the extension."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # any failure means: fall back
            self._fell_back(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._fell_back(exc)

    @staticmethod
    def _fell_back(exc: BaseException) -> None:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        print(
            f"tickwheel: C core not built ({reason}); using the pure-Python wheel",
            file=sys.stderr,
        )


setup(
    ext_modules=[
        Extension(
            "tickwheel.wheel._cwheel",
            sources=["wheel/_cwheel.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
