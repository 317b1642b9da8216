#!/usr/bin/env bash
# Build the controller's container image from the Dockerfile with podman, where no registry is reachable.
#
# The Dockerfile is written for the real upstream base (python:3.11-slim). When that base is not in
# podman's local store and cannot be pulled, a stand-in is made once from Debian packages (mmdebstrap,
# bookworm: its python3 is 3.11) and given the base's name; the build itself never pulls (--pull=never).
# Podman's settings for this kind of sandbox (no 1M open-file limit, runc) live in a private
# containers.conf, passed by CONTAINERS_CONF; /etc is left alone. Prints the image name on its last line.
#
#   loadtest/image/build.sh [IMAGE]     (default inference-autoscaler:0.1.0, as deploy/ names it)
set -euo pipefail

IMAGE="${1:-inference-autoscaler:0.1.0}"
BASE="docker.io/library/python:3.11-slim"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/inference-autoscaler/podman"
mkdir -p "$CACHE"
export CONTAINERS_CONF="$CACHE/containers.conf"
cat > "$CONTAINERS_CONF" <<'CONF'
[containers]
default_ulimits = ["nofile=16384:16384", "nproc=16384:16384"]
[engine]
runtime = "runc"
CONF

for tool in podman runc mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "$tool is required (make system installs Debian's podman, runc, mmdebstrap)" >&2; exit 1; }
done

if ! podman image exists "$BASE"; then
  if ! timeout 60 podman pull -q "$BASE" >/dev/null 2>&1; then
    echo "making a stand-in for $BASE from Debian packages (first time only)..." >&2
    sources=$(ls /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1 || true)
    mirror="${sources:-http://deb.debian.org/debian}"
    ca=/etc/ssl/certs/ca-certificates.crt
    mmdebstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --customize-hook="if [ -f $ca ]; then cp $ca \"\$1$ca\"; fi" \
      bookworm "$CACHE/base.tar" "$mirror" >&2
    podman import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$CACHE/base.tar" "$BASE" >/dev/null
    rm -f "$CACHE/base.tar"
  fi
fi

podman build --pull=never -q -t "$IMAGE" "$ROOT" >&2
podman image prune -f >/dev/null 2>&1 || true
echo "$IMAGE"
