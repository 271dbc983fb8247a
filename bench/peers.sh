#!/usr/bin/env bash
# dsfs beside the alternatives (issue 15; see bench/peers.py --help): installs the peers' Debian
# packages when missing (rclone, nginx, python3-redis), then runs bench/peers.py. Needs root and a
# build (scripts/build, or --build DIR). scripts/test never runs this.
set -euo pipefail
missing=()
command -v rclone >/dev/null 2>&1 || missing+=(rclone)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx)
/usr/bin/python3 -c 'import redis' >/dev/null 2>&1 || missing+=(python3-redis)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "peers.sh: installing ${missing[*]} (Debian packages)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "${missing[@]}" ||
    { apt-get update && apt-get install -y --no-install-recommends "${missing[@]}"; }
fi
exec /usr/bin/python3 "$(dirname "$0")/peers.py" "$@"
