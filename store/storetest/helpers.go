package storetest

import (
	"crypto/sha256"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// The lease of NewClaim's claims and the TTL of Completion's completions.
const (
	Lease = time.Minute
	TTL   = time.Hour
)

// NewClaim returns a claim of (tenant, key) for a new owner and command,
// with lease Lease and the fingerprint of a POST /orders whose body is
// body: claims with the same body have the same fingerprint.
func NewClaim(tenant uuid.UUID, key, body string) idemproxy.Claim {
	return idemproxy.Claim{
		Tenant:      tenant,
		Key:         key,
		Fingerprint: sha256.Sum256([]byte("POST\n/orders\n\n" + body)),
		CommandID:   uuid.New(),
		CommandType: "POST /orders",
		Owner:       uuid.New(),
		Lease:       Lease,
	}
}

// Completion returns the completion of c by its owner with status and
// resp (nil: none, as in mode noop), replaying for TTL.
func Completion(c idemproxy.Claim, status int, resp *idemproxy.Response) idemproxy.Completion {
	return idemproxy.Completion{
		Tenant: c.Tenant, Key: c.Key, Owner: c.Owner, Status: status, Response: resp, TTL: TTL,
	}
}

// MustClaim claims c, failing the test on an error.
func MustClaim(t testing.TB, s idemproxy.Store, c idemproxy.Claim) idemproxy.ClaimResult {
	t.Helper()
	res, err := s.Claim(t.Context(), c)
	if err != nil {
		t.Fatalf("Claim(%q): %v", c.Key, err)
	}
	return res
}

// CheckLock asserts that e is the live lock c asked for, as Claim and
// Lookup return it.
func CheckLock(t testing.TB, e idemproxy.Entry, c idemproxy.Claim) {
	t.Helper()
	if e.Tenant != c.Tenant || e.Key != c.Key {
		t.Errorf("entry is (%s, %q), want (%s, %q)", e.Tenant, e.Key, c.Tenant, c.Key)
	}
	if e.State != idemproxy.StateInFlight {
		t.Errorf("state = %s, want in_flight", e.State)
	}
	if e.CommandID != c.CommandID || e.CommandType != c.CommandType {
		t.Errorf("command = %s %q, want %s %q", e.CommandID, e.CommandType, c.CommandID, c.CommandType)
	}
	if e.Fingerprint != c.Fingerprint {
		t.Error("fingerprint differs from the claim's")
	}
	if e.CreatedAt.IsZero() {
		t.Error("created_at is zero")
	}
	if got := e.ExpiresAt.Sub(e.CreatedAt); got != c.Lease {
		t.Errorf("expires_at - created_at = %s, want the lease %s", got, c.Lease)
	}
	if e.Remaining <= 0 || e.Remaining > c.Lease {
		t.Errorf("remaining = %s, want in (0, %s]", e.Remaining, c.Lease)
	}
	if e.Status != 0 || e.Response != nil {
		t.Errorf("a lock has status %d and response %v, want none", e.Status, e.Response)
	}
}

// CheckRecord asserts that e is the live record of c completed, by
// Completion, with status and resp.
func CheckRecord(t testing.TB, e idemproxy.Entry, c idemproxy.Claim, status int, resp *idemproxy.Response) {
	t.Helper()
	if e.State != idemproxy.StateSucceeded {
		t.Fatalf("state = %s, want succeeded", e.State)
	}
	if e.Tenant != c.Tenant || e.Key != c.Key || e.CommandID != c.CommandID || e.CommandType != c.CommandType {
		t.Errorf("record is (%s, %q, %s, %q), want (%s, %q, %s, %q)",
			e.Tenant, e.Key, e.CommandID, e.CommandType, c.Tenant, c.Key, c.CommandID, c.CommandType)
	}
	if e.Fingerprint != c.Fingerprint {
		t.Error("fingerprint differs from the claim's")
	}
	if e.Status != status {
		t.Errorf("status = %d, want %d", e.Status, status)
	}
	if got := e.ExpiresAt.Sub(e.CreatedAt); got != TTL {
		t.Errorf("expires_at - created_at = %s, want the TTL %s", got, TTL)
	}
	if e.Remaining <= Lease || e.Remaining > TTL {
		t.Errorf("remaining = %s, want in (%s, %s]", e.Remaining, Lease, TTL)
	}
	if !reflect.DeepEqual(e.Response, resp) {
		t.Errorf("response = %+v, want %+v", e.Response, resp)
	}
}
