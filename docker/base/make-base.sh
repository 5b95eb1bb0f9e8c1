#!/usr/bin/env bash
# Base images made on this machine with debootstrap, for hosts that reach Debian's mirror but no
# image registry (docs/deploy.md, "Building without a registry"):
#   docker/base/make-base.sh app        -> localhost/wecom-bot-base:bookworm
#       Debian 12 with Python 3.11 (as python:3.11-slim-bookworm, the images' default base),
#       venv, gcc (the engine's CPU kernels) and useradd: the app images' BASE_IMAGE
#   docker/base/make-base.sh services   -> localhost/wecom-bot-services:trixie
#       Debian 13 with PostgreSQL 17, Redis, nginx 1.26: what docker/local/ builds its
#       stand-ins for the public postgres, redis and nginx images from
# The root filesystem is kept as a tarball under DEPLOY_CACHE (default /var/cache/wecom-deploy),
# keyed by suite, package list and mirror, and imported with `podman import`; a rerun finds the
# image (or the tarball) and does nothing more. Needs root, debootstrap and podman.
set -euo pipefail
flavor="${1:?usage: make-base.sh app|services}"
cache="${DEPLOY_CACHE:-/var/cache/wecom-deploy}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
case "$flavor" in
  app) suite=bookworm image=localhost/wecom-bot-base:bookworm
       packages="python3,python3-venv,ca-certificates,gcc,libc6-dev,passwd" ;;
  services) suite=trixie image=localhost/wecom-bot-services:trixie
       packages="postgresql,redis-server,redis-tools,nginx,wget,openssl,ca-certificates" ;;
  *) echo "unknown flavor $flavor (app or services)" >&2; exit 2 ;;
esac
key="$(printf '%s %s %s' "$suite" "$packages" "$mirror" | sha256sum | cut -c1-12)"
tarball="$cache/base/$suite-$flavor-$key.tar"

if podman image exists "$image" \
   && [ "$(podman image inspect -f '{{index .Config.Labels "base-key"}}' "$image")" = "$key" ]; then
  echo "base $image is there (key $key)"
  exit 0
fi
if [ ! -f "$tarball" ]; then
  rootfs="$cache/base/rootfs-$suite-$key"
  rm -rf "$rootfs"
  mkdir -p "$cache/base"
  debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror"
  # Nothing a container needs: the package cache and lists, docs, man pages, translations.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/*
  find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
  tar -C "$rootfs" --numeric-owner -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
  rm -rf "$rootfs"
fi
podman import --change "LABEL base-key=$key" \
  --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  --change 'CMD ["/bin/bash"]' "$tarball" "$image" >/dev/null
echo "imported $image from $tarball ($(du -h "$tarball" | cut -f1))"
