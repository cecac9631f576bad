// Package tenancy resolves the tenant of a request — a UUID naming the
// customer it belongs to — from a header (asserted by a trusted gateway)
// or from a claim of a verified JWT (HS256 with a shared secret, RS256 or
// ES256 with a JWKS URL or a PEM public key), and puts it in the request's
// context (FromContext). A verified token always decides: a tenant header
// that disagrees with it is refused. Resolver.Middleware applies it as
// middleware, answering a bad token 401 and a malformed or conflicting
// tenant 400, as problem+json.
package tenancy
