# Sourced by docker/lock.sh, docker/wheelhouse.sh and scripts/deploy_smoke.sh: the build tools'
# virtual environment under DEPLOY_CACHE (pip-tools, podman-compose; pip itself for downloads),
# made on first use on TOOLS_PYTHON, by default Debian 12's /usr/bin/python3 (3.11.2, the oldest
# Python the images run: docker/lock.sh resolves the lock on it). Sets $tools.
cache="${DEPLOY_CACHE:-/var/cache/wecom-deploy}"
tools="$cache/tools"
tools_python="${TOOLS_PYTHON:-/usr/bin/python3}"
tools_want="pip-tools==7.6.2 podman-compose==1.6.0"
if [ ! -x "$tools/bin/pip-compile" ] || [ ! -x "$tools/bin/podman-compose" ] \
   || [ "$("$tools/bin/python" -V 2>&1)" != "$("$tools_python" -V 2>&1)" ]; then
  rm -rf "$tools"
  mkdir -p "$cache"
  "$tools_python" -m venv "$tools"
  # shellcheck disable=SC2086
  "$tools/bin/pip" install -q $tools_want
fi
