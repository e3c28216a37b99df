"""Shared test helpers: point distributions and the float64 reference.

The reference sums the inputs as the library received them: points and
charges are rounded to the working dtype, then summed in float64 with numpy,
so the error measured is the algorithm's, not the inputs' rounding.
"""
import ctypes
import ctypes.util
import functools
import gc
import os
import sys
import tempfile

import compile_settings


def _own_cores() -> None:
    """Each xdist worker runs on its own share of the cores. XLA's CPU
    runtime sizes its thread pool from this process's cores; two workers
    whose pools both span a 2-core machine contend, and their loops pay
    for handing work between threads (the suite took 620-682 s, pinned
    517 s; docs/BENCHMARKS.md, "The test suite")."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get(
        "PYTEST_XDIST_WORKER_COUNT")
    if not (worker and count and hasattr(os, "sched_setaffinity")):
        return
    cores = sorted(os.sched_getaffinity(0))
    share = set(cores[int(worker.removeprefix("gw")) % int(count)::int(count)])
    if share:
        os.sched_setaffinity(0, share)


_own_cores()
# Four host devices for the sharded sums (tests/test_distributed.py); the
# other tests run on the first. Set before jax starts.
compile_settings.use(4)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from jfmm import _reference  # noqa: E402
from jfmm import kernels as K  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_disable_most_optimizations", True)   # were jax imported before
# Compiled programs shared on disk between the workers and across the
# modules whose in-memory caches `fresh_caches` drops.
jax.config.update("jax_compilation_cache_dir",
                  os.path.join(tempfile.gettempdir(), "jfmm-tests-xla-cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)

DISTRIBUTIONS = ("cube", "sphere", "cluster")
RESIDENT_GB = 2.0
try:
    _LIBC = ctypes.CDLL(ctypes.util.find_library("c"))
    _LIBC.malloc_trim
except (OSError, AttributeError):    # not glibc
    _LIBC = None


@pytest.fixture(autouse=True)
def fmm_at_every_size(request, monkeypatch):
    """The tests' small point sets go through the FMM, not the direct sum
    the configuration prefers below its crossover (tests marked
    `crossover` keep it)."""
    if "crossover" not in request.keywords:
        from jfmm import configure
        monkeypatch.setattr(configure, "DIRECT_PAIRS", {"cpu": {}, "gpu": {}})


def pytest_configure(config):
    config.addinivalue_line("markers", "optimized: compile with XLA's backend optimisations "
                            "(tests whose programs run longer than they compile)")


@pytest.fixture(autouse=True)
def backend_optimisations(request):
    """Tests marked `optimized` compile with the backend's optimisations:
    their high-order programs run 2-3x faster at level 2 than at 0 (3D
    Chebyshev at order 12: 11 s against 31 s on 2 CPU cores), for a
    compilation that costs a second or two more."""
    if "optimized" not in request.keywords:
        yield
        return
    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)


def _drop_caches():
    """Drop compiled programs, remembered plans and cached operators, and
    hand the freed heap back (glibc keeps it)."""
    jax.clear_caches()
    from jfmm import api, configure
    api._PLANS.clear()
    configure._RESOLVED.clear()
    for name, module in list(sys.modules.items()):
        if name.startswith("jfmm."):
            for value in vars(module).values():
                if isinstance(value, functools._lru_cache_wrapper):
                    value.cache_clear()
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _resident_gb() -> float:
    """This process's resident memory in GB (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9
    except OSError:
        return 0.0


@pytest.fixture(autouse=True, scope="module")
def fresh_caches():
    """Drop each module's caches when it ends: a worker that keeps them all
    grows by gigabytes."""
    yield
    _drop_caches()


@pytest.fixture(autouse=True)
def bounded_memory():
    """Drop the caches after any test that leaves the worker above
    RESIDENT_GB, so that two workers stay under 6 GB together; later tests
    of the module reload their programs from the disk cache."""
    yield
    if _resident_gb() > RESIDENT_GB:
        _drop_caches()


def points(kind: str, n: int, rng, dim: int = 3) -> np.ndarray:
    """n points: uniform cube, sphere surface, or tight clusters with far outliers."""
    if kind == "cube":
        return rng.random((n, dim))
    if kind == "sphere":
        v = rng.normal(size=(n, dim))
        return 0.5 + 0.5 * v / np.linalg.norm(v, axis=1, keepdims=True)
    if kind == "cluster":
        centres = rng.random((5, dim))
        x = centres[rng.integers(0, 5, n)] + 1e-3 * rng.normal(size=(n, dim))
        k = max(1, n // 200)
        x[:k] = rng.random((k, dim)) * 20 - 10
        return x
    raise ValueError(kind)


def charges(n: int, rng, k: int | None = None) -> np.ndarray:
    """Mixed-sign charges, uniform in [-0.5, 0.5]."""
    shape = (n,) if k is None else (n, k)
    return rng.random(shape) - 0.5


def reference(sources, q, targets=None, dtype=np.float64):
    """float64 direct sum of 1/r over inputs rounded to `dtype`.

    Returns phi (M,) or (M, k) and grad (M, d) or (M, k, d); r = 0 pairs skipped.
    """
    x = np.asarray(np.asarray(sources, dtype), np.float64)
    y = x if targets is None else np.asarray(np.asarray(targets, dtype), np.float64)
    return _reference.laplace3d(x, np.asarray(np.asarray(q, dtype), np.float64), y)


# K(r) in numpy (complex-safe, for the complex-step derivative), written
# here from the kernels' formulas: independent of jfmm's pair terms.
_RADIAL = {
    K.Gaussian: lambda k, r: np.exp(-(float(k.epsilon) * r) ** 2),
    K.Multiquadric: lambda k, r: -np.sqrt(1 + (float(k.epsilon) * r) ** 2),
    K.InverseMultiquadric: lambda k, r: 1 / np.sqrt(1 + (float(k.epsilon) * r) ** 2),
    K.InverseQuadratic: lambda k, r: 1 / (1 + (float(k.epsilon) * r) ** 2),
    K.ThinPlateSpline: lambda k, r: r * r * np.log(r),
    K.Linear: lambda k, r: -r,
    K.Cubic: lambda k, r: r ** 3,
    K.Quintic: lambda k, r: -r ** 5,
    K.Yukawa: lambda k, r: np.exp(-float(k.kappa) * r) / r,
    K.Laplace2D: lambda k, r: -np.log(r),
    K.Laplace3D: lambda k, r: 1 / r,
    K.Radial: lambda k, r: np.asarray(k.fn(r)),
}


def radial_reference(kernel, sources, q, targets=None, chunk: int = 512, gradient=True):
    """float64 numpy sum of q_i K(|y - x_i|) for any jfmm kernel: phi (M,)
    or (M, k), grad (M, d) or (M, k, d) (None where gradient=False). K'(r)
    by the complex step (Im K(r + ih) / h, exact to rounding). A pair at
    r = 0 adds K(0) to phi where the kernel is smooth, 0 where it is
    singular, and 0 to grad."""
    f = lambda r: _RADIAL[type(kernel)](kernel, r)            # noqa: E731
    x = np.asarray(sources, np.float64)
    y = x if targets is None else np.asarray(targets, np.float64)
    q = np.asarray(q, np.float64)
    qq = q[:, None] if q.ndim == 1 else q
    k0 = 0.0 if kernel.singular else float(np.real(f(np.full(1, 1e-150))[0]))   # K(0+)
    phi = np.zeros((len(y), qq.shape[1]))
    grad = np.zeros((len(y), qq.shape[1], y.shape[1])) if gradient else None
    for s in range(0, len(y), chunk):
        # per axis: no (chunk, N, d) temporary
        diff = [y[s:s + chunk, a, None] - x[None, :, a] for a in range(y.shape[1])]
        r = np.sqrt(sum(v * v for v in diff))
        far = r > 0
        safe = np.where(far, r, 1.0)
        if not gradient:
            with np.errstate(all="ignore"):
                val = np.where(far, np.real(f(safe)), k0)
            assert np.all(np.isfinite(val)), "reference not finite"
            phi[s:s + chunk] = val @ qq
            continue
        h = 1e-30 * safe
        with np.errstate(invalid="ignore"):      # numpy's vectorized complex products flag spuriously
            kr = f(safe + 1j * h)
        assert np.all(np.isfinite(kr[far])), "reference not finite"
        val = np.where(far, np.real(kr), k0)
        dk_over_r = np.where(far, np.imag(kr) / h / safe, 0.0)
        phi[s:s + chunk] = val @ qq
        grad[s:s + chunk] = np.stack([(dk_over_r * v) @ qq for v in diff], axis=-1)
    if q.ndim == 1:
        return phi[:, 0], None if grad is None else grad[:, 0]
    return phi, grad


def rel(a, b) -> float:
    """Relative L2 error ||a - b|| / ||b||."""
    a = np.asarray(a)
    a = a.astype(np.complex128 if np.iscomplexobj(a) else np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from entropy (printed on failure)."""
    seed = np.random.SeedSequence().entropy
    request.node.user_properties.append(("seed", seed))
    print(f"seed={seed}")
    return np.random.default_rng(seed)
