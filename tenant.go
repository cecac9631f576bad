package idemproxy

import (
	"context"

	"github.com/google/uuid"
)

// The tenant of a request travels in its context: the tenancy middleware
// (package tenancy) puts it there, and the idempotency step reads it, so
// that neither imports the other.

type tenantKey struct{}

// WithTenant returns ctx carrying tenant, the tenant resolved for a
// request.
func WithTenant(ctx context.Context, tenant uuid.UUID) context.Context {
	return context.WithValue(ctx, tenantKey{}, tenant)
}

// TenantFrom returns the tenant ctx carries, if any.
func TenantFrom(ctx context.Context) (uuid.UUID, bool) {
	t, ok := ctx.Value(tenantKey{}).(uuid.UUID)
	return t, ok
}

type commandPathKey struct{}

// commandPath is how a command type names one request path.
type commandPath struct{ path, command string }

// WithCommandPath returns ctx carrying command, the name a command type
// gives the request's path: the path source of package tenancy writes the
// tenant's segment {tenant} (/accounts/{tenant}/charges), so that one
// endpoint is one command type across tenants and the tenant's string is
// not stored with the command. path is the request's path as
// internal/urlpath normalises it.
func WithCommandPath(ctx context.Context, path, command string) context.Context {
	return context.WithValue(ctx, commandPathKey{}, commandPath{path, command})
}

// CommandPath returns path, a request's normalised path, as its command
// type names it (WithCommandPath), or path itself.
func CommandPath(ctx context.Context, path string) string {
	if c, ok := ctx.Value(commandPathKey{}).(commandPath); ok && c.path == path {
		return c.command
	}
	return path
}
