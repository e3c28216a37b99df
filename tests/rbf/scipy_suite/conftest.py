"""What scipy's conftest gives test_rbfinterp.py: the `xp` fixture (NumPy,
the namespace scipy's RBFInterpolator tests run in without SCIPY_ARRAY_API)."""
import numpy as np
import pytest


@pytest.fixture
def xp():
    return np


def _register_capabilities():
    """scipy's `make_xp_test_case(RBFInterpolator)` looks the class up in
    scipy's table of array-API capabilities: jfmm's class gets the entry of
    scipy's own."""
    from scipy._lib._array_api import xp_capabilities_table
    from scipy.interpolate import RBFInterpolator as scipy_rbf

    import jfmm
    xp_capabilities_table[jfmm.RBFInterpolator] = xp_capabilities_table[scipy_rbf]


_register_capabilities()


def pytest_configure(config):
    for mark in ("slow", "skip_xp_backends", "array_api_backends"):
        config.addinivalue_line("markers", f"{mark}: scipy's test marker")
