#!/usr/bin/env bash
# Issue 17's first-epoch benchmark (bench/first_epoch.py) on a machine with many cores, such as the
# device machine lent to some sessions (16 cores), where dsfs, Redis, the latency proxy and the
# readers do not share two CPUs. Separates what dsfs costs from what a 2-core VM imposes.
#
#   bench/first_epoch_device.sh --bundle [BUILD]   here: BUILD's dsfs, dsfs_bench_redis_raw and
#                                 view_cuda_test (default build-lead), stripped, with redis-server
#                                 and every shared library they load beyond the C runtime, as
#                                 build-device-bundle/bundle.tar.xz (build-* is git-ignored)
#   bench/first_epoch_device.sh [first_epoch.py options]   there (as root; carry
#                                 build-device-bundle): unpacks the bundle, runs view_cuda_test
#                                 when a GPU is there (60 s bound; SKIP_CUDA_TEST=1: not), then
#                                 first_epoch.py with the options given (--perf DIR: the bundled
#                                 perf profiles each case's first run; results under $OUT when
#                                 set, else bench/results; the docs are left alone); with an
#                                 older bundle.tar.xz copied to before.tar.xz beside it, both
#                                 builds side by side (labels after, before)
#   bench/first_epoch_device.sh timeline [epoch_timeline.py options]   there: the same set-up,
#                                 then epoch_timeline.py (stats.json every 0.1 s through one
#                                 epoch) instead, its samples to $OUT/epoch_timeline.json
#   bench/first_epoch_device.sh proxy_threads [proxy_threads.py options]   there: what
#                                 `dsfs proxy --threads N` carries at 100 ms, results to $OUT
#   bench/first_epoch_device.sh disk_tier [disk_tier.py options]   there: the same set-up, then
#                                 issue 13's bench/disk_tier.py (the local-disk tier; its tiers
#                                 under --disk-dir, default /tmp, about 2.4 GB per case of 20,000
#                                 files, kept until the run ends), results to $OUT
#   bench/first_epoch_device.sh disk_tier_both [...]   the same with both bundles side by side
#                                 (disk_tier.py --builds; labels after, before)
#   bench/first_epoch_device.sh cluster [cluster.py options]   there: issue 12's bench/cluster.py
#                                 (one server against a local Redis Cluster, proxies in front of
#                                 every node at RTT > 0), results to $OUT, docs left alone
#
# The binaries run through wrappers that set LD_LIBRARY_PATH for them alone, so the machine's own
# Python is not handed the bundle's libraries.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bundle=${BUNDLE_DIR:-$repo/build-device-bundle}

if [[ ${1:-} == --bundle ]]; then
  build=$(cd "${2:-$repo/build-lead}" && pwd)
  staging=$(mktemp -d /tmp/device_bundle.XXXXXX)
  trap 'rm -rf "$staging"' EXIT
  binaries=("$build/dsfs" "$build/bench/dsfs_bench_redis_raw" "$(command -v redis-server)"
    "$(command -v redis-cli)")
  [[ -x $build/tests/view_cuda_test ]] && binaries+=("$build/tests/view_cuda_test")
  # perf, for first_epoch.py --perf there (the machine has none)
  perf_binary=$(readlink -f "$(command -v perf)" 2>/dev/null || true)
  [[ -x $perf_binary ]] && binaries+=("$perf_binary")
  "$repo/bench/pack_binaries.sh" "$staging/real" "$staging/libs" "${binaries[@]}"
  git -C "$repo" rev-parse --short HEAD >"$staging/source"
  sed -n 's/^CMAKE_BUILD_TYPE:STRING=//p' "$build/CMakeCache.txt" >"$staging/build_type"
  mkdir -p "$bundle"
  rm -f "$bundle/bundle.tar.xz"
  tar -C "$staging" -cJf "$bundle/bundle.tar.xz" real libs source build_type
  echo "bundle ready: $(du -h "$bundle/bundle.tar.xz" | cut -f1) in $bundle (built from $build)"
  exit 0
fi

[[ $(id -u) -eq 0 ]] || { echo "first_epoch_device.sh: needs root (FUSE mounts)" >&2; exit 1; }
[[ -f $bundle/bundle.tar.xz ]] ||
  { echo "first_epoch_device.sh: no $bundle/bundle.tar.xz; run --bundle where dsfs is built" >&2; exit 1; }
out=${OUT:-$repo/bench/results}
mkdir -p "$out"
work=$(mktemp -d /tmp/first_epoch_device.XXXXXX)
trap 'rm -rf "$work"' EXIT
wrap() {  # wrap DIR NAME TARGET: TARGET runs DIR's bundled NAME with DIR's libraries
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$1/libs" "$1/real/$2" >"$3"
  chmod +x "$3"
}
# unpack TARBALL DIR: the bundle under DIR, and DIR/build as a build folder for the benchmarks:
# wrappers for dsfs and dsfs_bench_redis_raw, and what bench/common.py's build_source reads
# (a CMakeCache and a .commit beside its source) so the results name the bundle's commit.
unpack() {
  mkdir -p "$2/build/bench" "$2/src"
  tar -C "$2" -xJf "$1"
  wrap "$2" dsfs "$2/build/dsfs"
  wrap "$2" dsfs_bench_redis_raw "$2/build/bench/dsfs_bench_redis_raw"
  cp "$2/source" "$2/src/.commit"
  printf 'CMAKE_HOME_DIRECTORY:INTERNAL=%s\nCMAKE_BUILD_TYPE:STRING=%s\n' "$2/src" \
    "$(cat "$2/build_type")" >"$2/build/CMakeCache.txt"
}
unpack "$bundle/bundle.tar.xz" "$work"
mkdir -p "$work/bin"
wrap "$work" redis-server "$work/bin/redis-server"
wrap "$work" redis-cli "$work/bin/redis-cli"  # disk_tier.py counts the server's GETs with it
[[ -x $work/real/perf ]] && wrap "$work" perf "$work/bin/perf"
export PATH=$work/bin:$PATH
echo "bundle from $(cat "$work/source"); $(nproc) CPUs; kernel $(uname -r)"
# An older bundle beside it (before.tar.xz): first_epoch.py runs both, side by side in one run.
builds=$work/build
labels=device
if [[ -f $bundle/before.tar.xz ]]; then
  unpack "$bundle/before.tar.xz" "$work/before"
  builds=$work/build,$work/before/build
  labels=after,before
  echo "before: bundle from $(cat "$work/before/source")"
fi

# FUSE: the device must exist (a VM's kernel may have it built in with no node made).
if [[ ! -c /dev/fuse ]]; then
  mknod -m 666 /dev/fuse c 10 229 2>/dev/null || true
fi
[[ -c /dev/fuse ]] || { echo "first_epoch_device.sh: no /dev/fuse on this machine" >&2; exit 1; }

if [[ -x $work/real/view_cuda_test && -z ${SKIP_CUDA_TEST:-} ]] && command -v nvidia-smi >/dev/null; then
  LD_LIBRARY_PATH=$work/libs timeout 60 "$work/real/view_cuda_test" --gtest_brief=1 \
    >"$out/view_cuda_test.log" 2>&1 && echo "view_cuda_test: passed" ||
    echo "view_cuda_test: FAILED or timed out (exit $?); see view_cuda_test.log"
  grep -E "PASSED|FAILED|SKIPPED" "$out/view_cuda_test.log" | head -n 5 || true
fi

if [[ ${1:-} == timeline ]]; then
  shift
  PYTHONUNBUFFERED=1 python3 "$repo/bench/epoch_timeline.py" --build "$work/build" \
    --data-dir "$work/data" --out "$out/epoch_timeline.json" "$@" 2>&1 |
    tee -a "$out/epoch_timeline.log"
  exit "${PIPESTATUS[0]}"
fi
if [[ ${1:-} == proxy_threads ]]; then
  shift
  PYTHONUNBUFFERED=1 python3 "$repo/bench/proxy_threads.py" --build "$work/build" \
    --data-dir "$work/data" --results-dir "$out" "$@" 2>&1 | tee -a "$out/proxy_threads.log"
  exit "${PIPESTATUS[0]}"
fi
if [[ ${1:-} == disk_tier || ${1:-} == disk_tier_both ]]; then
  tier_builds=(--build "$work/build")
  if [[ $1 == disk_tier_both ]]; then
    [[ -d $work/before/build ]] || { echo "first_epoch_device.sh: no before.tar.xz" >&2; exit 1; }
    tier_builds=(--builds "$builds" --labels "$labels")
  fi
  shift
  PYTHONUNBUFFERED=1 python3 "$repo/bench/disk_tier.py" "${tier_builds[@]}" \
    --data-dir "$work/data" --results-dir "$out" "$@" 2>&1 | tee -a "$out/disk_tier_device.log"
  exit "${PIPESTATUS[0]}"
fi
if [[ ${1:-} == cluster ]]; then
  shift
  PYTHONUNBUFFERED=1 python3 "$repo/bench/cluster.py" --build "$work/build" \
    --data-dir "$work/data" --results-dir "$out" --no-docs "$@" 2>&1 | tee -a "$out/cluster_device.log"
  exit "${PIPESTATUS[0]}"
fi
PYTHONUNBUFFERED=1 python3 "$repo/bench/first_epoch.py" --builds "$builds" --labels "$labels" \
  --results-dir "$out" --no-docs --data-dir "$work/data" "$@" 2>&1 | tee -a "$out/first_epoch_device.log"
