#!/usr/bin/env bash
# One device call: demo plus benchmark tables, written to $OUT (or ./out).
# Usage: bash benchmarks/gpu_run.sh PART   (PART = b | c)
set -uo pipefail
out="${OUT:-out}"; mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=python3
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.total --format=csv | tee "$out/gpu_$1.txt"
$py -c "import jax; print('jax', jax.__version__, jax.devices())" | tee -a "$out/gpu_$1.txt"
b="$py benchmarks/bench_laplace.py"
case "$1" in
  a)
    $py -m jfmm 2>&1 | tee "$out/demo.txt"
    $b --nmin 12 --nmax 21 --dtype float32 --eps 1e-5 2>&1 | tee "$out/f32_cube.md"
    $b --n 1048576 --dist sphere,plummer --dtype float32 --eps 1e-5 2>&1 | tee "$out/f32_dist.md"
    ;;
  b)
    $py -m jfmm 2>&1 | tee "$out/demo.txt"
    $b --nmin 14 --nmax 22 --dtype float32 --eps 1e-5 --direct-max 262144 2>&1 | tee "$out/f32_cube.md"
    $b --n 1048576 --orders 6,8,10,12 --dtype float32 --repeats 3 2>&1 | tee "$out/p_f32.md"
    $b --n 1048576 --dist sphere --dtype float32 --eps 1e-5 2>&1 | tee "$out/f32_sphere.md"
    $b --n 65536 --dist plummer --dtype float32 --eps 1e-5 --repeats 3 2>&1 | tee "$out/f32_plummer.md"
    ;;
  d)
    $b --nmin 18 --nmax 20 --dtype float64 --eps 1e-10 --repeats 3 --direct-max 0 2>&1 | tee "$out/f64_cube.md"
    $b --n 1048576 --dist sphere --dtype float32 --eps 1e-5 --repeats 3 --direct-max 0 2>&1 | tee "$out/f32_sphere.md"
    $b --n 1048576 --dtype float32 --eps 1e-5 --repeats 5 --direct-max 0 2>&1 | tee "$out/f32_cube.md"
    ;;
  c)
    $b --nmin 14 --nmax 20 --dtype float64 --eps 1e-10 --repeats 3 --direct-max 65536 2>&1 | tee "$out/f64_cube.md"
    $b --n 65536 --dist plummer --dtype float32 --eps 1e-5 --repeats 3 2>&1 | tee "$out/f32_plummer.md"
    ;;
esac
