# A stand-in for the public postgres:17 image, built from the services base that
# docker/base/make-base.sh makes (Debian 13's PostgreSQL 17), for hosts that reach no registry.
# It behaves as the public image does where docker-compose.yml relies on it: POSTGRES_USER /
# POSTGRES_PASSWORD / POSTGRES_DB make the cluster and its database on the first start with an
# empty PGDATA (the volume pgdata), password (scram-sha-256) logins over the network, pg_isready
# on PATH, the server run as the postgres user.
ARG SERVICES_BASE=localhost/wecom-bot-services:trixie
FROM ${SERVICES_BASE}
# Debian's own cluster is not used: the data lives in PGDATA, made by the entrypoint.
RUN rm -rf /var/lib/postgresql/17/main /etc/postgresql/17/main
ENV PATH=/usr/lib/postgresql/17/bin:$PATH PGDATA=/var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
STOPSIGNAL SIGINT
EXPOSE 5432
ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]
CMD ["postgres"]
