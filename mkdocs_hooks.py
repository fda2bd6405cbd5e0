"""MkDocs hook: lets mkdocstrings read tickwheel's sources under their import names.

The folders ``wheel/`` and ``durable/`` are installed as ``tickwheel.wheel`` and
``tickwheel.durable`` (setuptools' ``package-dir``), and there is no ``tickwheel/``
folder for a static reader to find. This hook asks the installed package where each
subpackage lives (the editable install points at the source folders) and links them
under ``build/api-src/tickwheel/``, the path mkdocs.yml gives mkdocstrings.

After the build it checks that the API reference pages document every name of
``tickwheel.wheel.__all__`` and ``tickwheel.durable.__all__``: a missing one is a warning,
which ``strict: true`` turns into a failed build.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
API_SRC = ROOT / "build" / "api-src" / "tickwheel"
PACKAGES = ("wheel", "durable")
# mkdocstrings gives each documented object an anchor named by its path.
_ANCHOR = re.compile(r'id="tickwheel\.(wheel|durable)\.(?:[A-Za-z_.]+\.)?([A-Za-z_0-9]+)"')

log = logging.getLogger("mkdocs.plugins.tickwheel_api")
_documented: set[tuple[str, str]] = set()


def _link_installed_packages() -> None:
    API_SRC.mkdir(parents=True, exist_ok=True)
    for name in PACKAGES:
        spec = importlib.util.find_spec(f"tickwheel.{name}")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError(f"tickwheel.{name} is not installed: pip install -e '.[docs]'")
        source = Path(next(iter(spec.submodule_search_locations))).resolve()
        link = API_SRC / name
        if link.is_symlink() or link.exists():
            if link.resolve() == source:
                continue
            link.unlink()
        link.symlink_to(source, target_is_directory=True)


_link_installed_packages()


def on_page_content(html: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri.startswith("reference/"):
        _documented.update(_ANCHOR.findall(html))
    return html


def on_post_build(**kwargs: Any) -> None:
    for package in PACKAGES:
        module = importlib.import_module(f"tickwheel.{package}")
        missing = [n for n in module.__all__ if (package, n) not in _documented]
        if missing:
            log.warning(
                "docs/reference/%s.md does not document tickwheel.%s.%s",
                package,
                package,
                ", ".join(missing),
            )
