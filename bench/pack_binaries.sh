#!/usr/bin/env bash
# Packs binaries for a machine that lacks dsfs's libraries (the device machine some sessions are
# lent): copies each BINARY, without its debug information (its symbol table stays, so `perf`
# there names functions), into BIN_DIR, and every shared library they load except
# the C runtime, which any x86-64 Linux has (a newer glibc/libstdc++ there runs binaries built
# against an older one), into LIB_DIR. Used by view_gpu.sh and first_epoch_device.sh.
#
#   bench/pack_binaries.sh BIN_DIR LIB_DIR BINARY...
set -euo pipefail
if [[ $# -lt 3 ]]; then
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
bin_dir=$1
lib_dir=$2
shift 2
mkdir -p "$bin_dir" "$lib_dir"
packed=()
for binary in "$@"; do
  cp "$binary" "$bin_dir/"
  packed+=("$bin_dir/$(basename "$binary")")
done
strip --strip-debug "${packed[@]}"
ldd "${packed[@]}" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
  grep -vE '/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+)\.so' |
  xargs -r cp -L -t "$lib_dir/"
