# A stand-in for the public nginx:1.27-alpine image, built from the services base that
# docker/base/make-base.sh makes (Debian 13's nginx 1.26), for hosts that reach no registry. As
# the public image: /etc/nginx/conf.d/*.conf included in the http block (docker-compose.yml
# mounts docker/nginx/default.conf there), no other site, logs on the container's stdout and
# stderr, wget for the health check, nginx in the foreground.
ARG SERVICES_BASE=localhost/wecom-bot-services:trixie
FROM ${SERVICES_BASE}
RUN rm -f /etc/nginx/sites-enabled/* \
 && ln -sf /dev/stdout /var/log/nginx/access.log \
 && ln -sf /dev/stderr /var/log/nginx/error.log
EXPOSE 80 443
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
