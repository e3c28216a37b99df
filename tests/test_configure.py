"""The configuration step (jfmm.configure) and the models it asks
(jfmm.models): what each kernel resolves to, concrete or traced, and the
errors of bad requests. No sums here: their accuracy is tested per family."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import points

from jfmm import configure
from jfmm import kernels as K
from jfmm.models import checked_order
from jfmm.models import laplace3d as laplace3d_model

NAMES = {"laplace3d", "laplace2d", "chebyshev", "hermite", "near"}


def resolve(x, kernel, eps=1e-6, order=None, family=None, leaf_size=None):
    return configure.resolve(x, None, kernel, eps, leaf_size, order, family)


def traced(x, kernel, eps=1e-6):
    """The Config resolved inside jit, where the points are tracers."""
    out = []
    jax.make_jaxpr(lambda a: out.append(resolve(a, kernel, eps)) or a)(x)
    return out[0]


@pytest.mark.parametrize("dim", [2, 3])
def test_every_kernel_resolves_to_one_family(dim, rng):
    """A Config with a family object (no "auto" string), an order and a
    depth, from concrete and from traced points; hashable, so it can be a
    static argument of jit."""
    x = jnp.asarray(points("cube", 3000, rng, dim))
    laplace = K.Laplace3D() if dim == 3 else K.Laplace2D()
    for kernel in [laplace, K.Gaussian(2.0), K.Multiquadric(1.0), K.ThinPlateSpline(),
                   K.Yukawa(2.0)]:
        for cfg in (resolve(x, kernel), traced(x, kernel)):
            assert cfg.name in NAMES, cfg
            assert not isinstance(cfg.family, str)
            assert isinstance(cfg.order, int) and cfg.order >= 1
            assert isinstance(cfg.depth, int) and cfg.depth >= 0
            assert hash(cfg) == hash(configure.Config(cfg.family, cfg.order, cfg.depth,
                                                      cfg.eps))
        if kernel is laplace:   # series families: the order depends on eps and dtype only
            assert resolve(x, kernel) == traced(x, kernel)
            assert resolve(x, kernel).name == ("laplace3d" if dim == 3 else "laplace2d")


def test_laplace_order_grows_as_eps_falls():
    orders = [laplace3d_model.order_for_eps(eps, np.float64)
              for eps in (1e-2, 1e-4, 1e-6, 1e-8, 1e-10)]
    assert orders == sorted(orders) and orders[0] < orders[-1]
    assert laplace3d_model.order_for_eps(1e-5, np.float32) <= laplace3d_model.order_for_eps(
        1e-5, np.float64)


def test_overrides_are_kept_and_checked(rng):
    x = jnp.asarray(points("cube", 2000, rng))
    assert resolve(x, K.Laplace3D(), order=7).order == 7
    assert resolve(x, K.Laplace3D(), leaf_size=500).depth < resolve(x, K.Laplace3D(),
                                                                     leaf_size=10).depth
    cfg = resolve(x, K.Laplace3D(), family="chebyshev")
    assert cfg.name == "chebyshev"
    assert resolve(x, K.Gaussian(3.0), family="hermite").name == "hermite"
    with pytest.raises(ValueError, match="order must be an int"):
        resolve(x, K.Laplace3D(), order=0)
    with pytest.raises(ValueError, match="family must be one of"):
        resolve(x, K.Laplace3D(), family="taylor")
    with pytest.raises(ValueError, match="Gaussian kernel only"):
        resolve(x, K.Linear(), family="hermite")
    with pytest.raises(ValueError, match="order must be an int"):
        checked_order(2.5, 10)
    assert checked_order(None, 10) is None and checked_order(np.int64(4), 10) == 4


@pytest.mark.parametrize("kernel,dtype", [(K.Laplace3D(), np.float32), (K.Laplace3D(), np.float64),
                                          (K.Multiquadric(1.0), np.float32)])
def test_eps_below_the_floor_raises(kernel, dtype, rng):
    x = jnp.asarray(points("cube", 1000, rng), dtype)
    with pytest.raises(ValueError, match="eps"):
        resolve(x, kernel, eps=1e-14)
