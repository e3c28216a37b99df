"""jfmm's default for JAX's persistent compilation cache (jfmm._cache), in
a fresh process: the suite's own process has set a folder of its own."""
import os
import subprocess
import sys

import jax
import pytest

from jfmm import _cache, _xla

SCRIPT = """
import os, sys
import jax, jfmm
from jfmm import _cache
home = os.environ["XDG_CACHE_HOME"]
assert jax.config.jax_compilation_cache_dir == os.path.join(home, "jfmm", "xla")
assert jax.config.jax_persistent_cache_min_compile_time_secs == 0     # every program kept
jax.config.update("jax_compilation_cache_dir", None)
os.environ["JFMM_COMPILATION_CACHE"] = os.path.join(home, "mine")
assert _cache.folder() == os.path.join(home, "mine")
for off in ("0", "off", "False"):
    os.environ["JFMM_COMPILATION_CACHE"] = off
    assert _cache.folder() is None
del os.environ["JFMM_COMPILATION_CACHE"]
os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(home, "theirs")
assert _cache.folder() is None
print("ok")
"""


def test_the_cache_folder_follows_the_environment(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("JFMM_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR")}
    env.update(XDG_CACHE_HOME=str(tmp_path), JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_cache_the_process_set_is_left_alone():
    """tests/conftest.py sets the suite's folder after importing jfmm:
    jfmm offers no other."""
    assert jax.config.jax_compilation_cache_dir is not None
    assert _cache.folder() is None


GEMM = """
import os, sys
import jax
import pytest
if sys.argv[1] == "started":
    jax.devices()
import jfmm
print(os.environ.get("XLA_FLAGS", ""))
"""


@pytest.mark.parametrize("case, flags, expected", [
    ("default", None, "--xla_gpu_enable_triton_gemm=false"),
    ("user's flags", "--xla_gpu_enable_triton_gemm=true", "--xla_gpu_enable_triton_gemm=true"),
    ("other flags", "--xla_cpu_enable_fast_math=false",
     "--xla_cpu_enable_fast_math=false --xla_gpu_enable_triton_gemm=false"),
    ("opted out", None, ""),
    ("started", None, ""),
])
def test_triton_gemm_default_follows_the_environment(case, flags, expected):
    """`import jfmm` turns off XLA's Triton GEMMs (`jfmm._xla`) where the
    user's XLA_FLAGS, JFMM_TRITON_GEMM and the backends' start allow."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JFMM_TRITON_GEMM")}
    env["JAX_PLATFORMS"] = "cpu"
    if flags:
        env["XLA_FLAGS"] = flags
    if case == "opted out":
        env["JFMM_TRITON_GEMM"] = "1"
    out = subprocess.run([sys.executable, "-c", GEMM, case.split()[0]], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == expected


def test_once_compiles_lean_at_the_top_and_plainly_inside_traces(monkeypatch):
    """`_xla.once`: a top-level CPU call compiles with ONCE_CPU, a call
    inside jit, grad or vmap with the plain jit (jax refuses compiler
    options on nested jits), and an option this jaxlib refuses falls back
    to the plain jit for good; every route gives the function's values."""
    import jax.numpy as jnp
    import numpy as np

    f = _xla.once(lambda x, k: jnp.sin(x) * k, static_argnums=(1,))
    x = jnp.linspace(0.0, 1.0, 5)
    want = np.sin(np.linspace(0.0, 1.0, 5)) * 3
    np.testing.assert_allclose(f(x, 3), want, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda x: f(x, 3))(x), want, rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(lambda x: f(x, 3))(x[:, None])[:, 0], want, rtol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda x: f(x, 3).sum())(x), 3 * np.cos(np.asarray(x)),
                               rtol=1e-6)
    monkeypatch.setattr(_xla, "ONCE_CPU", {"xla_cpu_no_such_option": True})
    monkeypatch.setattr(_xla, "_once_cpu", [True])
    g = _xla.once(lambda x: 2 * x)
    np.testing.assert_allclose(jax.jit(g)(x), 2 * np.asarray(x))
    assert _xla._once_cpu == [True]                 # nested: the option never tried
    np.testing.assert_allclose(g(x), 2 * np.asarray(x))
    assert _xla._once_cpu == [False]


@pytest.mark.parametrize("backend, env, warns", [
    ("gpu", {}, True), ("cpu", {}, False),
    ("gpu", {"JFMM_TRITON_GEMM": "1"}, False),
    ("gpu", {"XLA_FLAGS": "--xla_gpu_enable_triton_gemm=true"}, False),
])
def test_a_gpu_started_before_import_is_told(monkeypatch, backend, env, warns):
    """Where a GPU backend started before `import jfmm`, the flag cannot
    reach XLA any more: `_xla.enable` says so, unless the user chose."""
    import warnings
    for key in ("XLA_FLAGS", "JFMM_TRITON_GEMM"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(_xla.xla_bridge, "backends_are_initialized", lambda: True)
    monkeypatch.setattr(_xla.jax, "default_backend", lambda: backend)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert not _xla.enable()
    assert [str(w.message) for w in seen] == ([_xla.LATE] if warns else [])


def test_pallas_lowering_finds_the_triton_dialect_at_once():
    """Lowering a Pallas kernel for a GPU (on the CPU) never searches for a
    module of Triton's dialect: `import jfmm` bound its name
    (`_xla.bind_triton_dialect`), which MLIR's bindings otherwise look for
    on every operation's result."""
    import importlib.abc

    import jax.numpy as jnp

    from jfmm.ops import backend
    from jfmm.ops import laplace3d as L
    from jfmm.tree import build

    searched = []

    class Log(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            searched.append(name)

    t = build(jnp.linspace(0, 1, 192, dtype=jnp.float32).reshape(64, 3), None, 2)
    loc = jnp.zeros((t.n_leaves, 1, 16), jnp.float32)
    ev = jax.jit(lambda a, c: backend.l2p(L, a, c, t.tgt_start, t.tgt_leaf, 0.25, 4, True,
                                          "pallas"))
    traced = ev.trace(jnp.zeros((64, 3), jnp.float32), loc)
    sys.meta_path.insert(0, Log())
    try:
        traced.lower(lowering_platforms=("cuda",))
    finally:
        sys.meta_path.pop(0)
    assert sys.modules[_xla.TRITON_DIALECT].__name__.endswith("triton.dialect")
    assert _xla.TRITON_DIALECT not in searched
