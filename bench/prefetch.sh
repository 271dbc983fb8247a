#!/usr/bin/env bash
# The prefetch engine's benchmark (see bench/prefetch.py --help). Needs a build (scripts/build).
exec /usr/bin/python3 "$(dirname "$0")/prefetch.py" "$@"
