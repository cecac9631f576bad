// Package proxy is idemproxy's sidecar: the idempotency step (package
// idempotency) mounted in front of a reverse proxy to a legacy upstream
// that knows nothing about idempotency.
//
// New builds the chain of chi middleware — request id, access log, panic
// recovery, tenancy, idempotency — in front of an httputil.ReverseProxy.
// NewAdmin serves the admin listener (health, readiness, Prometheus
// metrics, the key API). NewMetrics makes the Prometheus collectors the
// step's measurements go to, and Variable spells a library's Go setting as
// the environment variable that sets it in the sidecar, for the messages
// the sidecar shows.
package proxy
