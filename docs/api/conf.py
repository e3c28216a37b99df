"""Sphinx configuration of jfmm's API reference (built by tests/test_docs.py
with warnings as errors, so that a docstring that does not render fails)."""
import os
import sys

sys.path.insert(0, os.path.abspath("../.."))

project = "jfmm"
extensions = ["sphinx.ext.autodoc"]
autodoc_member_order = "bysource"
autodoc_typehints = "none"
default_role = "code"              # `x` in docstrings is code, as written
html_theme = "alabaster"
exclude_patterns = ["_build"]


def _plain_text(app, what, name, obj, options, lines):
    """jfmm's docstrings are plain text with `code` in backticks: |r| is a
    norm, not a substitution, and a * a product, not emphasis."""
    for i, line in enumerate(lines):
        lines[i] = line.replace("\\", "\\\\").replace("|", "\\|").replace("*", "\\*")


def setup(app):
    app.connect("autodoc-process-docstring", _plain_text)
