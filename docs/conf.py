"""Sphinx configuration of the ojs_kombu documentation (``python -m sphinx -W -b html docs
docs/_build/html``)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

import ojs_kombu

project = "ojs_kombu"
author = "the ojs_kombu authors"
copyright = "2026, the ojs_kombu authors"
release = ojs_kombu.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
    "sphinx_click",
    "ojs_docs",
]
exclude_patterns = ["_build"]
html_theme = "furo"
html_title = f"ojs_kombu {release}"
# Every broken cross-reference of the docstrings would be a warning (-W: an error);
# the docstrings name private helpers and dependencies' internals freely, so only
# the pages' own references are checked (a :ref: or :doc: that does not resolve is
# always an error).
nitpicky = False
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
# Docstrings name Celery, kombu and pydantic objects; no network at build time.
intersphinx_mapping: dict[str, tuple[str, str | None]] = {}
suppress_warnings = ["ref.python"]
autodoc_inherit_docstrings = False
# Option names (--yes) and quotes in the generated tables stay as typed.
smartquotes = False

# Counts the pages give, from the code (never written by hand).
_exchanges = ojs_kombu.TopologyNames().exchanges(events=False, delayed=False)
rst_epilog = f"""
.. |ojs_exchange_count| replace:: {len(_exchanges)}
"""
