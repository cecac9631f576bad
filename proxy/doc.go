// Package proxy is idemproxy's sidecar: the idempotency step (package
// idempotency) mounted in front of a reverse proxy to a legacy upstream
// that knows nothing about idempotency.
//
// New builds the chain of chi middleware — request id, access log, panic
// recovery, tenancy, idempotency — in front of an httputil.ReverseProxy.
// Proxy.Drain and Close end it. Its route policies are a YAML file
// (LoadRoutes, ParseRoutes; Proxy.SetRoutes and ReloadRoutes replace
// them; RoutesInForce shows them). NewAdmin serves the admin listener
// (health, readiness, Prometheus metrics, the key API whose JSON is
// KeyList and KeyView, the on-call page); NewMetrics makes the Prometheus
// collectors the step's measurements go to. LoadCertificates reads the
// listener's TLS files, reloadable, and WriteTimeoutListener bounds a
// write to a client that stopped reading.
package proxy
