#!/usr/bin/env bash
# Runs each GoogleTest binary named, each with a TMPDIR of its own, and fails naming what one
# left there: a test's temp files must go when it ends, child processes' included (a death
# test's child that made a TempDir and left by _Exit left one per run in /tmp).
#   leaves_no_temp_files.sh BINARY...
set -euo pipefail
status=0
for binary in "$@"; do
  tmp="$(mktemp -d)"
  chmod 1777 "$tmp"  # as /tmp: tests that drop root (to nobody) still reach their files
  if ! TMPDIR="$tmp" "$binary" --gtest_brief=1; then
    echo "$(basename "$binary") failed" >&2
    status=1
  fi
  leftovers="$(find "$tmp" -mindepth 1 -maxdepth 1)"
  if [ -n "$leftovers" ]; then
    echo "$(basename "$binary") left in its TMPDIR (a test's temp directory not removed):" >&2
    echo "$leftovers" >&2
    status=1
  fi
  rm -rf "$tmp"
done
exit "$status"
