#!/usr/bin/env bash
# Runs a stock PgBouncer in transaction mode in front of the local
# PostgreSQL, as a fleet puts one between many sidecars and one Postgres:
# .ci/run's PgBouncer pass and the scaling benchmark use it.
#
#   scripts/pgbouncer.sh start   # installs pgbouncer if missing, starts it
#   scripts/pgbouncer.sh stop
#   scripts/pgbouncer.sh pools   # SHOW POOLS on its admin console
#
# It listens on 127.0.0.1:$PGBOUNCER_PORT (6432) and passes every database
# name to 127.0.0.1:5432, with the settings the README's "Scaling" section
# names: pool_mode = transaction, default_pool_size = $PGBOUNCER_POOL_SIZE
# (5), auth_type = trust on loopback, ignore_startup_parameters =
# extra_float_digits. Nothing else is changed from PgBouncer's defaults but
# max_client_conn, raised for the tests' many pools. idemproxy reaches it
# with default_query_exec_mode=exec in IDEMPROXY_DATABASE_URL:
#   postgres://postgres@127.0.0.1:6432/test?sslmode=disable&default_query_exec_mode=exec
set -euo pipefail

dir=${PGBOUNCER_DIR:-/tmp/idemproxy-pgbouncer}
port=${PGBOUNCER_PORT:-6432}
pool=${PGBOUNCER_POOL_SIZE:-5}

answers() { pg_isready -h 127.0.0.1 -p "$port" -q; }

case "${1:-start}" in
start)
  if answers; then
    echo "pgbouncer already answers on 127.0.0.1:$port"
    exit 0
  fi
  if ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y pgbouncer >/dev/null || { apt-get update >/dev/null && apt-get install -y pgbouncer >/dev/null; }
  fi
  bin=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)
  mkdir -p "$dir"
  cat >"$dir/pgbouncer.ini" <<EOF
[databases]
* = host=127.0.0.1 port=5432

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = trust
auth_file = $dir/userlist.txt
admin_users = postgres
pool_mode = transaction
default_pool_size = $pool
max_client_conn = 2000
ignore_startup_parameters = extra_float_digits
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
  echo '"postgres" ""' >"$dir/userlist.txt"
  chown -R postgres "$dir"
  # PgBouncer refuses to run as root.
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$bin" -d "$dir/pgbouncer.ini"
  else
    "$bin" -d "$dir/pgbouncer.ini"
  fi
  for _ in $(seq 1 50); do answers && break; sleep 0.1; done
  answers || { echo "pgbouncer did not start; its log:"; cat "$dir/pgbouncer.log"; exit 1; }
  echo "pgbouncer $("$bin" --version | head -1) on 127.0.0.1:$port, transaction pooling, $pool server connections per database"
  ;;
stop)
  if [ -f "$dir/pgbouncer.pid" ]; then
    kill "$(cat "$dir/pgbouncer.pid")" 2>/dev/null || true
  fi
  ;;
pools)
  psql -h 127.0.0.1 -p "$port" -U postgres -d pgbouncer -c 'SHOW POOLS'
  ;;
*)
  echo "usage: $0 start|stop|pools" >&2
  exit 2
  ;;
esac
