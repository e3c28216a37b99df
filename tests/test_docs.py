"""The API reference (docs/api, Sphinx autodoc) builds with warnings as
errors: a docstring that does not render fails the suite."""
import pathlib

from sphinx.cmd.build import build_main

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs" / "api"


def test_api_reference_builds(tmp_path):
    assert build_main(["-W", "--keep-going", "-q", "-b", "html", str(DOCS),
                       str(tmp_path / "html")]) == 0
    page = (tmp_path / "html" / "index.html").read_text()
    for name in ("jfmm.fmm", "jfmm.plan", "jfmm.RBFInterpolator", "jfmm.vortex.velocity",
                 "jfmm.kernels.Gaussian"):
        assert f'id="{name}"' in page, name
