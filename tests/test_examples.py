"""Every example runs to its end on a fresh install, at a tiny size: a
fresh process each, on the CPU, in a scratch directory."""
import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"

# (script, tiny arguments, a line its end prints, the picture it saves)
RUNS = [
    ("nbody.py", ["--n", "64", "--steps", "2"], "energy", None),
    ("inverse_design.py", ["--steps", "2"], "misfit fell", None),
    ("rbf_fit.py", ["--n", "300", "--steps", "1"], "saved rbf_fit.png", "rbf_fit.png"),
    ("sharded.py", ["--n", "3000"], "error", None),
    ("vortex_rings.py", ["--n", "16", "--tracers", "8", "--steps", "2", "--every", "2",
                         "--compare-steps", "1", "--leaf-size", "32", "--out", "rings.png"],
     "wrote rings.png", "rings.png"),
]


@pytest.mark.parametrize("script, args, says, picture", RUNS, ids=[r[0] for r in RUNS])
def test_example_runs(script, args, says, picture, tmp_path):
    # The suite's compile settings (tests/compile_settings.py), four host devices included.
    env = dict(os.environ, JAX_PLATFORMS="cpu", MPLBACKEND="Agg")
    run = subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert says in run.stdout, run.stdout[-2000:]
    if picture:
        assert (tmp_path / picture).stat().st_size > 10_000
