"""Which implementation of the wheel's hot path is in use: ``"c"`` or ``"python"``.

Issue 12 plans a compiled core (``tickwheel.wheel._cwheel``) with the pure-Python
modules kept as the executable reference and fallback. ``TICKWHEEL_PURE=1`` forces the
pure-Python one. The compiled core is not built yet: this module looks for it, so the
name ``IMPLEMENTATION`` always says what actually runs, today ``"python"``.
"""

from __future__ import annotations

import os
from typing import Final, Literal

__all__ = ["IMPLEMENTATION", "PURE_ENV"]

#: Set to 1 to force the pure-Python implementation.
PURE_ENV: Final = "TICKWHEEL_PURE"


def _select() -> Literal["c", "python"]:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return "python"
    # The compiled core will be imported and wired in here (falling back to "python"
    # on ImportError); until it exists, nothing but the pure-Python modules runs.
    return "python"


IMPLEMENTATION: Final[Literal["c", "python"]] = _select()
