#!/usr/bin/env bash
# One device call: demo plus benchmark tables, written to $OUT (or ./out).
# Usage: bash benchmarks/gpu_run.sh PART   (PART = a .. z, fgt, fgt2 .. fgt4; sessions 8-12 used e-i, k-z, session 13 fgt*, session 14 prof, prof2, t1, t2, fc, t3, mat, final, final2, session 15 s15a, s15b, s15c, s15d)
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
  e)
    $py benchmarks/bench_grad.py --n 1048576 --dtype float32 --eps 1e-5 2>&1 | tee "$out/grad_f32.md"
    $py benchmarks/compile_probe.py 11 float32 1048576 2>&1 | tee "$out/compile.md"
    XLA_FLAGS=--xla_gpu_autotune_level=0 $py benchmarks/compile_probe.py 11 float32 1048576 2>&1 | tee -a "$out/compile.md"
    for leaf in 24 32 48; do
      $b --n 1048576 --dtype float32 --eps 1e-5 --repeats 5 --direct-max 0 --leaf $leaf 2>&1 | tail -1
    done | tee "$out/leaf.md"
    $b --n 1048576 --dist plummer --dtype float32 --eps 1e-5 --repeats 3 --direct-max 0 2>&1 | tee "$out/plummer.md"
    $py benchmarks/bench_grad.py --n 1048576 --dtype float64 --eps 1e-10 --repeats 3 2>&1 | tee "$out/grad_f64.md"
    ;;
  g)
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 3"
    $r --dim 3 --dtype float32 --eps 1e-4 2>&1 | tee "$out/rbf3.md"
    $r --dim 2 --dtype float64 --eps 1e-6 2>&1 | tee "$out/rbf2.md"
    ;;
  h)
    $b --n 1048576 --dtype float32 --eps 1e-5 --repeats 5 --direct-max 0 2>&1 | tee "$out/f32_cube.md"
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 3"
    $r --dim 3 --dtype float32 --eps 1e-4 --kernels 7,8,9,10 2>&1 | tee "$out/rbf3.md"
    $r --dim 2 --dtype float64 --eps 1e-6 --kernels 0,7,8,9,10 2>&1 | tee "$out/rbf2.md"
    $b --nmin 22 --nmax 24 --step 2 --dtype float32 --eps 1e-5 --repeats 3 --direct-max 0 2>&1 | tail -2 | tee -a "$out/f32_cube.md"
    $r --dim 3 --dtype float64 --eps 1e-6 --kernels 0,1,3,6,10 2>&1 | tee "$out/rbf3_f64.md"
    ;;
  i)
    for flags in "" "--xla_gpu_autotune_level=0"; do
      XLA_FLAGS="$flags" $py benchmarks/compile_probe.py 11 float32 1048576 2>&1 | tail -1 | sed "s/^/| $flags /"
      XLA_FLAGS="$flags" $b --n 1048576 --dtype float32 --eps 1e-5 --repeats 7 --direct-max 0 2>&1 | tail -1 | sed "s/^/| $flags /"
    done | tee "$out/autotune.md"
    ;;
  k)
    one="$b --n 1048576 --dtype float32 --eps 1e-5 --repeats 7 --direct-max 0"
    for flags in "" "--xla_gpu_enable_triton_gemm=false"; do
      for blocks in 16,16,1 8,16,1; do
        XLA_FLAGS="$flags" $one --blocks $blocks 2>&1 | tail -1 | sed "s/^/| $flags $blocks /"
      done
    done | tee "$out/first_call.md"
    $py benchmarks/bench_p2p.py --parts all,near --depths 5,4 \
      --blocks "16,16,1;8,16,1;4,16,1;8,8,1;4,32,1;8,32,2" 2>&1 | tee "$out/p2p.md"
    f64="$b --n 1048576 --dtype float64 --eps 1e-10 --repeats 3 --direct-max 0"
    for flags in "" "--xla_gpu_enable_triton_gemm=false"; do
      XLA_FLAGS="$flags" $f64 2>&1 | tail -1 | sed "s/^/| $flags /"
    done | tee "$out/f64.md"
    timeout 150 $py benchmarks/bench_rbf.py --n 1048576 --repeats 3 --dim 3 --dtype float32 \
      --eps 1e-4 2>&1 | tee "$out/rbf3.md"
    ;;
  l)
    export XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
    $b --n 1048576 --dtype float32 --eps 1e-5 --repeats 7 --direct-max 0 2>&1 | tee "$out/f32_cube.md"
    $b --n 1048576 --dist sphere,plummer --dtype float32 --eps 1e-5 --repeats 3 --direct-max 0 \
      2>&1 | tail -2 | tee -a "$out/f32_cube.md"
    $py benchmarks/bench_grad.py --n 1048576 --dtype float32 --eps 1e-5 2>&1 | tee "$out/grad.md"
    $py benchmarks/bench_grad.py --n 1048576 --dtype float64 --eps 1e-10 --repeats 3 2>&1 \
      | tee -a "$out/grad.md"
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 3"
    $r --dim 3 --dtype float32 --eps 1e-4 --kernels 0,6,7 --gather-bytes 1073741824 2>&1 \
      | tee "$out/rbf3_gather.md"
    timeout 200 $r --dim 2 --dtype float64 --eps 1e-6 2>&1 | tee "$out/rbf2.md"
    ;;
  m)
    export XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
    timeout 560 $py benchmarks/bench_rbf.py --n 1048576 --repeats 3 --dim 3 --dtype float64 \
      --eps 1e-6 2>&1 | tee "$out/rbf3_f64.md"
    ;;
  n)
    export XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
    for cv in 268435456 1073741824 1099511627776; do
      echo "## JFMM_CHUNK_VALUES=$cv"
      JFMM_CHUNK_VALUES=$cv $py benchmarks/bench_rbf.py --n 1048576 --repeats 3 --dim 3 \
        --dtype float64 --eps 1e-6 --kernels 1,6 2>&1 | tail -2
      JFMM_CHUNK_VALUES=$cv $b --n 1048576 --dtype float64 --eps 1e-10 --repeats 3 \
        --direct-max 0 2>&1 | tail -1
    done | tee "$out/chunk.md"
    JFMM_CHUNK_VALUES=1073741824 $py benchmarks/bench_grad.py --n 1048576 --dtype float64 \
      --eps 1e-10 --repeats 3 2>&1 | tee "$out/grad_f64.md"
    ;;
  o)
    export XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 3"
    $r --dim 3 --dtype float32 --eps 1e-4 2>&1 | tee "$out/rbf3.md"
    $r --dim 3 --dtype float64 --eps 1e-6 2>&1 | tee "$out/rbf3_f64.md"
    $r --dim 2 --dtype float64 --eps 1e-6 2>&1 | tee "$out/rbf2.md"
    ;;
  p)
    export XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
    $b --nmin 20 --nmax 24 --step 2 --dtype float32 --eps 1e-5 --repeats 3 --direct-max 0 2>&1 \
      | tee "$out/scaling.md"
    ;;
  q)
    export XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
    $py benchmarks/bench_p2p.py --parts all,near,fmm --depths 4,5 \
      --blocks "8,16,1;16,16,1;8,32,1;16,32,1;4,32,1;32,32,4" 2>&1 | tee "$out/p2p.md"
    pk="$py benchmarks/bench_peers.py --n 1048576 --jaxfmm-path peers/jaxfmm"
    $pk --eps 1e-5,1e-3 --tols 5e-3,2e-3 2>&1 | tee "$out/peers_f32.md"
    $pk --x64 --eps 1e-10,1e-6 --tols 1e-6 --repeats 3 2>&1 | tee "$out/peers_f64.md"
    ;;
  r)
    export XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
    $py benchmarks/peak_probe.py 2>&1 | tee "$out/peak.md"
    $py benchmarks/bench_p2p.py --parts all,near,fmm --depths 4,5 \
      --blocks "8,16,1;8,16,1,0;8,32,1;16,16,1;4,32,1;32,32,4" 2>&1 | tee "$out/p2p.md"
    $b --n 1048576 --dtype float32 --eps 1e-5 --repeats 5 --direct-max 0 2>&1 | tee "$out/f32_cube.md"
    $b --nmin 14 --nmax 20 --step 2 --dtype float32 --eps 1e-5 --repeats 3 \
      --direct-max 1048576 2>&1 | tail -4 | tee -a "$out/f32_cube.md"
    $b --nmin 22 --nmax 24 --step 2 --dtype float32 --eps 1e-5 --repeats 3 --direct-max 0 2>&1 \
      | tail -2 | tee -a "$out/f32_cube.md"
    $b --n 1048576 --dist sphere --dtype float32 --eps 1e-5 --repeats 3 --direct-max 0 2>&1 \
      | tail -1 | tee -a "$out/f32_cube.md"
    $py benchmarks/bench_grad.py --n 1048576 --dtype float32 --eps 1e-5 2>&1 | tee "$out/grad_f32.md"
    ;;
  s)
    export XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
    $b --n 1048576 --dtype float64 --eps 1e-10 --repeats 3 --direct-max 0 2>&1 | tee "$out/f64.md"
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 3"
    $r --dim 3 --dtype float32 --eps 1e-4 2>&1 | tee "$out/rbf3.md"
    $r --dim 2 --dtype float64 --eps 1e-6 2>&1 | tee "$out/rbf2.md"
    ;;
  u)
    export XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
    $py benchmarks/bench_p2p.py --parts all --all-n 16,20 \
      --blocks "8,16,1;8,32,1;16,32,1;32,32,4;16,64,4;32,64,4" 2>&1 | tee "$out/p2p_all.md"
    ;;
  x)
    # Pallas M2L tile sweep (session 11, first call; 128-wide tiles overflow shared memory at p = 11)
    tf=TF32_TF32_F32_X3
    XLA_FLAGS=--xla_gpu_enable_triton_gemm=false $py benchmarks/bench_m2l.py --level 5 \
      --orders 8,11 --variants "jnp;64,128,4,2,$tf;32,128,4,2,$tf;128,128,8,2,$tf;\
64,128,4,1,$tf;64,128,4,3,$tf;64,128,8,2,$tf;64,64,4,2,$tf;32,64,4,1,$tf;16,128,4,1,$tf;\
64,128,4,2,BF16_BF16_F32_X6;64,128,4,2,BF16_BF16_F32_X3;64,128,4,2,F32_F32_F32" 2>&1 \
      | tee "$out/m2l_pallas.md"
    ;;
  v)
    export XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
    $py benchmarks/bench_m2l.py --level 5 --orders 6,8,11 \
      --variants "jnp;bf16x6;64,64,4,2,BF16_BF16_F32_X6" 2>&1 | tee "$out/m2l.md"
    one="$b --n 1048576 --dtype float32 --repeats 7 --direct-max 0"
    for m2l in bf16x6 float32 bf16x6; do $one --eps 1e-5 --m2l $m2l 2>&1 | tail -1; done \
      | tee "$out/f32_cube.md"
    for eps in 1e-3 1e-4 1e-6; do $one --eps $eps 2>&1 | tail -1; done | tee "$out/eps.md"
    $b --n 1048576 --dist sphere,plummer --dtype float32 --eps 1e-5 --repeats 3 --direct-max 0 \
      2>&1 | tail -2 | tee "$out/dist.md"
    $b --nmin 14 --nmax 24 --step 2 --dtype float32 --eps 1e-5 --repeats 3 \
      --direct-max 65536 2>&1 | tail -6 | tee "$out/scaling.md"
    ;;
  w)
    export XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
    $py benchmarks/bench_grad.py --n 1048576 --dtype float32 --eps 1e-5 2>&1 | tee "$out/grad_f32.md"
    $py benchmarks/bench_rbf.py --n 1048576 --repeats 3 --dim 3 --dtype float32 --eps 1e-4 \
      2>&1 | tee "$out/rbf3.md"
    ;;
  y)
    export XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
    acc="$py benchmarks/accuracy.py --n 30000 --dtype float32"
    { $acc --eps 1e-5; $acc --eps 1e-3; $acc --dim 2 --kernel laplace2d --eps 1e-5
      $acc --kernel gaussian --eps 1e-4; $acc --dim 2 --kernel gaussian --eps 1e-4
      $acc --kernel thin_plate_spline --eps 1e-4; } 2>&1 | tee "$out/accuracy.md"
    ;;
  t)
    $py benchmarks/bench_peers.py --n 1048576 --jaxfmm-path peers/jaxfmm --eps 1e-5,1e-3 \
      --tols 5e-3,2e-3 2>&1 | tee "$out/peers_f32.md"
    ;;
  c)
    $b --nmin 14 --nmax 20 --dtype float64 --eps 1e-10 --repeats 3 --direct-max 65536 2>&1 | tee "$out/f64_cube.md"
    $b --n 65536 --dist plummer --dtype float32 --eps 1e-5 --repeats 3 2>&1 | tee "$out/f32_plummer.md"
    ;;
  prof)
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 3 --direct-n 16384 --profile"
    $r --dim 3 --dtype float64 --eps 1e-6 --kernels 0,3,6,10 2>&1 | tee "$out/prof3_f64.md"
    for o in 8 9; do $r --dim 3 --dtype float64 --eps 1e-6 --kernels 10 --order $o 2>&1 | tail -2; done | tee -a "$out/prof3_f64.md"
    $r --dim 3 --dtype float32 --eps 1e-4 --kernels 6,10 2>&1 | tee "$out/prof3_f32.md"
    $b --n 1048576 --dtype float64 --eps 1e-6 --repeats 3 --direct-max 0 2>&1 | tee "$out/lap_f64.md"
    ;;
  prof2)
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 3 --direct-n 16384 --profile"
    $r --dim 3 --dtype float64 --eps 1e-6 --kernels 3,6,7,10 2>&1 | tee "$out/prof3_f64.md"
    $r --dim 3 --dtype float64 --eps 1e-6 --kernels 10 --order 8 2>&1 | tail -2 | tee -a "$out/prof3_f64.md"
    $r --dim 3 --dtype float32 --eps 1e-4 --kernels 6,10 2>&1 | tee "$out/prof3_f32.md"
    ;;
  t1)
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 3"
    $r --dim 3 --dtype float64 --eps 1e-6 2>&1 | tee "$out/rbf3_f64.md"
    $r --dim 3 --dtype float64 --eps 1e-6 --kernels 10 --profile 2>&1 | tail -1 | tee -a "$out/rbf3_f64.md"
    ;;
  t2)
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 3"
    $r --dim 3 --dtype float32 --eps 1e-4 2>&1 | tee "$out/rbf3_f32.md"
    $r --dim 2 --dtype float64 --eps 1e-6 2>&1 | tee "$out/rbf2_f64.md"
    ;;
  fc)
    echo "| kernel | dtype | eps | XLA_FLAGS | first fmm s | second fmm ms | plan + first apply s | second apply ms | err phi |" | tee "$out/first_call.md"
    echo "|---|---|---|---|---|---|---|---|---|" | tee -a "$out/first_call.md"
    for flags in "" "--xla_gpu_enable_triton_gemm=true"; do
      XLA_FLAGS="$flags" $py benchmarks/first_call.py laplace3d float32 1e-5 2>&1 | tail -1
      XLA_FLAGS="$flags" $py benchmarks/first_call.py laplace3d float64 1e-10 2>&1 | tail -1
      XLA_FLAGS="$flags" $py benchmarks/first_call.py yukawa float64 1e-6 2>&1 | tail -1
    done | tee -a "$out/first_call.md"
    ;;
  t3)
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 3"
    $r --dim 3 --dtype float32 --eps 1e-5 2>&1 | tee "$out/rbf3_f32_1e-5.md"
    $r --dim 2 --dtype float32 --eps 1e-5 2>&1 | tee "$out/rbf2_f32_1e-5.md"
    ;;
  mat)
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 3"
    for v in 700 1000000000; do
      echo "JFMM_MATERIALIZE_VALUES=$v"
      JFMM_MATERIALIZE_VALUES=$v $r --dim 3 --dtype float64 --eps 1e-6 --kernels 10 --profile 2>&1 | tail -2
      JFMM_MATERIALIZE_VALUES=$v $r --dim 3 --dtype float64 --eps 1e-6 --kernels 10 --order 9 2>&1 | tail -1
      JFMM_MATERIALIZE_VALUES=$v $r --dim 3 --dtype float32 --eps 1e-5 --kernels 2 2>&1 | tail -1
      JFMM_MATERIALIZE_VALUES=$v $b --n 1048576 --dtype float64 --eps 1e-10 --repeats 3 --direct-max 0 2>&1 | tail -1
    done | tee "$out/mat.md"
    ;;
  final)
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 3"
    $r --dim 3 --dtype float64 --eps 1e-6 2>&1 | tee "$out/rbf3_f64.md"
    ;;
  final2)
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 3"
    $r --dim 3 --dtype float32 --eps 1e-4 2>&1 | tee "$out/rbf3_f32.md"
    $r --dim 3 --dtype float32 --eps 1e-5 2>&1 | tee "$out/rbf3_f32_1e-5.md"
    ;;
  s15a)
    # session 15: the P2P with fast rsqrt and the r = 0 select only where needed
    export XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
    $py benchmarks/bench_p2p.py --parts all,near,fmm --depths 4,5 --all-n 16,20 \
      --blocks "8,16,1;8,32,1;8,32,1,1,0;16,16,1;16,64,4" 2>&1 | tee "$out/p2p.md"
    $b --nmin 14 --nmax 20 --step 2 --dtype float32 --eps 1e-5 --repeats 5 \
      --direct-max 1048576 2>&1 | tee "$out/f32_cube.md"
    $b --nmin 22 --nmax 24 --step 2 --dtype float32 --eps 1e-5 --repeats 3 --direct-max 0 2>&1 \
      | tail -2 | tee -a "$out/f32_cube.md"
    $b --n 1048576 --dist sphere,plummer --dtype float32 --eps 1e-5 --repeats 3 --direct-max 0 \
      2>&1 | tail -2 | tee -a "$out/f32_cube.md"
    ;;
  s15b)
    export XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
    $b --n 1048576 --dtype float64 --eps 1e-10 --repeats 3 --direct-max 0 2>&1 | tee "$out/f64.md"
    $py benchmarks/bench_rbf.py --n 1048576 --repeats 3 --dim 3 --dtype float32 --eps 1e-4 2>&1 \
      | tee "$out/rbf3_f32.md"
    $py benchmarks/bench_peers.py --n 1048576 --jaxfmm-path peers/jaxfmm --eps 1e-5,1e-3 \
      --tols 5e-3,2e-3 2>&1 | tee "$out/peers_f32.md"
    unset XLA_FLAGS
    $py benchmarks/first_call.py laplace3d float32 1e-5 2>&1 | tail -1 | tee "$out/first_call.md"
    ;;
  s15c)
    # after the scalar-rsqrt fix (InverseMultiquadric's K(0) failed in Triton in s15b)
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 3"
    $r --dim 3 --dtype float32 --eps 1e-4 2>&1 | tee "$out/rbf3_f32.md"
    $r --dim 3 --dtype float64 --eps 1e-6 2>&1 | tee "$out/rbf3_f64.md"
    ;;
  s15d)
    # the landing code after the review (padding tiles start at M, -0.0 canonicalized)
    export XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
    $py benchmarks/bench_p2p.py --parts all,near,fmm --depths 5 --all-n 20 \
      --blocks "8,16,1;8,32,1" 2>&1 | tee "$out/p2p.md"
    $b --n 1048576 --dtype float32 --eps 1e-5 --repeats 5 --direct-max 1048576 2>&1 \
      | tee "$out/f32.md"
    $py benchmarks/bench_rbf.py --n 1048576 --repeats 3 --dim 3 --dtype float32 --eps 1e-4 \
      2>&1 | tee "$out/rbf3_f32.md"
    ;;
  fgt)
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 5"
    $r --dim 3 --dtype float64 --eps 1e-6 --kernels 0,1,2 2>&1 | tee "$out/fgt3_f64.md"
    $r --dim 3 --dtype float64 --eps 1e-6 --kernels 1,2 --family chebyshev --direct-n 65536 2>&1 | tail -2 | tee -a "$out/fgt3_f64.md"
    $r --dim 3 --dtype float32 --eps 1e-4 --kernels 0,1,2 2>&1 | tee "$out/fgt3_f32.md"
    $r --dim 2 --dtype float64 --eps 1e-6 --kernels 0,1,2 2>&1 | tee "$out/fgt2_f64.md"
    $r --dim 2 --dtype float32 --eps 1e-4 --kernels 1,2 2>&1 | tee "$out/fgt2_f32.md"
    ;;
  fgt2)
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 5"
    $r --dim 3 --dtype float64 --eps 1e-6 2>&1 | tee "$out/rbf3_f64.md"
    for p in 7 8 9; do
      $r --dim 3 --dtype float64 --eps 1e-6 --kernels 10 --order $p 2>&1 | tail -1
    done | tee "$out/yukawa_orders.md"
    ;;
  fgt3)
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 5"
    $r --dim 2 --dtype float64 --eps 1e-6 2>&1 | tee "$out/rbf2_f64.md"
    $r --dim 3 --dtype float32 --eps 1e-4 2>&1 | tee "$out/rbf3_f32.md"
    ;;
  fgt4)
    $py benchmarks/plan_probe.py float32 1e-4 2>&1 | tee "$out/plan_probe.md"
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 5"
    $r --dim 3 --dtype float32 --eps 1e-4 2>&1 | tee "$out/rbf3_f32.md"
    $r --dim 2 --dtype float32 --eps 1e-4 --kernels 1,2 2>&1 | tee "$out/rbf2_f32.md"
    ;;
  z)
    # Session 12: Chebyshev orders from the error estimate (per kernel and points).
    export XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 3"
    timeout 330 $r --dim 3 --dtype float64 --eps 1e-6 2>&1 | tee "$out/rbf3_f64.md"
    timeout 240 $r --dim 3 --dtype float32 --eps 1e-4 2>&1 | tee "$out/rbf3_f32.md"
    ;;
  z2)
    export XLA_FLAGS=--xla_gpu_enable_triton_gemm=false
    r="$py benchmarks/bench_rbf.py --n 1048576 --repeats 3"
    timeout 240 $r --dim 3 --dtype float32 --eps 1e-4 --orders traced 2>&1 | tee "$out/rbf3_f32_traced.md"
    timeout 200 $r --dim 2 --dtype float64 --eps 1e-6 2>&1 | tee "$out/rbf2_f64.md"
    timeout 120 $r --dim 3 --dtype float64 --eps 1e-8 --kernels 1,3,8,9 2>&1 | tee "$out/rbf3_f64_1e-8.md"
    ;;
esac
