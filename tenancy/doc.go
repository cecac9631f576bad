// Package tenancy resolves the tenant of a request — a UUID naming the
// customer it belongs to — and puts it in the request's context
// (FromContext). The sources, tried in the configured order: a header
// (asserted by a trusted gateway), a claim of a verified JWT (HS256 with a
// shared secret, RS256 or ES256 with a JWKS URL or a PEM public key), a
// static tenant (a single-tenant service, or the fallback), a segment of
// the path or a label of the host by a pattern (asserted), and the client
// certificate a TLS listener verified (its URI SAN, a SPIFFE id, or its
// subject CN). A verified token always decides: a tenant header that
// disagrees with it is refused.
//
// Tenants are UUIDs (FormatUUID); FormatAny admits the strings a legacy
// service has ("acme", "42"), each mapped to its UUIDv5 under Namespace,
// so that no raw tenant string reaches a store.
//
// Resolver.Middleware applies it as middleware, answering a bad token 401
// and a malformed or conflicting tenant 400, as problem+json.
package tenancy
