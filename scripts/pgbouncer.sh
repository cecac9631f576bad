#!/usr/bin/env bash
# Runs a stock PgBouncer in transaction mode in front of the local
# PostgreSQL, as a fleet puts one between many sidecars and one Postgres:
# .ci/run's PgBouncer pass and the scaling benchmark use it.
#
#   scripts/pgbouncer.sh start   # installs pgbouncer if missing, starts one
#   scripts/pgbouncer.sh url     # the URL idemproxy reaches it with
#   scripts/pgbouncer.sh pools   # SHOW POOLS on its admin console
#   scripts/pgbouncer.sh stop    # stops the one start started
#
# The instance lives in $PGBOUNCER_DIR (default /tmp/idemproxy-pgbouncer):
# its configuration, log, pid and port. The script acts only on the
# instance it started there: start refuses a port something else answers
# on, and stop stops only the process whose pid file is in the folder and
# whose command line names its configuration. It listens on
# 127.0.0.1:$PGBOUNCER_PORT (default 6432; 0 picks a free port) and passes
# every database name to 127.0.0.1:5432, with the settings
# docs/scaling-postgres.md ("PgBouncer in transaction mode") names: pool_mode =
# transaction, default_pool_size = $PGBOUNCER_POOL_SIZE (5), auth_type =
# trust on loopback, ignore_startup_parameters = extra_float_digits.
# Nothing else is changed from PgBouncer's defaults but max_client_conn,
# raised for the tests' many pools. idemproxy reaches it with
# default_query_exec_mode=exec in IDEMPROXY_DATABASE_URL, as url prints:
#   postgres://postgres@127.0.0.1:6432/idemproxy_test?sslmode=disable&default_query_exec_mode=exec
# (the tests' default database; PGBOUNCER_DB names another).
set -euo pipefail

dir=${PGBOUNCER_DIR:-/tmp/idemproxy-pgbouncer}
pool=${PGBOUNCER_POOL_SIZE:-5}

answers() { pg_isready -h 127.0.0.1 -p "$1" -q; }

# pooling reports whether what answers on port $1 is a PgBouncer pooling
# transactions.
pooling() {
  psql -h 127.0.0.1 -p "$1" -U postgres -d pgbouncer -tA -c 'SHOW CONFIG' 2>/dev/null | grep -qx 'pool_mode|transaction|.*'
}

# running reports whether the PgBouncer this script started in $dir is
# alive: its pid file names a process whose command line names $dir's
# configuration.
running() {
  local pid
  pid=$(cat "$dir/pgbouncer.pid" 2>/dev/null) || return 1
  [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "$dir/pgbouncer.ini"
}

# free_port prints a loopback port nothing listens on.
free_port() {
  local p
  for p in $(seq 16432 16532); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return
    fi
  done
  echo "no free port in 16432-16532" >&2
  return 1
}

port_of() {
  cat "$dir/port" 2>/dev/null || { echo "no PgBouncer started by this script in $dir" >&2; exit 1; }
}

case "${1:-start}" in
start)
  if running; then
    echo "pgbouncer already running on 127.0.0.1:$(port_of), started by this script in $dir"
    exit 0
  fi
  port=${PGBOUNCER_PORT:-6432}
  if [ "$port" = 0 ]; then
    port=$(free_port)
  fi
  if answers "$port"; then
    echo "something this script did not start (in $dir) answers on 127.0.0.1:$port: stop it, or set PGBOUNCER_PORT (0 picks a free port)" >&2
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
  echo "$port" >"$dir/port"
  # PgBouncer refuses to run as root.
  if [ "$(id -u)" = 0 ]; then
    chown -R postgres "$dir"
    runuser -u postgres -- "$bin" -d "$dir/pgbouncer.ini"
  else
    "$bin" -d "$dir/pgbouncer.ini"
  fi
  for _ in $(seq 1 50); do answers "$port" && break; sleep 0.1; done
  if ! answers "$port" || ! running || ! pooling "$port"; then
    echo "pgbouncer did not start; its log:" >&2
    cat "$dir/pgbouncer.log" >&2
    exit 1
  fi
  echo "pgbouncer $("$bin" --version | head -1) on 127.0.0.1:$port, transaction pooling, $pool server connections per database"
  ;;
url)
  echo "postgres://postgres@127.0.0.1:$(port_of)/${PGBOUNCER_DB:-idemproxy_test}?sslmode=disable&default_query_exec_mode=exec"
  ;;
pools)
  psql -h 127.0.0.1 -p "$(port_of)" -U postgres -d pgbouncer -c 'SHOW POOLS'
  ;;
stop)
  if ! running; then
    echo "no PgBouncer started by this script runs in $dir; nothing stopped"
    exit 0
  fi
  pid=$(cat "$dir/pgbouncer.pid")
  kill "$pid"
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  rm -f "$dir/pgbouncer.ini" "$dir/userlist.txt" "$dir/port"
  echo "pgbouncer stopped"
  ;;
*)
  echo "usage: $0 start|url|pools|stop" >&2
  exit 2
  ;;
esac
