#!/usr/bin/env bash
# Runs a throw-away Citus cluster on this machine for tests: a coordinator
# and two workers, each an ordinary PostgreSQL 15 server of its own (its
# own data directory, port and log) with the citus extension preloaded,
# as ../shared/citus/README.md describes. The main PostgreSQL on 5432 is
# never touched: not stopped, not reconfigured, not connected to.
#
#   scripts/citus.sh start   # installs citus if missing, starts the three
#                            # nodes, prints the coordinator's URL last
#   scripts/citus.sh url     # the coordinator's URL of the running cluster
#   scripts/citus.sh stop    # stops the nodes this script started, removes
#                            # CITUS_DIR
#
# Environment:
#   CITUS_DIR     where the nodes live (default /tmp/idemproxy-citus): data
#                 directories coordinator/, worker1/, worker2/, their logs,
#                 their unix sockets, and the file "cluster" that records
#                 the ports (and marks the directory as this script's)
#   CITUS_PORT    the first loopback port tried (default 55432); every node
#                 takes the next free one from there upward
#   CITUS_SHARED  the shared folder whose citus/ holds install.sh and the
#                 Citus tarball (default: the one beside the repository's
#                 main checkout, ../shared as seen from it); used only when
#                 citus.so is not installed yet
#
# The URL it prints, for TEST_DATABASE_URL or IDEMPROXY_DATABASE_URL:
#   postgres://postgres@127.0.0.1:PORT/test?sslmode=disable
# Every node has the database test with CREATE EXTENSION citus done; the
# coordinator knows itself (citus_set_coordinator_host) and both workers
# (citus_add_node). Distributing tables is left to the caller: after the
# migrations, SELECT create_distributed_table('idempotency_keys', 'tenant_id').
#
# Run it as root (the servers then run as the postgres user, through
# runuser) or as the postgres user (or any user that may run initdb).
set -euo pipefail

dir=${CITUS_DIR:-/tmp/idemproxy-citus}
first_port=${CITUS_PORT:-55432}
pgbin=/usr/lib/postgresql/15/bin
pglib=/usr/lib/postgresql/15/lib
nodes=(coordinator worker1 worker2)
state=$dir/cluster # "node port" lines; its presence marks the dir as ours
here=$(cd "$(dirname "$0")" && pwd)

die() {
  echo "citus.sh: $*" >&2
  exit 1
}

# as_pg runs a command as the postgres user when this script runs as root,
# as the current user otherwise (PostgreSQL refuses to run as root).
as_pg() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

# installer prints the path of Citus's install.sh: in $CITUS_SHARED/citus
# (or $CITUS_SHARED itself) when set, else in the shared/ folder beside the
# repository's main checkout, or beside the local checkout it was cloned
# from.
installer() {
  local candidates=() top common origin c
  if [ -n "${CITUS_SHARED:-}" ]; then
    candidates=("$CITUS_SHARED/citus" "$CITUS_SHARED")
  else
    # The checkout's ../shared; from a linked worktree also the main
    # checkout's, whose .git is the common dir. (As root in a repo owned
    # by another user git may refuse: the script's own place is the
    # fallback.)
    if top=$(git -C "$here" rev-parse --show-toplevel 2>/dev/null); then
      candidates+=("$top/../shared/citus")
    fi
    if common=$(git -C "$here" rev-parse --path-format=absolute --git-common-dir 2>/dev/null); then
      candidates+=("$(dirname "$common")/../shared/citus")
    fi
    candidates+=("$here/../../shared/citus")
    # A clone of a local checkout (as CI makes): beside the checkout it
    # was cloned from.
    if origin=$(git -C "$here" remote get-url origin 2>/dev/null) && [ -d "$origin" ]; then
      candidates+=("$origin/../shared/citus")
    fi
  fi
  for c in "${candidates[@]}"; do
    if [ -f "$c/install.sh" ]; then
      echo "$(cd "$c" && pwd)/install.sh"
      return
    fi
  done
  if [ -n "${CITUS_SHARED:-}" ]; then
    die "Citus is not installed ($pglib/citus.so is missing) and CITUS_SHARED=$CITUS_SHARED holds no citus/install.sh"
  fi
  die "Citus is not installed ($pglib/citus.so is missing) and its installer was not found (looked for ${candidates[*]/%//install.sh}): set CITUS_SHARED to the shared folder that holds citus/install.sh"
}

install_citus() {
  [ -f "$pglib/citus.so" ] && return
  local inst
  inst=$(installer)
  [ "$(id -u)" = 0 ] || die "Citus is not installed ($pglib/citus.so is missing): run $inst as root, or this script as root"
  bash "$inst" >&2
  [ -f "$pglib/citus.so" ] || die "$inst did not install $pglib/citus.so"
}

# port_of prints the recorded port of node $1.
port_of() { awk -v n="$1" '$1 == n { print $2 }' "$state"; }

url() { echo "postgres://postgres@127.0.0.1:$(port_of coordinator)/test?sslmode=disable"; }

# running reports whether every node recorded in CITUS_DIR runs: its
# postmaster (the pid in its data directory) lives and its port answers.
running() {
  [ -f "$state" ] || return 1
  local n p pid
  for n in "${nodes[@]}"; do
    p=$(port_of "$n")
    [ -n "$p" ] || return 1
    pid=$(head -1 "$dir/$n/postmaster.pid" 2>/dev/null) || return 1
    kill -0 "$pid" 2>/dev/null || return 1
    "$pgbin/pg_isready" -q -h "$dir" -p "$p" || return 1
  done
}

# stop_nodes stops whatever still runs of the nodes recorded in CITUS_DIR:
# only servers whose data directory is in it.
stop_nodes() {
  local n
  for n in "${nodes[@]}"; do
    if [ -f "$dir/$n/postmaster.pid" ]; then
      as_pg "$pgbin/pg_ctl" -D "$dir/$n" -m fast -w -t 30 stop >/dev/null 2>&1 ||
        as_pg "$pgbin/pg_ctl" -D "$dir/$n" -m immediate -w stop >/dev/null 2>&1 || true
    fi
  done
}

# port_free reports whether nothing listens on 127.0.0.1:$1.
port_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# sql runs SQL on node $1's database $2 (through its unix socket).
sql() {
  local node=$1 db=$2
  shift 2
  as_pg "$pgbin/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$(port_of "$node")" -U postgres -d "$db" "$@"
}

# start_node starts node $1 on the first free port from $2 upward, and
# records the port; it prints the port it took.
start_node() {
  local n=$1 p=$2 tries=0
  while :; do
    while ! port_free "$p"; do p=$((p + 1)); done
    # A test cluster: nothing in it needs to survive a crash of the
    # machine, so fsync and friends are off for speed.
    # Appended: on a retry the later port = wins.
    cat >>"$dir/$n/postgresql.conf" <<EOF
shared_preload_libraries = 'citus'
listen_addresses = '127.0.0.1'
port = $p
unix_socket_directories = '$dir'
max_connections = 300
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
    if as_pg "$pgbin/pg_ctl" -D "$dir/$n" -l "$dir/$n.log" -w -t 30 start >/dev/null; then
      echo "$n $p" >>"$state"
      echo "$p"
      return
    fi
    # Someone took the port between the check and the start: next one.
    tries=$((tries + 1))
    [ "$tries" -lt 5 ] && grep -q 'could not bind\|could not create listen socket' "$dir/$n.log" 2>/dev/null ||
      die "$n did not start; its log ($dir/$n.log):$(echo; tail -20 "$dir/$n.log" 2>/dev/null)"
    p=$((p + 1))
  done
}

# elapsed prints the seconds since $1 (an EPOCHREALTIME), to 0.1 s.
elapsed() {
  local now=${EPOCHREALTIME/./} then=${1/./}
  local ds=$(((now - then) / 100000))
  echo "$((ds / 10)).$((ds % 10))"
}

case "${1:-start}" in
start)
  if running; then
    url
    exit 0
  fi
  if [ -e "$dir" ]; then
    # Ours (recorded) but not all up: stop what is left and start afresh.
    # Anything else there is not ours to remove.
    [ -f "$state" ] || die "$dir exists and was not made by this script: remove it or set CITUS_DIR"
    stop_nodes
    rm -rf "$dir"
  fi
  install_citus
  [ -x "$pgbin/initdb" ] || die "PostgreSQL 15 server binaries not found in $pgbin"
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || die "there is no postgres user to run the servers as"
  fi
  start_time=$EPOCHREALTIME
  mkdir -p "$dir"
  : >"$state"
  # A start that fails stops whatever of it runs; the directory stays, for
  # its logs, until the next start or stop.
  trap stop_nodes EXIT
  if [ "$(id -u)" = 0 ]; then chown postgres: "$dir" "$state"; fi
  as_pg test -w "$dir" || die "$dir is not writable by the user the servers run as"
  # initdb the three at once; --no-sync, as for fsync above.
  pids=()
  for n in "${nodes[@]}"; do
    as_pg "$pgbin/initdb" -D "$dir/$n" -A trust -U postgres -E UTF8 --locale=C.UTF-8 --no-sync >"$dir/$n.initdb.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || die "initdb of ${nodes[$i]} failed:$(echo; cat "$dir/${nodes[$i]}.initdb.log")"
  done
  p=$first_port
  for n in "${nodes[@]}"; do
    p=$(start_node "$n" "$p")
    p=$((p + 1))
  done
  # The database and the extension on the three at once, too.
  pids=()
  for n in "${nodes[@]}"; do
    { sql "$n" postgres -c 'CREATE DATABASE test' && sql "$n" test -c 'CREATE EXTENSION citus'; } >"$dir/$n.setup.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || die "CREATE DATABASE test or CREATE EXTENSION citus failed on ${nodes[$i]}:$(echo; cat "$dir/${nodes[$i]}.setup.log")"
  done
  sql coordinator test \
    -c "SELECT citus_set_coordinator_host('127.0.0.1', $(port_of coordinator))" \
    -c "SELECT citus_add_node('127.0.0.1', $(port_of worker1))" \
    -c "SELECT citus_add_node('127.0.0.1', $(port_of worker2))" >/dev/null
  workers=$(sql coordinator test -tA -c "SELECT count(*) FROM citus_get_active_worker_nodes()")
  [ "$workers" = 2 ] || die "the coordinator sees $workers active workers, not 2"
  version=$(sql coordinator test -tA -c "SELECT citus_version()" | cut -d, -f1)
  trap - EXIT
  echo "$version: coordinator 127.0.0.1:$(port_of coordinator), workers 127.0.0.1:$(port_of worker1) and 127.0.0.1:$(port_of worker2), in $dir, started in $(elapsed "$start_time") s" >&2
  url
  ;;
url)
  running || die "no cluster of this script runs in $dir (scripts/citus.sh start)"
  url
  ;;
stop)
  [ -e "$dir" ] || exit 0
  [ -f "$state" ] || die "$dir was not made by this script: left alone"
  stop_nodes
  rm -rf "$dir"
  ;;
*)
  echo "usage: $0 start|url|stop" >&2
  exit 2
  ;;
esac
