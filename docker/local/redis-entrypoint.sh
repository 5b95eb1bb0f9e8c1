#!/bin/sh
# As the public redis image's entrypoint: /data owned by redis, the server run as redis, and
# "--protected-mode no" added when redis-server is started without a configuration file.
set -eu
if [ "$1" = redis-server ]; then
  chown -R redis:redis /data
  shift
  case "${1:-}" in
    *.conf) ;;
    *) set -- --protected-mode no "$@" ;;
  esac
  exec setpriv --reuid=redis --regid=redis --init-groups redis-server "$@"
fi
exec "$@"
