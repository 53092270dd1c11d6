#!/usr/bin/env bash
# Entrypoint with the official rabbitmq image's contract: RABBITMQ_DEFAULT_USER,
# RABBITMQ_DEFAULT_PASS, RABBITMQ_DEFAULT_VHOST and RABBITMQ_ERLANG_COOKIE become
# configuration, then the server runs as the rabbitmq user.
set -Eeuo pipefail

if [[ ${1:0:1} == '-' ]]; then
  set -- rabbitmq-server "$@"
fi

if [[ $1 == rabbitmq-server && $(id -u) == 0 ]]; then
  chown -R rabbitmq:rabbitmq /var/lib/rabbitmq || :
  exec gosu rabbitmq "${BASH_SOURCE[0]}" "$@"
fi

if [[ $1 == rabbitmq-server ]]; then
  defaults=/etc/rabbitmq/conf.d/20-env-defaults.conf
  : >"$defaults"
  [[ -n ${RABBITMQ_DEFAULT_USER:-} ]] && echo "default_user = $RABBITMQ_DEFAULT_USER" >>"$defaults"
  [[ -n ${RABBITMQ_DEFAULT_PASS:-} ]] && echo "default_pass = $RABBITMQ_DEFAULT_PASS" >>"$defaults"
  [[ -n ${RABBITMQ_DEFAULT_VHOST:-} ]] && echo "default_vhost = $RABBITMQ_DEFAULT_VHOST" >>"$defaults"
  if [[ -n ${RABBITMQ_ERLANG_COOKIE:-} ]]; then
    cookie=$HOME/.erlang.cookie
    printf '%s' "$RABBITMQ_ERLANG_COOKIE" >"$cookie"
    chmod 600 "$cookie"
  fi
fi

exec "$@"
