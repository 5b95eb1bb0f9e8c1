#!/usr/bin/env bash
# Regenerate the images' lock file, docker/requirements.lock: every package the images install
# (pyproject.toml's runtime dependencies, torch's CPU build and everything they pull in), pinned
# with the sha256 of each of its files; the images install it with --require-hashes.
#   docker/lock.sh                 # after changing pyproject.toml's dependencies; commit both files
# torch's CPU build comes from PyTorch's CPU index, or from a folder holding its wheel
# (TORCH_FIND_LINKS, else PIP_FIND_LINKS as pip itself would use it):
#   TORCH_FIND_LINKS=/opt/wheels docker/lock.sh
# pip-tools runs from the tools' virtual environment (docker/tools.sh) on Debian 12's Python: the
# lock is resolved for the oldest Python the images run, 3.11.2, since a package's markers may ask
# for more below a patch release (redis needs async-timeout before 3.11.3); a newer 3.11 installs
# the same set.
set -euo pipefail
cd "$(dirname "$0")/.."
. docker/tools.sh
python3 docker/requirements.py --torch-variant cpu pyproject.toml > docker/requirements.in
TORCH_FIND_LINKS="${TORCH_FIND_LINKS:-${PIP_FIND_LINKS:-}}"  # as pip finds it here
if [ -n "$TORCH_FIND_LINKS" ]; then
  torch_source=(--find-links "$TORCH_FIND_LINKS")
else
  torch_source=(--extra-index-url https://download.pytorch.org/whl/cpu)
fi
# No pip configuration of this machine (its local mirrors) enters the lock: PyPI and the torch
# source above only, and neither is written into the file.
CUSTOM_COMPILE_COMMAND="docker/lock.sh" PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= \
  "$tools/bin/pip-compile" --quiet --generate-hashes --allow-unsafe --strip-extras \
  --no-emit-index-url --no-emit-find-links --rebuild "${torch_source[@]}" \
  --output-file docker/requirements.lock docker/requirements.in
echo "wrote docker/requirements.lock ($(grep -c '^[a-z0-9]' docker/requirements.lock) packages)"
