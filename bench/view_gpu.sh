#!/usr/bin/env bash
# The CUDA view backend on a GPU machine: the CUDA-vs-CPU test (view_cuda_test) and the backend
# benchmark (dsfs_bench_view_backend) on ~2000 synthetic JPEGs. Results go under $OUT when set
# (the device tool brings back what is written there), else bench/results:
#   view_gpu_device.txt   nvidia-smi
#   view_cuda_test.json   gtest results (+ .log); skipped tests mean no usable GPU
#   view_backend.json     images/s cpu vs cuda, time split (+ .log)
#
#   bench/view_gpu.sh            run on the GPU machine. Uses the binaries packed in
#                                build-gpu-bundle/ when present (see --bundle), else builds them
#                                (Release) into $BUILD_DIR: that needs CMake, nvcc and dsfs's
#                                libraries (libfuse3, hiredis, turbojpeg, ... -dev) there.
#   bench/view_gpu.sh --bundle   run on a build machine (no GPU needed): Release build, then the
#                                three binaries, stripped, and the shared libraries they need
#                                beyond glibc and libstdc++, as build-gpu-bundle/
#                                view_gpu_bundle.tar.xz (about 16 MB; build-* is git-ignored): carry
#                                build-gpu-bundle to a GPU machine whose image lacks the libraries.
#
# Environment: BUILD_DIR (default build-gpu), BUNDLE_DIR (default build-gpu-bundle), IMAGES
# (default 2000), THREADS (decode threads, default all cores), BATCH (default 32), SPEC (default
# imagenet-eval), ROUNDS (default 5).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${BUILD_DIR:-$repo/build-gpu}
bundle=${BUNDLE_DIR:-$repo/build-gpu-bundle}
images=${IMAGES:-2000}
threads=${THREADS:-$(nproc)}
batch=${BATCH:-32}
spec=${SPEC:-imagenet-eval}
rounds=${ROUNDS:-5}
targets=(dsfs view_cuda_test dsfs_bench_view_backend)

# Release build of the three targets; the log goes to $1, its tail to the terminal on failure.
build_release() {
  local log=$1
  echo "building ${targets[*]} (Release) in $build; log: $log"
  # -Wno-error=restrict: GCC 12 at -O3 reports a false overlap inside std::string's operator+
  # (GCC bug 105329) in tools/progress.cpp; a warning, not an error, in this build.
  if ! { cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release \
           -DCMAKE_CXX_FLAGS="-Wno-error=restrict" &&
         cmake --build "$build" --target "${targets[@]}" -j "$(nproc)"; } >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "view_gpu.sh: the build failed (full log: $log). Without dsfs's libraries on this" \
         "machine, run 'bench/view_gpu.sh --bundle' where they are and carry build-gpu-bundle/." >&2
    exit 1
  fi
  grep -q "CUDA view backend enabled" "$log" ||
    echo "view_gpu.sh: warning: CMake did not find nvcc; the CUDA backend is not built" >&2
}

if [[ ${1:-} == --bundle ]]; then
  build_release "$(mktemp /tmp/view_gpu_build.XXXXXX.log)"
  staging=$(mktemp -d /tmp/view_gpu_bundle.XXXXXX)
  trap 'rm -rf "$staging"' EXIT
  "$repo/bench/pack_binaries.sh" "$staging/bin" "$staging/libs" "$build/dsfs" \
    "$build/tests/view_cuda_test" "$build/bench/dsfs_bench_view_backend"
  # Compressed: uncompressed the libraries (ICU's data above all) are near the carry limit.
  rm -rf "$bundle"
  mkdir -p "$bundle"
  tar -C "$staging" -cJf "$bundle/view_gpu_bundle.tar.xz" bin libs
  echo "bundle ready: $(du -h "$bundle/view_gpu_bundle.tar.xz" | cut -f1) in $bundle"
  echo "on the GPU machine (carry $(basename "$bundle")): bench/view_gpu.sh"
  exit 0
elif [[ $# -gt 0 ]]; then
  sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi

out=${OUT:-$repo/bench/results}
mkdir -p "$out"

work=$(mktemp -d /tmp/view_gpu.XXXXXX)
trap 'rm -rf "$work"' EXIT
if [[ -f $bundle/view_gpu_bundle.tar.xz ]]; then
  echo "using the binaries in $bundle/view_gpu_bundle.tar.xz"
  tar -C "$work" -xJf "$bundle/view_gpu_bundle.tar.xz"
  bin_dsfs=$work/bin/dsfs
  bin_test=$work/bin/view_cuda_test
  bin_bench=$work/bin/dsfs_bench_view_backend
  export LD_LIBRARY_PATH=$work/libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  build_release "$out/view_gpu_build.log"
  bin_dsfs=$build/dsfs
  bin_test=$build/tests/view_cuda_test
  bin_bench=$build/bench/dsfs_bench_view_backend
fi

{ nvidia-smi || echo "nvidia-smi: not available"; } >"$out/view_gpu_device.txt" 2>&1
head -n 12 "$out/view_gpu_device.txt"

data=$work/images
"$bin_dsfs" synth "$data" --classes 20 --per-class $(((images + 19) / 20)) --seed 7 \
  --jobs "$threads"

status=0
set +e
"$bin_test" --gtest_output="json:$out/view_cuda_test.json" 2>&1 | tee "$out/view_cuda_test.log"
test_rc=${PIPESTATUS[0]}
"$bin_bench" "$data" --threads "$threads" --batch "$batch" --spec "$spec" --rounds "$rounds" \
  --json "$out/view_backend.json" 2>&1 | tee "$out/view_backend.log"
bench_rc=${PIPESTATUS[0]}
set -e

echo
if [[ $test_rc -ne 0 ]]; then
  echo "view_gpu.sh: view_cuda_test FAILED (exit $test_rc); see $out/view_cuda_test.log"
  status=1
elif grep -q "SKIPPED \] CudaBackendTest" "$out/view_cuda_test.log"; then
  echo "view_gpu.sh: the CUDA comparison tests were SKIPPED: no usable GPU (reason in the log)"
  status=1
else
  echo "view_gpu.sh: view_cuda_test passed"
fi
if [[ $bench_rc -ne 0 ]]; then
  echo "view_gpu.sh: the benchmark FAILED (exit $bench_rc); see $out/view_backend.log"
  status=1
fi
echo "results in $out"
exit $status
