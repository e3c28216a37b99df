"""scipy's own RBFInterpolator tests (a package, so that its conftest does not
shadow tests/conftest.py, which the other test modules import by name)."""
