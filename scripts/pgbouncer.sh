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

# ours reports whether what answers on the port is a PgBouncer pooling
# transactions (this script's, or one configured alike).
ours() {
  psql -h 127.0.0.1 -p "$port" -U postgres -d pgbouncer -tA -c 'SHOW CONFIG' 2>/dev/null | grep -qx 'pool_mode|transaction|.*'
}

case "${1:-start}" in
start)
  if answers; then
    if ours; then
      echo "pgbouncer already answers on 127.0.0.1:$port, pooling transactions"
      exit 0
    fi
    echo "something else answers on 127.0.0.1:$port (not a PgBouncer in transaction mode): stop it or set PGBOUNCER_PORT" >&2
    exit 1
  fi
  if ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y pgbouncer >/dev/null || { apt-get update >/dev/null && apt-get install -y pgbouncer >/dev/null; }
    # The package may start its own service on 6432 (session mode).
    if command -v systemctl >/dev/null; then
      systemctl disable --now pgbouncer.service pgbouncer.socket >/dev/null 2>&1 || true
    fi
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
  # PgBouncer refuses to run as root.
  if [ "$(id -u)" = 0 ]; then
    chown -R postgres "$dir"
    runuser -u postgres -- "$bin" -d "$dir/pgbouncer.ini"
  else
    "$bin" -d "$dir/pgbouncer.ini"
  fi
  for _ in $(seq 1 50); do answers && break; sleep 0.1; done
  if ! answers || ! kill -0 "$(cat "$dir/pgbouncer.pid" 2>/dev/null)" 2>/dev/null || ! ours; then
    echo "pgbouncer did not start; its log:" >&2
    cat "$dir/pgbouncer.log" >&2
    exit 1
  fi
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
