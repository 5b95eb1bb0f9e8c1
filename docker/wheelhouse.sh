#!/usr/bin/env bash
# Fetch every file of docker/requirements.lock (hash-checked) into a wheelhouse, for image builds
# that reach no package index: the Dockerfiles install from docker/wheelhouse/ when it holds
# wheels (pip --no-index --find-links), else from the index.
#   docker/wheelhouse.sh [DIR]     (default: docker/wheelhouse, which the build context carries)
# The files are kept under DEPLOY_CACHE/wheelhouse/<the lock's sha256> and hard-linked into DIR,
# so a rerun with the same lock downloads nothing. torch's CPU build comes from PyTorch's CPU
# index, or from TORCH_FIND_LINKS (a folder holding its wheel; else PIP_FIND_LINKS, as pip
# would). The wheelhouse also carries wheel (with the lock's setuptools, jieba's build
# requirements: jieba ships only a source archive, which pip builds inside the image).
set -euo pipefail
cd "$(dirname "$0")/.."
target="${1:-docker/wheelhouse}"
. docker/tools.sh
lock=docker/requirements.lock
key="$(sha256sum "$lock" | cut -c1-16)"
store="$cache/wheelhouse/$key"
if [ ! -f "$store/.complete" ]; then
  TORCH_FIND_LINKS="${TORCH_FIND_LINKS:-${PIP_FIND_LINKS:-}}"  # as pip finds it here
  if [ -n "$TORCH_FIND_LINKS" ]; then
    torch_source=(--find-links "$TORCH_FIND_LINKS")
  else
    torch_source=(--extra-index-url https://download.pytorch.org/whl/cpu)
  fi
  mkdir -p "$store"
  # The files the lock names, each checked against its hash; only the Python and platform of
  # the images (CPython 3.11, manylinux x86_64 or the build machine's).
  PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= "$tools/bin/pip" download -q --require-hashes --no-deps \
    "${torch_source[@]}" -d "$store" -r "$lock"
  # jieba's build requirements (pip's default for a project without pyproject.toml)
  PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= "$tools/bin/pip" download -q --no-deps -d "$store" \
    "wheel==0.45.1"
  touch "$store/.complete"
fi
mkdir -p "$target"
find "$target" -maxdepth 1 -type f \( -name '*.whl' -o -name '*.tar.gz' -o -name '*.zip' \) -delete
cp -l "$store"/*.whl "$store"/*.tar.gz "$target"/ 2>/dev/null || cp "$store"/*.whl "$store"/*.tar.gz "$target"/
echo "wheelhouse $target: $(ls "$target" | grep -c -E '\.(whl|tar\.gz)$') files from $store"
