# Sourced by run.sh and trace.sh (from the repository root, with PY set): the CUTLASS headers
# of the installed nvidia-cutlass package, the CUDA toolkit's (else the nvidia-cublas wheel's)
# cuBLAS, and the nvcc flags the probe programs build with.
CUTLASS_INCLUDE=$("$PY" -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'include'))")
NVIDIA_DIRS=$("$PY" -c "import nvidia; print(' '.join(nvidia.__path__))" 2>/dev/null || true)
# The first file named $1 under the toolkit, then under the nvidia-* wheels.
find_first() {
  find /usr/local/cuda/include /usr/local/cuda/lib64 $NVIDIA_DIRS -name "$1" -print -quit \
    2>/dev/null || true
}
CUBLAS_HEADER=$(find_first cublas_v2.h)
CUBLAS_LIBRARY=$(find_first 'libcublas.so*')
[ -n "$CUBLAS_HEADER" ] && [ -n "$CUBLAS_LIBRARY" ] || { echo "cuBLAS not found"; exit 1; }
# CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED: CuTe picks wgmma widths that are not multiples of 32
# (160, 176, 112, ...) only with it; without it a 176-wide tile runs as eleven 16-wide wgmmas.
# The extension is built without it. With it, config 8 (320 wide, N-major weights) does not
# compile: CuTe would split it into two 160-wide wgmmas, which cut the 64-column swizzle atoms
# of N-major weights in half, so leave 8 out of PLAIN_IDS and FUSED_IDS here.
FLAGS=(-std=c++17 -O3 -DNDEBUG -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
       -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr
       -Xcudafe=--diag_suppress=esa_on_defaulted_function_ignored
       -I ffi -I benchmarks/research/gemm_probe -isystem "$CUTLASS_INCLUDE" -I "$(dirname "$CUBLAS_HEADER")")
# Links the objects in $1 (a build folder) into $1/$2 against that cuBLAS.
link_probe() {
  nvcc -gencode=arch=compute_90a,code=sm_90a "$1"/*.o -o "$1/$2" \
    -L"$(dirname "$CUBLAS_LIBRARY")" -l:"$(basename "$CUBLAS_LIBRARY")" \
    -Xlinker -rpath -Xlinker "$(dirname "$CUBLAS_LIBRARY")"
}
