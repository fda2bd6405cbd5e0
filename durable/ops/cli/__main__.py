"""``python -m tickwheel.durable.ops.cli``: the same as the ``tickwheel`` command."""

from __future__ import annotations

import sys

from . import main

sys.exit(main())
