"""Both implementations of tickwheel.wheel, for tests that run against each.

``IMPLS`` maps a name to the namespace of one implementation: the pure-Python reference
always, the compiled core when it was built (CI demands it: test_wheel_impl.py fails when
``TICKWHEEL_REQUIRE_COMPILED=1`` and it is not the one in use). The ``wheel_impl``
fixture (conftest.py) rebinds the public names a test module imported to one of them.
"""

from __future__ import annotations

import types

from tickwheel.wheel import _driver, _handle
from tickwheel.wheel._impl import compiled_available

IMPLS: dict[str, types.SimpleNamespace] = {
    "python": types.SimpleNamespace(
        name="python", TimingWheel=_driver.TimingWheel, Timer=_handle.Timer
    ),
}
if compiled_available():
    from tickwheel.wheel import _cdriver

    IMPLS["c"] = types.SimpleNamespace(
        name="c", TimingWheel=_cdriver.TimingWheel, Timer=_cdriver.Timer
    )
