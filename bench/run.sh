#!/usr/bin/env bash
# The side-by-side read-path benchmark (see bench/run.py --help). Needs a build (scripts/build).
exec /usr/bin/python3 "$(dirname "$0")/run.py" "$@"
