#!/usr/bin/env bash
# Start Redis and PostgreSQL (and RabbitMQ, when installed) if nothing listens on their ports yet;
# fail when Redis or PostgreSQL is still not there (TESTS_WITHOUT_POSTGRES=1: PostgreSQL may be absent).
set -u
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if ! listening 6379; then
  if command -v redis-server >/dev/null; then
    echo "starting redis-server on 127.0.0.1:6379"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null
    for _ in $(seq 50); do listening 6379 && break; sleep 0.1; done
  else
    echo "redis is not running on 127.0.0.1:6379 and redis-server is not installed" >&2
    exit 1
  fi
fi

if ! listening 5432 && [ -d /etc/postgresql ] && command -v pg_ctlcluster >/dev/null; then
  echo "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  for _ in $(seq 50); do listening 5432 && break; sleep 0.2; done
fi
# The PostgreSQL variants of the tests fail without it (tests/support/postgres.py): say so here,
# unless they are left out on purpose.
if ! listening 5432 && [ "${TESTS_WITHOUT_POSTGRES:-}" != 1 ]; then
  echo "PostgreSQL is not running on 127.0.0.1:5432 and could not be started" \
       "(set TESTS_WITHOUT_POSTGRES=1 to run the tests without it)" >&2
  exit 1
fi
if ! listening 5672 && command -v rabbitmq-server >/dev/null; then
  echo "starting RabbitMQ"
  rabbitmq-server -detached || true
  for _ in $(seq 120); do listening 5672 && break; sleep 0.5; done
fi
exit 0
