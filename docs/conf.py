"""Sphinx configuration for the crossover user guide (MyST Markdown, built offline)."""

from __future__ import annotations

project = "crossover"
author = "the crossover developers"
copyright = "the crossover developers"
release = "0.1.0"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
# results/<machine>/ holds raw output, indexed by results.md; results/*.md (the measurement logs) are pages
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "results/*/*.md", "results/*/*/*.md"]

# No network: no intersphinx, no remote images, no link checking by default.
myst_heading_anchors = 3

html_theme = "alabaster"
html_title = "crossover"
html_static_path: list[str] = []
