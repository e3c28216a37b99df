"""How the suite's processes compile (tests/conftest.py and the processes of
tests/multihost_worker.py): set before jax starts.

The suite compiles hundreds of small programs and runs each once or twice:
LLVM's optimisations cost more than they save there (about 20% of the
suite's time on 2 CPU cores), and so do XLA:CPU's fusion emitters and
LLVM's expensive passes (another 16-24% on the vortex, adaptive and kernel
tests), and splitting each module for parallel code generation (one part:
a further 6-9% on the adaptive-tree and vortex tests; flags of jaxlib 0.10,
where they were measured). The backend's
optimisation level goes through jax_disable_most_optimizations (level 0 and
no expensive LLVM passes, read at each compilation; subprocesses inherit
it): tests marked `optimized` turn it off, where running the programs costs
more than compiling them (high orders: 2-3x faster to run)."""
import importlib.metadata
import os


def use(devices: int) -> None:
    """The suite's compile settings on `devices` host devices."""
    flags = [f"--xla_force_host_platform_device_count={devices}"]
    if importlib.metadata.version("jaxlib").startswith("0.10."):
        flags += ["--xla_cpu_use_fusion_emitters=false", "--xla_llvm_disable_expensive_passes=true",
                  "--xla_cpu_parallel_codegen_split_count=1"]
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", "")] + flags).strip()
    os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
