package tenancy

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"
	"golang.org/x/time/rate"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/configerr"
	"github.com/idemproxy/idemproxy/internal/problem"
	"github.com/idemproxy/idemproxy/internal/urlpath"
)

// Source is where a tenant may come from.
type Source string

// The tenant sources (docs/tenancy.md says which are authenticated).
const (
	// SourceHeader: a header (Config.Header), asserted by whoever sends
	// it.
	SourceHeader Source = "header"
	// SourceJWT: a claim (Config.Claim) of a verified bearer token.
	SourceJWT Source = "jwt"
	// SourceStatic: Config.Static, one tenant for every request; only
	// last in a list, as the fallback.
	SourceStatic Source = "static"
	// SourcePath: a segment of the path, by the chi pattern
	// Config.PathPattern; asserted.
	SourcePath Source = "path"
	// SourceHost: a label of the Host header, by Config.HostPattern;
	// asserted.
	SourceHost Source = "host"
	// SourceCert: the client certificate a TLS listener verified: its
	// first URI SAN (a SPIFFE id), or else its subject CN.
	SourceCert Source = "cert"
)

// Sources lists every source, in the order the documentation gives them.
var Sources = []Source{SourceHeader, SourceJWT, SourceStatic, SourcePath, SourceHost, SourceCert}

// ParseSources reads a comma-separated list of sources, in any letter
// case, as Config.Sources takes it; Validate checks the list as a whole.
func ParseSources(list string) ([]Source, error) {
	var out []Source
	for s := range strings.SplitSeq(list, ",") {
		src := Source(strings.ToLower(strings.TrimSpace(s)))
		if !slices.Contains(Sources, src) {
			return nil, fmt.Errorf("must list %s, got %q", sourceNames(), src)
		}
		out = append(out, src)
	}
	return out, nil
}

// sourceNames lists the sources as a sentence does: "a, b or c".
func sourceNames() string {
	names := make([]string, len(Sources))
	for i, s := range Sources {
		names[i] = string(s)
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// Config configures New. Sources is required; everything else has a
// documented zero value.
type Config struct {
	// Sources are tried in order; the first that yields a tenant wins,
	// except that a verified bearer token always decides: a tenant header
	// that disagrees with it is refused, whatever the order. SourceStatic
	// may only stand last.
	Sources []Source
	// Format says which tenant strings are admitted; empty means
	// FormatUUID.
	Format Format
	// Static is the tenant of SourceStatic, which needs it; it must fit
	// Format.
	Static string
	// PathPattern is the chi pattern of SourcePath, which needs it: the
	// path segment at {tenant} is the tenant (/accounts/{tenant}/*).
	PathPattern string
	// HostPattern is the pattern of SourceHost, which needs it: the part
	// of the Host header at {tenant} is the tenant
	// ({tenant}.api.example.com; the port is ignored, case folded).
	HostPattern string
	// Header is the tenant header; empty means X-Tenant-ID.
	Header string
	// Claim is the JWT claim holding the tenant; empty means tenant_id.
	Claim string
	// HS256Secret enables HS256 tokens when non-empty.
	HS256Secret []byte
	// JWKSURL enables RS256 and ES256 tokens verified with the keys served
	// there (fetched at start, refreshed every JWKSRefresh and, at most
	// every ten seconds, when a token names an unknown kid).
	JWKSURL string
	// JWKSRefresh is the JWKS refresh interval; zero means one hour.
	JWKSRefresh time.Duration
	// PublicKey enables RS256 (RSA key) or ES256 (P-256 key) tokens.
	PublicKey crypto.PublicKey
	// Issuer and Audience, when non-empty, must match iss and aud.
	Issuer   string
	Audience string
	// Client fetches the JWKS; nil means a client with a 10s timeout.
	Client *http.Client
	// Logger receives the reasons tokens are refused; nil discards them.
	Logger *slog.Logger
	// Setting spells a setting's name in the details of the problems the
	// resolver answers, given its Go name (tenancy.Config.Format), as
	// idempotency.Config.Setting does. Nil spells the Go name.
	Setting func(goName string) string
}

// Resolver finds the tenant of a request. It is safe for concurrent use.
type Resolver struct {
	sources []Source
	header  string
	format  Format
	static  uuid.UUID
	path    *pathPattern
	host    *hostPattern
	// useJWT: jwt is one of the sources, so a bearer token is verified.
	useJWT bool
	// jwt verifies bearer tokens; nil when no key is configured. Derived
	// resolvers share it.
	jwt     *verifier
	cfg     Config
	setting func(goName string) string
}

// verifier checks bearer tokens and reads their tenant claim.
type verifier struct {
	claim     string
	issuer    string
	audience  string
	secret    []byte
	publicKey crypto.PublicKey
	jwks      keyfunc.Keyfunc
	parser    *jwt.Parser
	log       *slog.Logger
}

// New validates cfg and returns a Resolver. When cfg names a JWKS URL, the
// key set is refreshed in the background until ctx ends. Bearer tokens
// are verified when jwt is a source; a key configured without it serves
// the resolvers Derive makes.
func New(ctx context.Context, cfg Config) (*Resolver, error) {
	if cfg.Header == "" {
		cfg.Header = "X-Tenant-ID"
	}
	cfg.Header = http.CanonicalHeaderKey(cfg.Header)
	if cfg.Claim == "" {
		cfg.Claim = "tenant_id"
	}
	if cfg.Format == "" {
		cfg.Format = FormatUUID
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Setting == nil {
		cfg.Setting = func(goName string) string { return goName }
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Resolver{header: cfg.Header, format: cfg.Format, cfg: cfg, setting: cfg.Setting}
	if cfg.Static != "" {
		r.static, _ = cfg.Format.Parse(cfg.Static) // Validate checked it
	}
	if cfg.PathPattern != "" {
		r.path, _ = newPathPattern(cfg.PathPattern)
	}
	if cfg.HostPattern != "" {
		r.host, _ = newHostPattern(cfg.HostPattern)
	}
	r.sources = slices.Clone(cfg.Sources)
	r.useJWT = slices.Contains(r.sources, SourceJWT)
	if len(cfg.HS256Secret) == 0 && cfg.PublicKey == nil && cfg.JWKSURL == "" {
		return r, nil
	}
	v, err := newVerifier(ctx, cfg)
	if err != nil {
		return nil, err
	}
	r.jwt = v
	return r, nil
}

// newVerifier builds the token verification of cfg, which has a key.
func newVerifier(ctx context.Context, cfg Config) (*verifier, error) {
	v := &verifier{
		claim:     cfg.Claim,
		secret:    cfg.HS256Secret,
		publicKey: cfg.PublicKey,
		issuer:    cfg.Issuer,
		audience:  cfg.Audience,
		log:       cfg.Logger,
	}
	var methods []string
	if len(cfg.HS256Secret) > 0 {
		methods = append(methods, jwt.SigningMethodHS256.Alg())
	}
	switch cfg.PublicKey.(type) {
	case *rsa.PublicKey:
		methods = append(methods, jwt.SigningMethodRS256.Alg())
	case *ecdsa.PublicKey:
		methods = append(methods, jwt.SigningMethodES256.Alg())
	}
	if cfg.JWKSURL != "" {
		client := cfg.Client
		if client == nil {
			client = &http.Client{Timeout: 10 * time.Second}
		}
		refresh := cfg.JWKSRefresh
		if refresh <= 0 {
			refresh = time.Hour
		}
		log := v.log
		kf, err := keyfunc.NewDefaultOverrideCtx(ctx, []string{cfg.JWKSURL}, keyfunc.Override{
			Client:            client,
			RefreshInterval:   refresh,
			RefreshUnknownKID: rate.NewLimiter(rate.Every(10*time.Second), 1),
			// A token naming an unknown kid never waits for the refresh
			// limiter (its default wait is a minute): anyone can send
			// such tokens, so waiting would let them hold requests.
			RateLimitWaitMax: time.Millisecond,

			RefreshErrorHandlerFunc: func(u string) func(context.Context, error) {
				return func(ctx context.Context, err error) {
					log.ErrorContext(ctx, "jwks refresh failed", "url", u, "error", err)
				}
			},
		})
		if err != nil {
			return nil, fmt.Errorf("tenancy: jwks: %w", err)
		}
		v.jwks = kf
		methods = append(methods, jwt.SigningMethodRS256.Alg(), jwt.SigningMethodES256.Alg())
	}
	opts := []jwt.ParserOption{jwt.WithValidMethods(methods), jwt.WithExpirationRequired()}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	v.parser = jwt.NewParser(opts...)
	return v, nil
}

// Derive returns a resolver that tries sources instead of r's, with r's
// other settings (header, format, static tenant, patterns, token
// verification, which it shares). The list is validated as New does.
func (r *Resolver) Derive(sources []Source) (*Resolver, error) {
	cfg := r.cfg
	cfg.Sources = sources
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := *r
	d.cfg = cfg
	d.sources = slices.Clone(sources)
	d.useJWT = slices.Contains(sources, SourceJWT)
	return &d, nil
}

// Sources returns the sources r tries, in order.
func (r *Resolver) Sources() []Source { return slices.Clone(r.sources) }

// minSecret is the shortest HS256 secret accepted: 256 bits, as RFC 7518
// §3.2 asks of a key for HS256.
const minSecret = 32

// Validate reports every setting of c that New refuses, as
// *idemproxy.ConfigError values joined in one error.
func (c Config) Validate() error {
	errs := configerr.Errors{Struct: "tenancy.Config"}
	for _, reason := range sourceListErrors(c.Sources) {
		errs.Add("Sources", "%s", reason)
	}
	seen := map[Source]bool{}
	for _, s := range c.Sources {
		seen[s] = true
	}
	format := c.Format
	if format == "" {
		format = FormatUUID
	}
	if !slices.Contains(Formats, format) {
		errs.Add("Format", "must be uuid or any, got %q", c.Format)
	}
	switch {
	case seen[SourceStatic] && c.Static == "":
		errs.Add("Static", "is required when {Sources} lists static: it is the tenant of every request no other source names")
	case c.Static != "" && slices.Contains(Formats, format):
		if _, err := format.Parse(c.Static); errors.Is(err, ErrNotUUID) {
			errs.Add("Static", "must be a UUID while {Format} is uuid (set {Format} to any for another string), got %q", c.Static)
		} else if err != nil {
			errs.Add("Static", "is not a tenant: %v", err)
		}
	}
	if seen[SourcePath] && c.PathPattern == "" {
		errs.Add("PathPattern", "is required when {Sources} lists path: a chi pattern naming the tenant's segment, e.g. /accounts/{tenant}/*")
	} else if c.PathPattern != "" {
		if _, err := newPathPattern(c.PathPattern); err != nil {
			errs.Add("PathPattern", "%v", err)
		}
	}
	if seen[SourceHost] && c.HostPattern == "" {
		errs.Add("HostPattern", "is required when {Sources} lists host: a pattern naming the tenant's label, e.g. {tenant}.api.example.com")
	} else if c.HostPattern != "" {
		if _, err := newHostPattern(c.HostPattern); err != nil {
			errs.Add("HostPattern", "%v", err)
		}
	}
	if c.Header != "" && !validHeaderName(c.Header) {
		errs.Add("Header", "must be a header name, got %q", c.Header)
	}
	if len(c.HS256Secret) > 0 && len(c.HS256Secret) < minSecret {
		errs.Add("HS256Secret", "must be at least %d bytes long (it is %d)", minSecret, len(c.HS256Secret))
	}
	switch k := c.PublicKey.(type) {
	case nil, *rsa.PublicKey, *ecdsa.PublicKey:
	default:
		errs.Add("PublicKey", "must be an RSA or ECDSA P-256 key, got %T", k)
	}
	if c.JWKSURL != "" {
		if u, err := url.Parse(c.JWKSURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs.Add("JWKSURL", "must be an absolute http or https URL")
		}
		if c.PublicKey != nil {
			errs.Add("JWKSURL", "and {PublicKey} are exclusive: set one")
		}
	}
	if seen[SourceJWT] && len(c.HS256Secret) == 0 && c.JWKSURL == "" && c.PublicKey == nil {
		errs.Add("Sources", "includes jwt, so set {HS256Secret}, {JWKSURL} or {PublicKey}")
	}
	if c.JWKSRefresh < 0 {
		errs.Add("JWKSRefresh", "must be a positive duration, got %s", c.JWKSRefresh)
	}
	return errs.Err()
}

// CheckSources reports what is wrong with a list of sources as a list,
// whatever the other settings: a source that does not exist, one given
// twice, static anywhere but last, an empty list. Config.Validate checks
// the same and the settings the sources need.
func CheckSources(srcs []Source) error {
	var errs []error
	for _, reason := range sourceListErrors(srcs) {
		errs = append(errs, errors.New(reason))
	}
	return errors.Join(errs...)
}

func sourceListErrors(srcs []Source) []string {
	var reasons []string
	seen := map[Source]bool{}
	for i, s := range srcs {
		switch {
		case !slices.Contains(Sources, s):
			reasons = append(reasons, fmt.Sprintf("must list %s, got %q", sourceNames(), s))
		case seen[s]:
			reasons = append(reasons, fmt.Sprintf("lists %q twice", s))
		case s == SourceStatic && i != len(srcs)-1:
			reasons = append(reasons, "may list static only last, as the fallback when no other source names a tenant")
		}
		seen[s] = true
	}
	if len(srcs) == 0 {
		reasons = append(reasons, "must list at least one of "+sourceNames())
	}
	return reasons
}

// validHeaderName reports whether s is an HTTP field name (an RFC 9110 token).
func validHeaderName(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return s != ""
}

// ParsePublicKey reads a PEM public key (PKIX, PKCS#1 RSA or a certificate)
// for RS256 or ES256 verification.
func ParsePublicKey(pemBytes []byte) (crypto.PublicKey, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		return nil, errors.New("no PEM block found")
	}
	var key any
	var err error
	switch block.Type {
	case "PUBLIC KEY":
		key, err = x509.ParsePKIXPublicKey(block.Bytes)
	case "RSA PUBLIC KEY":
		key, err = x509.ParsePKCS1PublicKey(block.Bytes)
	case "CERTIFICATE":
		var cert *x509.Certificate
		cert, err = x509.ParseCertificate(block.Bytes)
		if err == nil {
			key = cert.PublicKey
		}
	default:
		return nil, fmt.Errorf("unsupported PEM block %q (want PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE)", block.Type)
	}
	if err != nil {
		return nil, err
	}
	switch k := key.(type) {
	case *rsa.PublicKey:
		return k, nil
	case *ecdsa.PublicKey:
		if k.Curve.Params().Name != "P-256" {
			return nil, fmt.Errorf("ES256 needs a P-256 key, got %s", k.Curve.Params().Name)
		}
		return k, nil
	default:
		return nil, fmt.Errorf("unsupported public key type %T (want RSA or ECDSA P-256)", key)
	}
}

// NewContext returns ctx carrying tenant (idemproxy.WithTenant), where
// the idempotency step reads it.
func NewContext(ctx context.Context, tenant uuid.UUID) context.Context {
	return idemproxy.WithTenant(ctx, tenant)
}

// FromContext returns the tenant resolved for the request, if any.
func FromContext(ctx context.Context) (uuid.UUID, bool) {
	return idemproxy.TenantFrom(ctx)
}

// MiddlewareOptions configures Resolver.Middleware. The zero value
// resolves every request and answers a refused one with its problem.
type MiddlewareOptions struct {
	// Applies reports whether a request is resolved; nil means every
	// request. Requests for which it is false pass untouched: no token is
	// checked for them.
	Applies func(*http.Request) bool
	// ErrorHandler answers a refused request: a bad token (401), a
	// malformed tenant (400) or a tenant header that conflicts with the
	// token (400). Nil writes p as problem+json (as idempotency.WriteProblem
	// does).
	ErrorHandler func(w http.ResponseWriter, r *http.Request, p *idemproxy.Problem)
}

// Middleware resolves the tenant of every request opts.Applies to and
// stores it with NewContext (Apply). A request without a tenant passes on
// without one (the idempotency step decides whether it needs one); a
// refused request is answered by opts.ErrorHandler and goes no further.
func (r *Resolver) Middleware(opts MiddlewareOptions) func(http.Handler) http.Handler {
	refuse := opts.ErrorHandler
	if refuse == nil {
		refuse = func(w http.ResponseWriter, _ *http.Request, p *idemproxy.Problem) { problem.Write(w, p) }
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if opts.Applies != nil && !opts.Applies(req) {
				next.ServeHTTP(w, req)
				return
			}
			out, p := r.Apply(req)
			if p != nil {
				refuse(w, req, p)
				return
			}
			next.ServeHTTP(w, out)
		})
	}
}

// Apply resolves the request's tenant (Resolve) and returns the request
// carrying it in its context (FromContext), or req itself when no source
// named one; with a problem, the request must be refused. A tenant taken
// from the path also gives the request's CommandPath.
func (r *Resolver) Apply(req *http.Request) (*http.Request, *idemproxy.Problem) {
	res, p := r.resolve(req)
	if p != nil || !res.found {
		return req, p
	}
	ctx := NewContext(req.Context(), res.tenant)
	if res.commandPath != nil {
		ctx = idemproxy.WithCommandPath(ctx, res.commandPath.path, res.commandPath.command)
	}
	return req.WithContext(ctx), nil
}

// Resolve returns the request's tenant, whether one was found, and the
// problem to answer with when the request must be refused.
//
// The sources are tried in order, the first that names a tenant wins. A
// header-sourced tenant is asserted by the client, not authenticated, so
// a verified bearer token decides whatever the source order: the other
// sources are used only when no token was sent, and a tenant header that
// names another tenant than the token (or stands beside a token without
// the tenant claim) is a tenant-conflict.
func (r *Resolver) Resolve(req *http.Request) (uuid.UUID, bool, *idemproxy.Problem) {
	res, p := r.resolve(req)
	return res.tenant, res.found, p
}

// resolution is what resolve found.
type resolution struct {
	tenant uuid.UUID
	found  bool
	// commandPath is set when the tenant came from the path.
	commandPath *commandPathOf
}

func (r *Resolver) resolve(req *http.Request) (resolution, *idemproxy.Problem) {
	if r.useJWT {
		claim, verified, present, p := r.jwt.verify(req)
		if p != nil {
			return resolution{}, p
		}
		if verified {
			t, found, p := r.fromToken(req, claim, present)
			return resolution{tenant: t, found: found}, p
		}
	}
	for _, s := range r.sources {
		switch s {
		case SourceHeader:
			values := req.Header.Values(r.header)
			if len(values) == 0 {
				continue
			}
			t, err := r.format.ParseValues(values)
			if err != nil {
				return resolution{}, r.invalid("header "+r.header, err)
			}
			return resolution{tenant: t, found: true}, nil
		case SourceStatic:
			return resolution{tenant: r.static, found: true}, nil
		case SourcePath:
			escaped := urlpath.Normal(req.URL)
			raw, ok := r.path.match(escaped)
			if !ok {
				continue
			}
			where := "path segment {tenant} of " + r.path.pattern
			s, err := url.PathUnescape(raw)
			if err != nil {
				return resolution{}, idemproxy.NewProblem(idemproxy.ProblemInvalidTenant, where+": not valid percent-encoding")
			}
			t, err := r.format.Parse(s)
			if err != nil {
				return resolution{}, r.invalid(where, err)
			}
			return resolution{tenant: t, found: true,
				commandPath: &commandPathOf{path: escaped, command: r.path.commandPath(escaped, raw)}}, nil
		case SourceHost:
			s, ok := r.host.match(req.Host)
			if !ok {
				continue
			}
			t, err := r.format.Parse(s)
			if err != nil {
				return resolution{}, r.invalid("the Host label {tenant} of "+r.cfg.HostPattern, err)
			}
			return resolution{tenant: t, found: true}, nil
		case SourceCert:
			s, ok := certTenant(req)
			if !ok {
				continue
			}
			t, err := r.format.Parse(s)
			if err != nil {
				return resolution{}, r.invalid("the client certificate's URI SAN or subject CN", err)
			}
			return resolution{tenant: t, found: true}, nil
		}
	}
	return resolution{}, nil
}

// invalid is the 400 for a tenant read from where that err refused,
// naming the format setting when another format would admit it.
func (r *Resolver) invalid(where string, err error) *idemproxy.Problem {
	return InvalidTenant(where, err, r.setting)
}

// fromToken resolves the tenant of a request whose bearer token verified:
// the token's claim, which a tenant header may repeat but never contradict.
func (r *Resolver) fromToken(req *http.Request, claim string, present bool) (uuid.UUID, bool, *idemproxy.Problem) {
	var tenant uuid.UUID
	if present {
		t, err := r.format.Parse(claim)
		if err != nil {
			return uuid.Nil, false, r.invalid(fmt.Sprintf("claim %q of the bearer token", r.jwt.claim), err)
		}
		tenant = t
	}
	if values := req.Header.Values(r.header); len(values) > 0 {
		if h, err := r.format.ParseValues(values); err != nil || !present || h != tenant {
			return uuid.Nil, false, idemproxy.NewProblem(idemproxy.ProblemTenantConflict,
				fmt.Sprintf("header %s does not match claim %q of the bearer token; a verified token decides the tenant", r.header, r.jwt.claim))
		}
	}
	return tenant, present, nil
}

// Header returns the canonical name of the tenant header.
func (r *Resolver) Header() string { return r.header }

// Format returns the tenant format r admits.
func (r *Resolver) Format() Format { return r.format }

// ParseTenantValues parses a tenant given several times (repeated headers
// or query parameters) under FormatUUID: the values must all name the
// same tenant. No values is an error, as an empty tenant is.
func ParseTenantValues(values []string) (uuid.UUID, error) {
	return FormatUUID.ParseValues(values)
}

// ParseTenant accepts a UUID in its canonical 36-character form, in any
// letter case (FormatUUID).
func ParseTenant(s string) (uuid.UUID, error) {
	return FormatUUID.Parse(s)
}

// verify checks the bearer token, if any. It reports the tenant claim,
// whether a token was verified, and whether it carried the claim.
func (r *verifier) verify(req *http.Request) (claim string, verified, present bool, p *idemproxy.Problem) {
	auth := req.Header.Values("Authorization")
	if len(auth) == 0 {
		return "", false, false, nil
	}
	if len(auth) > 1 {
		return "", false, false, unauthorized("more than one Authorization header")
	}
	scheme, token, _ := strings.Cut(auth[0], " ")
	if !strings.EqualFold(scheme, "Bearer") {
		// Another scheme (Basic, say) is for the upstream, not for us.
		return "", false, false, nil
	}
	token = strings.TrimSpace(token)
	if token == "" {
		return "", false, false, unauthorized("empty bearer token")
	}
	claims := jwt.MapClaims{}
	if _, err := r.parser.ParseWithClaims(token, claims, r.keyfunc(req.Context())); err != nil {
		reason := r.tokenReason(err, claims)
		r.log.InfoContext(req.Context(), "bearer token refused", "reason", reason, "error", err)
		return "", false, false, unauthorized(reason)
	}
	v, ok := claims[r.claim]
	if !ok {
		return "", true, false, nil
	}
	s, ok := v.(string)
	if !ok {
		return "", false, false, idemproxy.NewProblem(idemproxy.ProblemInvalidTenant,
			fmt.Sprintf("claim %q of the bearer token is not a string", r.claim))
	}
	return s, true, true, nil
}

func (r *verifier) keyfunc(ctx context.Context) jwt.Keyfunc {
	return func(t *jwt.Token) (any, error) {
		switch t.Method.(type) {
		case *jwt.SigningMethodHMAC:
			if len(r.secret) > 0 {
				return r.secret, nil
			}
		case *jwt.SigningMethodRSA, *jwt.SigningMethodECDSA:
			if r.publicKey != nil {
				return r.publicKey, nil
			}
			if r.jwks != nil {
				return r.jwks.KeyfuncCtx(ctx)(t)
			}
		}
		return nil, errNoKey
	}
}

var errNoKey = errors.New("no verification key for this algorithm")

func unauthorized(detail string) *idemproxy.Problem {
	return idemproxy.NewProblem(idemproxy.ProblemUnauthorized, detail)
}

// tokenReason names why a token was refused without echoing the token.
// claims are the token's claims, decoded before validation failed.
func (r *verifier) tokenReason(err error, claims jwt.MapClaims) string {
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		return "malformed token"
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		return "token cannot be verified (unknown key or algorithm)"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return "token signature is invalid"
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		switch missing := r.missingClaims(claims); len(missing) {
		case 0:
			return "token lacks a required claim"
		case 1:
			return "token lacks the required claim " + missing[0]
		default:
			return "token lacks the required claims " + strings.Join(missing, ", ")
		}
	case errors.Is(err, jwt.ErrTokenExpired):
		return "token is expired"
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return "token is not valid yet"
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return "token has the wrong issuer"
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return "token has the wrong audience"
	default:
		return "token is invalid"
	}
}

// missingClaims lists the required claims (exp always; iss and aud when
// configured) that claims lacks, as the parser judges them: absent or
// empty.
func (r *verifier) missingClaims(claims jwt.MapClaims) []string {
	var missing []string
	if _, ok := claims["exp"]; !ok {
		missing = append(missing, "exp")
	}
	if iss, _ := claims.GetIssuer(); r.issuer != "" && iss == "" {
		missing = append(missing, "iss")
	}
	if aud, _ := claims.GetAudience(); r.audience != "" && len(aud) == 0 {
		missing = append(missing, "aud")
	}
	return missing
}
