#!/usr/bin/env bash
# Install a real Docker engine (Debian's docker.io), Compose v1, debootstrap and
# headless chromium, then start dockerd in the background when none answers.
#
# Usage: sudo .ci/install-docker.sh        (idempotent; safe to run twice)
#
# There is no systemd here, so dockerd is started by hand and its log goes to
# $DOCKERD_LOG. The script returns once `docker info` answers, or fails after
# $DOCKERD_MAX_TRIES seconds with the tail of that log.
set -euo pipefail

DOCKERD_LOG="${DOCKERD_LOG:-/var/log/dockerd.log}"
DOCKERD_MAX_TRIES="${DOCKERD_MAX_TRIES:-60}"
PACKAGES=(docker.io docker-compose debootstrap chromium chromium-driver curl ca-certificates)

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "install-docker: installing ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
    echo "install-docker: packages already installed"
fi

if docker info >/dev/null 2>&1; then
    echo "install-docker: a Docker engine already answers"
else
    echo "install-docker: starting dockerd (log: $DOCKERD_LOG)"
    # setsid + nohup: the daemon outlives this script and the CI step that ran it.
    as_root bash -c "setsid nohup dockerd >'$DOCKERD_LOG' 2>&1 </dev/null &"
    for ((i = 1; i <= DOCKERD_MAX_TRIES; i++)); do
        docker info >/dev/null 2>&1 && break
        sleep 1
    done
    if ! docker info >/dev/null 2>&1; then
        echo "install-docker: dockerd did not answer after ${DOCKERD_MAX_TRIES}s; last log lines:" >&2
        tail -n 30 "$DOCKERD_LOG" >&2 || true
        exit 1
    fi
fi

docker version --format 'install-docker: engine {{.Server.Version}} (API {{.Server.APIVersion}})'
docker-compose version --short | sed 's/^/install-docker: docker-compose /'
