#!/usr/bin/env bash
# Entrypoint with the official postgres image's contract: POSTGRES_PASSWORD, POSTGRES_USER,
# POSTGRES_DB, POSTGRES_INITDB_ARGS, POSTGRES_INITDB_WALDIR, POSTGRES_HOST_AUTH_METHOD (each
# also as VAR_FILE), /docker-entrypoint-initdb.d/*.{sh,sql,sql.gz}, and "postgres" as command.
set -Eeuo pipefail

# file_env VAR [DEFAULT]: VAR from the environment, or from the file named by VAR_FILE.
file_env() {
  local var=$1 file_var="${1}_FILE" default=${2:-}
  if [[ -n ${!var:-} && -n ${!file_var:-} ]]; then
    echo "error: both $var and $file_var are set (but are exclusive)" >&2
    exit 1
  fi
  local value=$default
  if [[ -n ${!var:-} ]]; then
    value=${!var}
  elif [[ -n ${!file_var:-} ]]; then
    value=$(<"${!file_var}")
  fi
  export "$var=$value"
  unset "$file_var"
}

if [[ ${1:0:1} == '-' ]]; then
  set -- postgres "$@"
fi

if [[ $1 != postgres ]]; then
  exec "$@"
fi

# Started as root: make the data directories ours, then drop to the postgres user.
if [[ $(id -u) == 0 ]]; then
  mkdir -p "$PGDATA"
  chmod 00700 "$PGDATA" || :
  chown postgres:postgres "$PGDATA" || :
  mkdir -p /var/run/postgresql
  chown postgres:postgres /var/run/postgresql
  chmod 03775 /var/run/postgresql
  if [[ -n ${POSTGRES_INITDB_WALDIR:-} ]]; then
    mkdir -p "$POSTGRES_INITDB_WALDIR"
    chown postgres:postgres "$POSTGRES_INITDB_WALDIR"
  fi
  exec gosu postgres "${BASH_SOURCE[0]}" "$@"
fi

file_env POSTGRES_PASSWORD
file_env POSTGRES_USER postgres
file_env POSTGRES_DB "$POSTGRES_USER"
file_env POSTGRES_INITDB_ARGS
: "${POSTGRES_HOST_AUTH_METHOD:=scram-sha-256}"

if [[ ! -s $PGDATA/PG_VERSION ]]; then
  if [[ -z $POSTGRES_PASSWORD && $POSTGRES_HOST_AUTH_METHOD != trust ]]; then
    cat >&2 <<'MSG'
error: database is uninitialized and superuser password is not specified.
       Set POSTGRES_PASSWORD (or POSTGRES_PASSWORD_FILE), or POSTGRES_HOST_AUTH_METHOD=trust
       to allow all connections without a password (never do that in production).
MSG
    exit 1
  fi
  mkdir -p "$PGDATA"
  chmod 00700 "$PGDATA"
  # initdb needs the running uid in passwd; an arbitrary uid (OpenShift-style) gets one.
  if ! getent passwd "$(id -u)" >/dev/null && [[ -e /usr/lib/libnss_wrapper.so || -e /usr/lib/x86_64-linux-gnu/libnss_wrapper.so ]]; then
    export NSS_WRAPPER_PASSWD NSS_WRAPPER_GROUP LD_PRELOAD=libnss_wrapper.so
    NSS_WRAPPER_PASSWD=$(mktemp) NSS_WRAPPER_GROUP=$(mktemp)
    echo "postgres:x:$(id -u):$(id -g):PostgreSQL:$PGDATA:/bin/false" >"$NSS_WRAPPER_PASSWD"
    echo "postgres:x:$(id -g):" >"$NSS_WRAPPER_GROUP"
  fi
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  initdb_args=(--username="$POSTGRES_USER" --pwfile="$pwfile")
  [[ -n ${POSTGRES_INITDB_WALDIR:-} ]] && initdb_args+=(--waldir="$POSTGRES_INITDB_WALDIR")
  # shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of words, as upstream
  initdb "${initdb_args[@]}" $POSTGRES_INITDB_ARGS
  rm -f "$pwfile"
  unset LD_PRELOAD NSS_WRAPPER_PASSWD NSS_WRAPPER_GROUP

  if [[ $POSTGRES_HOST_AUTH_METHOD == trust ]]; then
    echo "warning: POSTGRES_HOST_AUTH_METHOD=trust lets anyone connect without a password" >&2
  fi
  printf '\nhost all all all %s\n' "$POSTGRES_HOST_AUTH_METHOD" >>"$PGDATA/pg_hba.conf"

  # A socket-only server for the init scripts, so nothing connects before they finish.
  PGUSER=$POSTGRES_USER PGPASSWORD=$POSTGRES_PASSWORD \
    pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -p ${PGPORT:-5432}" -w start
  psql_init=(psql -v ON_ERROR_STOP=1 --no-psqlrc --username "$POSTGRES_USER" --no-password)
  if [[ $POSTGRES_DB != postgres ]]; then
    PGPASSWORD=$POSTGRES_PASSWORD "${psql_init[@]}" --dbname postgres --set db="$POSTGRES_DB" \
      <<<'CREATE DATABASE :"db";'
  fi
  for f in /docker-entrypoint-initdb.d/*; do
    [[ -e $f ]] || continue
    # shellcheck disable=SC1090 # init scripts are the user's
    case $f in
      *.sh) if [[ -x $f ]]; then "$f"; else . "$f"; fi ;;
      *.sql) PGPASSWORD=$POSTGRES_PASSWORD "${psql_init[@]}" --dbname "$POSTGRES_DB" -f "$f" ;;
      *.sql.gz) gunzip -c "$f" | PGPASSWORD=$POSTGRES_PASSWORD "${psql_init[@]}" --dbname "$POSTGRES_DB" ;;
      *) echo "$0: ignoring $f" >&2 ;;
    esac
  done
  pg_ctl -D "$PGDATA" -m fast -w stop
  echo "PostgreSQL init process complete; ready for start up." >&2
fi

exec "$@"
