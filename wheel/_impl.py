"""Which implementation of the wheel's hot path is in use: ``"c"`` or ``"python"``.

The compiled core (``tickwheel.wheel._cwheel``, built from ``_cwheel.c`` at install time
where a C compiler and the Python headers exist) runs unless ``TICKWHEEL_PURE=1`` is set
or it was not built; then the pure-Python modules, which are also its executable
reference, do. ``IMPLEMENTATION`` says what actually runs.
"""

from __future__ import annotations

import importlib
import os
from typing import Final, Literal

__all__ = ["IMPLEMENTATION", "PURE_ENV", "compiled_available"]

#: Set to 1 to force the pure-Python implementation.
PURE_ENV: Final = "TICKWHEEL_PURE"


def compiled_available() -> bool:
    """True if the C core was built and imports (whatever ``TICKWHEEL_PURE`` says)."""
    try:
        importlib.import_module("._cwheel", __package__)
    except ImportError:
        return False
    return True


def _select() -> Literal["c", "python"]:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return "python"
    return "c" if compiled_available() else "python"


IMPLEMENTATION: Final[Literal["c", "python"]] = _select()
