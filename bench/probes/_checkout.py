"""Another checkout's ``durable/`` in place of this one's, for a before/after beside the
same peers and the same Redis (``--durable-dir`` of the ``durable_compare`` probe and of
``python -m bench.probes.callgrind durable-redis``).

Extract the other version first, e.g. ``git archive <commit> durable | tar -x -C /tmp/old``,
and pass ``/tmp/old/durable``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def load_durable(folder: str) -> None:
    """Make ``tickwheel.durable`` the package in ``folder`` (before anything imports it)."""
    import tickwheel.wheel  # noqa: F401  (the durable layer imports it)

    init = Path(folder) / "__init__.py"
    spec = importlib.util.spec_from_file_location(
        "tickwheel.durable", init, submodule_search_locations=[folder]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tickwheel.durable"] = module
    spec.loader.exec_module(module)


def redis_server_type() -> Any:
    """This checkout's RedisServer, loaded from its folder (it imports nothing of the
    library but its sibling ``_processes``), so that a --durable-dir from before the layer
    packages works too. The folder is made a package of its own name, for the relative
    import; its ``__init__`` (which imports the other servers) is not run."""
    name = "_bench_servers"
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [str(ROOT / "durable" / "servers")]
        sys.modules[name] = package
    return importlib.import_module(f"{name}._redis").RedisServer
