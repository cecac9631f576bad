package tenancy

import (
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
)

// Format says which tenant strings a Resolver admits.
type Format string

// The tenant formats.
const (
	// FormatUUID admits UUIDs only (in the 36-character form, any letter
	// case): the tenant is that UUID.
	FormatUUID Format = "uuid"
	// FormatAny admits any string of 1 to MaxTenantLen printable ASCII
	// characters: a UUID keeps its value, any other string is mapped to
	// its UUIDv5 under Namespace (MapTenant).
	FormatAny Format = "any"
)

// Formats lists every format, the default first.
var Formats = []Format{FormatUUID, FormatAny}

// Namespace is the UUIDv5 namespace under which FormatAny maps a tenant
// string to its UUID: itself the UUIDv5 of the URL
// "https://idemproxy.dev/tenants" under the RFC 9562 URL namespace. It
// never changes: a change would move every such tenant to a new key space.
const Namespace = "ee84d13b-79df-5600-9850-d06bf53d3756"

var namespace = uuid.MustParse(Namespace)

// MaxTenantLen is the longest tenant string, in bytes.
const MaxTenantLen = 255

// ErrNotUUID is the error of a tenant string that is not a UUID under
// FormatUUID: another format admits it.
var ErrNotUUID = errors.New("not a UUID (want the 36-character form, e.g. 0b9f6a3e-4d1c-4c7e-9f2a-5e8b7d6c1a20)")

// MapTenant is the UUID that FormatAny gives the tenant string s: s
// itself when it is a UUID in its 36-character form (any letter case),
// otherwise the UUIDv5 of s under Namespace. It does not check s; Parse
// does.
func MapTenant(s string) uuid.UUID {
	if u, ok := parseUUID(s); ok {
		return u
	}
	return uuid.NewSHA1(namespace, []byte(s))
}

// parseUUID reads a UUID in its 36-character form, in any letter case.
func parseUUID(s string) (uuid.UUID, bool) {
	if len(s) != 36 {
		return uuid.Nil, false
	}
	u, err := uuid.Parse(s)
	return u, err == nil
}

// Parse reads the tenant string s under format f (the zero Format is
// FormatUUID): 1 to MaxTenantLen printable ASCII characters (0x20-0x7E),
// a UUID under FormatUUID (ErrNotUUID otherwise).
func (f Format) Parse(s string) (uuid.UUID, error) {
	if err := checkTenant(s); err != nil {
		return uuid.Nil, err
	}
	if f == FormatAny {
		return MapTenant(s), nil
	}
	if u, ok := parseUUID(s); ok {
		return u, nil
	}
	return uuid.Nil, ErrNotUUID
}

// ParseValues reads a tenant given several times (repeated headers or
// query parameters): the values must all name the same tenant. No values
// is an error, as an empty tenant is.
func (f Format) ParseValues(values []string) (uuid.UUID, error) {
	if len(values) == 0 {
		return f.Parse("")
	}
	tenant, err := f.Parse(values[0])
	if err != nil {
		return uuid.Nil, err
	}
	for _, v := range values[1:] {
		if t, err := f.Parse(v); err != nil || t != tenant {
			return uuid.Nil, errors.New("repeated with different values")
		}
	}
	return tenant, nil
}

// checkTenant applies the syntax every tenant string has, whatever the
// format.
func checkTenant(s string) error {
	switch {
	case s == "":
		return errors.New("empty, want a tenant")
	case len(s) > MaxTenantLen:
		return fmt.Errorf("%d bytes long, the limit is %d", len(s), MaxTenantLen)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("has a byte 0x%02x at position %d: a tenant is printable ASCII (0x20-0x7E)", c, i)
		}
	}
	return nil
}

// InvalidTenant is the 400 invalid-tenant problem for a tenant read from
// where (e.g. "header X-Tenant-ID") that err refused. When err is
// ErrNotUUID the detail names the format setting that admits other
// strings, spelled by setting (nil spells the Go name,
// tenancy.Config.Format).
func InvalidTenant(where string, err error, setting func(goName string) string) *idemproxy.Problem {
	detail := where + ": " + err.Error()
	if errors.Is(err, ErrNotUUID) {
		name := "tenancy.Config.Format"
		if setting != nil {
			name = setting(name)
		}
		detail += fmt.Sprintf("; tenant strings other than UUIDs are admitted with %s set to %s", name, FormatAny)
	}
	return idemproxy.NewProblem(idemproxy.ProblemInvalidTenant, detail)
}
