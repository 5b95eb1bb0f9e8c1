#!/usr/bin/env bash
# The deploy test (docs/deploy.md, "The deploy test"): the images built from a base made here,
# the compose stack up with podman-compose, the WeCom emulator verifying nginx's HTTPS callback
# URL and asking questions, `audit verify`, the stack down; each step timed.
#   scripts/deploy_smoke.sh [--worktree] [--keep] [--upgrade-from REV]
# Needs root (debootstrap, rootful podman). Installs what it lacks: Debian's podman, runc,
# debootstrap and openssl (apt-get), podman-compose and pip-tools in DEPLOY_CACHE/tools, the
# project's .venv (make install: the emulator runs from it). DEPLOY_CACHE (default
# /var/cache/wecom-deploy) keeps the base images' tarballs, the wheelhouse and the work tree.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
for tool in podman runc debootstrap openssl; do
  command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
. docker/tools.sh
export PATH="$tools/bin:$PATH:/usr/sbin:/sbin"
# podman on a host without systemd and with cgroups v1 (docs/deploy.md): runc, not crun (which
# fails on setrlimit and hybrid cgroups), cgroupfs, no default ulimits, events in a file.
export CONTAINERS_CONF="$cache/containers.conf"
cat > "$CONTAINERS_CONF" <<'CONF'
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
[ -x .venv/bin/python ] || make install
exec .venv/bin/python -m scripts.deploy "$@"
