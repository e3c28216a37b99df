"""Pallas kernels, each with the signature of the jnp operator it accelerates."""
