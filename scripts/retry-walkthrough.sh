#!/usr/bin/env bash
# Retry walkthrough: a client retries a slow keyed POST with plain
#   curl --retry 3
# and the demo orders service still creates exactly one order, and curl's
# retry ends in success.
#
# What happens (the demo order is made slow with ?delay=4s):
#   t=0s  attempt 1 is forwarded; curl gives up after --max-time 2.
#         idemproxy does not cancel the command: it keeps the lock.
#   t=3s  attempt 2 (after --retry-delay 1): the command is still running,
#         so idemproxy holds the retry until it ends, without calling the
#         upstream.
#   t=4s  the order is created; idemproxy records the 201, and answers the
#         waiting retry with it (Idempotent-Replayed: true).
# Finally GET /stats must show {"orders_created":1}.
#
# The demo is single-tenant (IDEMPROXY_TENANT_SOURCE=header,static), so the
# request needs no tenant header.
#
# Run from anywhere: bash scripts/retry-walkthrough.sh
# Needs go, curl, and python3 (only to pick free ports; a fallback exists).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Only the settings below apply: ignore any IDEMPROXY_* from the caller.
while read -r v; do unset "$v"; done < <(compgen -e | grep '^IDEMPROXY_' || true)

key=walkthrough-1
tmp=$(mktemp -d)
pid=""

cleanup() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step() { printf '\n==> %s\n' "$*"; }
fail() {
	printf '\nFAIL: %s\n' "$*" >&2
	if [ -s "$tmp/idemproxy.log" ]; then
		printf -- '--- idemproxy log ---\n' >&2
		cat "$tmp/idemproxy.log" >&2
	fi
	exit 1
}

free_port() {
	if command -v python3 >/dev/null 2>&1; then
		python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
		return
	fi
	local p
	for _ in $(seq 1 50); do
		p=$((20000 + RANDOM % 40000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
	return 1
}

command -v curl >/dev/null 2>&1 || fail "curl is required"

step "Building idemproxy"
go build -o "$tmp/idemproxy" ./cmd/idemproxy
echo "built $tmp/idemproxy"

port=$(free_port)
admin=$(free_port)
while [ "$admin" = "$port" ]; do admin=$(free_port); done

step "Starting 'idemproxy demo' (proxy 127.0.0.1:$port, admin 127.0.0.1:$admin, memory store, bundled orders service, one tenant)"
IDEMPROXY_LISTEN_ADDR=127.0.0.1:$port \
	IDEMPROXY_ADMIN_ADDR=127.0.0.1:$admin \
	IDEMPROXY_UPSTREAM_TIMEOUT=10s \
	IDEMPROXY_UPSTREAM_URL= \
	"$tmp/idemproxy" demo >"$tmp/idemproxy.log" 2>&1 &
pid=$!

step "Waiting for http://127.0.0.1:$admin/readyz"
ready=""
for _ in $(seq 1 100); do
	if curl -fsS -o /dev/null "http://127.0.0.1:$admin/readyz" 2>/dev/null; then
		ready=1
		break
	fi
	kill -0 "$pid" 2>/dev/null || fail "idemproxy exited during start-up"
	sleep 0.1
done
[ -n "$ready" ] || fail "idemproxy was not ready after 10s"
echo "ready"

step "Sending one keyed POST that takes 4s upstream, with a 2s client timeout and up to 3 retries"
cat <<EOF
curl --fail-with-body --retry 3 --retry-delay 1 --max-time 2 \\
  -X POST "http://127.0.0.1:$port/orders?delay=4s" \\
  -H 'Idempotency-Key: $key' -d '{"item":"book"}'
EOF
echo "(curl reports each failed attempt and retry; every response's headers follow)"
echo
set +e
curl --no-progress-meter --fail-with-body --retry 3 --retry-delay 1 --max-time 2 \
	-X POST "http://127.0.0.1:$port/orders?delay=4s" \
	-H "Idempotency-Key: $key" -d '{"item":"book"}' \
	-D "$tmp/headers" -o "$tmp/body" 2>&1 | sed 's/^/    /'
rc=${PIPESTATUS[0]}
set -e
echo
echo "curl exit code: $rc"
echo "response headers of every answered attempt (the timed-out first one has none):"
tr -d '\r' <"$tmp/headers" | sed 's/^/    /'
echo "final body: $(cat "$tmp/body")(empty in noop mode: the replay carries the original status only)"
[ "$rc" -eq 0 ] || fail "curl did not succeed within its retries (exit $rc)"
# The last header block is the final answer.
tr -d '\r' <"$tmp/headers" | awk '/^HTTP\//{block=""} {block=block $0 "\n"} END{printf "%s", block}' >"$tmp/last"
status=$(head -n 1 "$tmp/last" | awk '{print $2}')
[ "$status" = "201" ] || fail "final status is $status, want 201"
grep -qi '^Idempotent-Replayed: *true' "$tmp/last" ||
	fail "the final answer is not a replay (no Idempotent-Replayed: true)"
echo "the final answer is the replayed 201 of the first attempt's command"

step "What idemproxy counted (admin /metrics, idemproxy_requests_total by outcome)"
curl -fsS "http://127.0.0.1:$admin/metrics" | grep '^idemproxy_requests_total' | grep -v ' 0$' | sed 's/^/    /' || true

step "Asking the orders service, through the proxy, how many orders it created"
stats=$(curl -fsS "http://127.0.0.1:$port/stats")
echo "    GET /stats -> $stats"
compact=$(printf '%s' "$stats" | tr -d ' \n\t')
[ "$compact" = '{"orders_created":1}' ] || fail "want {\"orders_created\":1}, got $stats"

attempts=$(grep -c '^HTTP/' "$tmp/headers" || true)
step "PASS: $((attempts + 1)) attempts (the first timed out), one order: the upstream executed the command once"
