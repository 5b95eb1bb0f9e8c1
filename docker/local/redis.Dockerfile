# A stand-in for the public redis:7-alpine image, built from the services base that
# docker/base/make-base.sh makes (Debian 13's Redis), for hosts that reach no registry. As the
# public image: the working directory /data (the volume redisdata: the append-only file), the
# server run as the redis user, and protected mode off when no configuration file is given (the
# compose network is the boundary; only the app services reach it).
ARG SERVICES_BASE=localhost/wecom-bot-services:trixie
FROM ${SERVICES_BASE}
COPY redis-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
WORKDIR /data
EXPOSE 6379
ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]
CMD ["redis-server"]
