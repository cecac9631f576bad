package tenancy_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

func newResolver(t *testing.T, cfg tenancy.Config) *tenancy.Resolver {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r, err := tenancy.New(ctx, cfg)
	if err != nil {
		t.Fatalf("tenancy.New: %v", err)
	}
	return r
}

func claims(tenant string, mod ...func(jwt.MapClaims)) jwt.MapClaims {
	c := jwt.MapClaims{
		"tenant_id": tenant,
		"exp":       time.Now().Add(time.Hour).Unix(),
		"iss":       "https://issuer.example",
		"aud":       "orders",
	}
	for _, m := range mod {
		m(c)
	}
	return c
}

func sign(t *testing.T, method jwt.SigningMethod, key any, c jwt.MapClaims, kid string) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, c)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatalf("sign: %v", err)
	}
	return s
}

func request(token string, headerTenant string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/orders", nil)
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	if headerTenant != "" {
		r.Header.Set("X-Tenant-ID", headerTenant)
	}
	return r
}

// noneToken builds an unsigned token with alg "none".
func noneToken(c jwt.MapClaims) string {
	h := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))
	body, _ := json.Marshal(c)
	return h + "." + base64.RawURLEncoding.EncodeToString(body) + "."
}

func TestHS256(t *testing.T) {
	r := newResolver(t, tenancy.Config{
		Sources: []tenancy.Source{tenancy.SourceJWT}, HS256Secret: secret,
		Issuer: "https://issuer.example", Audience: "orders",
	})
	tenant := uuid.NewString()
	good := sign(t, jwt.SigningMethodHS256, secret, claims(tenant), "")

	got, ok, p := r.Resolve(request(good, ""))
	if p != nil || !ok || got.String() != tenant {
		t.Fatalf("valid token: got %v %v %v, want %s", got, ok, p, tenant)
	}

	bad := map[string]string{
		"forged":         sign(t, jwt.SigningMethodHS256, []byte("another-secret-another-secret-xx"), claims(tenant), ""),
		"alg none":       noneToken(claims(tenant)),
		"expired":        sign(t, jwt.SigningMethodHS256, secret, claims(tenant, func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-time.Minute).Unix() }), ""),
		"no exp":         sign(t, jwt.SigningMethodHS256, secret, claims(tenant, func(c jwt.MapClaims) { delete(c, "exp") }), ""),
		"not yet valid":  sign(t, jwt.SigningMethodHS256, secret, claims(tenant, func(c jwt.MapClaims) { c["nbf"] = time.Now().Add(time.Hour).Unix() }), ""),
		"wrong issuer":   sign(t, jwt.SigningMethodHS256, secret, claims(tenant, func(c jwt.MapClaims) { c["iss"] = "https://evil.example" }), ""),
		"wrong audience": sign(t, jwt.SigningMethodHS256, secret, claims(tenant, func(c jwt.MapClaims) { c["aud"] = "payments" }), ""),
		"HS384":          sign(t, jwt.SigningMethodHS384, secret, claims(tenant), ""),
		"garbage":        "not.a.token",
		"tampered":       good[:len(good)-2] + "xx",
	}
	for name, tok := range bad {
		t.Run(name, func(t *testing.T) {
			// A valid header tenant does not rescue a bad token.
			_, _, p := r.Resolve(request(tok, tenant))
			if p == nil || p.Type != idemproxy.ProblemUnauthorized {
				t.Fatalf("got %v, want 401 unauthorized", p)
			}
			if strings.Contains(p.Detail, tok) {
				t.Fatal("the token is echoed in the problem detail")
			}
		})
	}
	t.Run("empty bearer", func(t *testing.T) {
		r2 := httptest.NewRequest(http.MethodPost, "/", nil)
		r2.Header.Set("Authorization", "Bearer ")
		if _, _, p := r.Resolve(r2); p == nil || p.Type != idemproxy.ProblemUnauthorized {
			t.Fatalf("got %v, want 401", p)
		}
	})
	t.Run("non-bearer scheme is the upstream's", func(t *testing.T) {
		r2 := httptest.NewRequest(http.MethodPost, "/", nil)
		r2.Header.Set("Authorization", "Basic dXNlcjpwYXNz")
		if _, ok, p := r.Resolve(r2); p != nil || ok {
			t.Fatalf("got %v %v, want no tenant and no problem", ok, p)
		}
	})
}

func TestJWTOnlyIgnoresHeader(t *testing.T) {
	r := newResolver(t, tenancy.Config{Sources: []tenancy.Source{tenancy.SourceJWT}, HS256Secret: secret})
	tenant := uuid.NewString()
	tok := sign(t, jwt.SigningMethodHS256, secret, claims(tenant), "")

	// A header alone gives no tenant when the token is the only source.
	if _, ok, p := r.Resolve(request("", uuid.NewString())); ok || p != nil {
		t.Fatalf("header used as tenant source: ok=%v p=%v", ok, p)
	}
	// The same tenant in both: fine.
	if got, ok, p := r.Resolve(request(tok, tenant)); p != nil || !ok || got.String() != tenant {
		t.Fatalf("matching header: got %v %v %v", got, ok, p)
	}
	// A spoofed header never overrides the token: refused.
	if _, _, p := r.Resolve(request(tok, uuid.NewString())); p == nil || p.Type != idemproxy.ProblemTenantConflict {
		t.Fatalf("spoofed header: got %v, want tenant-conflict", p)
	}
}

// TestTokenDecidesInEveryOrder: a header-sourced tenant is asserted, not
// authenticated, so a verified token's tenant wins in every source order,
// and a header that disagrees with it is refused.
func TestTokenDecidesInEveryOrder(t *testing.T) {
	headerT, tokenT := uuid.NewString(), uuid.NewString()
	tok := sign(t, jwt.SigningMethodHS256, secret, claims(tokenT), "")
	noClaim := sign(t, jwt.SigningMethodHS256, secret, claims("", func(c jwt.MapClaims) { delete(c, "tenant_id") }), "")
	for _, sources := range [][]tenancy.Source{
		{tenancy.SourceHeader, tenancy.SourceJWT},
		{tenancy.SourceJWT, tenancy.SourceHeader},
		{tenancy.SourceJWT},
	} {
		t.Run(fmt.Sprint(sources), func(t *testing.T) {
			r := newResolver(t, tenancy.Config{Sources: sources, HS256Secret: secret})
			// Token and a header naming another tenant: refused.
			if _, _, p := r.Resolve(request(tok, headerT)); p == nil || p.Type != idemproxy.ProblemTenantConflict {
				t.Fatalf("token %s with header %s: got %v, want tenant-conflict", tokenT, headerT, p)
			}
			// A malformed header beside a token: refused too.
			if _, _, p := r.Resolve(request(tok, "acme")); p == nil || p.Type != idemproxy.ProblemTenantConflict {
				t.Fatalf("token with a malformed header: got %v, want tenant-conflict", p)
			}
			// A verified token without the tenant claim cannot be paired
			// with a header naming the tenant.
			if _, _, p := r.Resolve(request(noClaim, headerT)); p == nil || p.Type != idemproxy.ProblemTenantConflict {
				t.Fatalf("token without the claim, with a header: got %v, want tenant-conflict", p)
			}
			// Token alone, or with a header that agrees: the token's tenant.
			for _, h := range []string{"", tokenT} {
				got, ok, p := r.Resolve(request(tok, h))
				if p != nil || !ok || got.String() != tokenT {
					t.Fatalf("token with header %q: got %v %v %v, want %s", h, got, ok, p, tokenT)
				}
			}
			// No token: the header, when it is a source.
			got, ok, p := r.Resolve(request("", headerT))
			wantHeader := len(sources) == 2
			if p != nil || ok != wantHeader || (ok && got.String() != headerT) {
				t.Fatalf("header only: got %v %v %v, want header used = %v", got, ok, p, wantHeader)
			}
		})
	}
}

// A token refused for a missing claim names that claim.
func TestMissingClaimIsNamed(t *testing.T) {
	r := newResolver(t, tenancy.Config{
		Sources: []tenancy.Source{tenancy.SourceJWT}, HS256Secret: secret,
		Issuer: "https://issuer.example", Audience: "orders",
	})
	tenant := uuid.NewString()
	for _, c := range []struct {
		drop []string
		want string
	}{
		{[]string{"exp"}, "token lacks the required claim exp"},
		{[]string{"iss"}, "token lacks the required claim iss"},
		{[]string{"aud"}, "token lacks the required claim aud"},
		{[]string{"iss", "aud"}, "token lacks the required claims iss, aud"},
	} {
		tok := sign(t, jwt.SigningMethodHS256, secret, claims(tenant, func(m jwt.MapClaims) {
			for _, k := range c.drop {
				delete(m, k)
			}
		}), "")
		_, _, p := r.Resolve(request(tok, ""))
		if p == nil || p.Type != idemproxy.ProblemUnauthorized || p.Detail != c.want {
			t.Errorf("without %v: got %v, want 401 %q", c.drop, p, c.want)
		}
	}
}

func TestBadTenantClaim(t *testing.T) {
	r := newResolver(t, tenancy.Config{Sources: []tenancy.Source{tenancy.SourceJWT}, HS256Secret: secret})
	for name, v := range map[string]any{"not a uuid": "acme", "number": 42, "empty": ""} {
		tok := sign(t, jwt.SigningMethodHS256, secret, claims("", func(c jwt.MapClaims) { c["tenant_id"] = v }), "")
		if _, _, p := r.Resolve(request(tok, "")); p == nil || p.Type != idemproxy.ProblemInvalidTenant {
			t.Fatalf("%s: got %v, want invalid-tenant", name, p)
		}
	}
}

func TestParseTenant(t *testing.T) {
	good := uuid.NewString()
	if _, err := tenancy.ParseTenant(good); err != nil {
		t.Fatalf("%s: %v", good, err)
	}
	for _, bad := range []string{"", "acme", "urn:uuid:" + good, "{" + good + "}", strings.ReplaceAll(good, "-", ""), good + " ", good[:35] + "z"} {
		if _, err := tenancy.ParseTenant(bad); err == nil {
			t.Fatalf("ParseTenant(%q) accepted", bad)
		}
	}
}

func rsaKey(t *testing.T) *rsa.PrivateKey {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// jwksServer serves the given public keys as a JWKS and counts fetches.
func jwksServer(t *testing.T, rsaPub *rsa.PublicKey, ecPub *ecdsa.PublicKey) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var fetches atomic.Int64
	ecBytes, err := ecPub.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]any{"keys": []map[string]any{
		{"kty": "RSA", "kid": "rsa-1", "alg": "RS256", "use": "sig",
			"n": b64(rsaPub.N.Bytes()), "e": b64(big.NewInt(int64(rsaPub.E)).Bytes())},
		{"kty": "EC", "kid": "ec-1", "alg": "ES256", "use": "sig", "crv": "P-256",
			"x": b64(ecBytes[1:33]), "y": b64(ecBytes[33:65])},
	}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetches.Add(1)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(set)
	}))
	t.Cleanup(srv.Close)
	return srv, &fetches
}

func TestJWKS(t *testing.T) {
	rk := rsaKey(t)
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srv, fetches := jwksServer(t, &rk.PublicKey, &ek.PublicKey)
	r := newResolver(t, tenancy.Config{Sources: []tenancy.Source{tenancy.SourceJWT}, JWKSURL: srv.URL})
	if fetches.Load() == 0 {
		t.Fatal("JWKS not fetched at start")
	}
	tenant := uuid.NewString()
	for name, tok := range map[string]string{
		"RS256": sign(t, jwt.SigningMethodRS256, rk, claims(tenant), "rsa-1"),
		"ES256": sign(t, jwt.SigningMethodES256, ek, claims(tenant), "ec-1"),
	} {
		got, ok, p := r.Resolve(request(tok, ""))
		if p != nil || !ok || got.String() != tenant {
			t.Fatalf("%s: got %v %v %v", name, got, ok, p)
		}
	}
	otherRSA := rsaKey(t)
	pubDER, _ := x509.MarshalPKIXPublicKey(&rk.PublicKey)
	for name, tok := range map[string]string{
		"unknown kid":         sign(t, jwt.SigningMethodRS256, rk, claims(tenant), "nobody"),
		"signed by other key": sign(t, jwt.SigningMethodRS256, otherRSA, claims(tenant), "rsa-1"),
		"kid of other alg":    sign(t, jwt.SigningMethodRS256, rk, claims(tenant), "ec-1"),
		"HS256 with RSA key":  sign(t, jwt.SigningMethodHS256, pubDER, claims(tenant), "rsa-1"),
		"alg none":            noneToken(claims(tenant)),
	} {
		if _, _, p := r.Resolve(request(tok, "")); p == nil || p.Type != idemproxy.ProblemUnauthorized {
			t.Fatalf("%s: got %v, want 401", name, p)
		}
	}
}

// Algorithm confusion: an HS256 token whose "secret" is the RS256 public
// key (as PEM or DER) must not verify.
func TestAlgorithmConfusion(t *testing.T) {
	rk := rsaKey(t)
	der, _ := x509.MarshalPKIXPublicKey(&rk.PublicKey)
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	pub, err := tenancy.ParsePublicKey(pemBytes)
	if err != nil {
		t.Fatal(err)
	}
	r := newResolver(t, tenancy.Config{Sources: []tenancy.Source{tenancy.SourceJWT}, PublicKey: pub})
	tenant := uuid.NewString()
	if got, ok, p := r.Resolve(request(sign(t, jwt.SigningMethodRS256, rk, claims(tenant), ""), "")); p != nil || !ok || got.String() != tenant {
		t.Fatalf("RS256 with PEM key: %v %v %v", got, ok, p)
	}
	for name, key := range map[string][]byte{"PEM": pemBytes, "DER": der} {
		tok := sign(t, jwt.SigningMethodHS256, key, claims(tenant), "")
		if _, _, p := r.Resolve(request(tok, "")); p == nil || p.Type != idemproxy.ProblemUnauthorized {
			t.Fatalf("HS256 signed with the public key as %s: got %v, want 401", name, p)
		}
	}
}

func TestParsePublicKey(t *testing.T) {
	ek, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	der, _ := x509.MarshalPKIXPublicKey(&ek.PublicKey)
	if _, err := tenancy.ParsePublicKey(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})); err == nil {
		t.Fatal("P-384 key accepted for ES256")
	}
	if _, err := tenancy.ParsePublicKey([]byte("not pem")); err == nil {
		t.Fatal("garbage accepted")
	}
	rk := rsaKey(t)
	if _, err := tenancy.ParsePublicKey(pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&rk.PublicKey)})); err != nil {
		t.Fatalf("PKCS#1 RSA key: %v", err)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for name, cfg := range map[string]tenancy.Config{
		"no sources":       {},
		"unknown source":   {Sources: []tenancy.Source{"cookie"}},
		"duplicate source": {Sources: []tenancy.Source{tenancy.SourceHeader, tenancy.SourceHeader}},
		"jwt without keys": {Sources: []tenancy.Source{tenancy.SourceJWT}},
	} {
		if _, err := tenancy.New(context.Background(), cfg); err == nil {
			t.Fatalf("%s: accepted", name)
		}
	}
}

func TestMiddleware(t *testing.T) {
	r := newResolver(t, tenancy.Config{Sources: []tenancy.Source{tenancy.SourceHeader, tenancy.SourceJWT}, HS256Secret: secret})
	var calls atomic.Int64
	var seen uuid.UUID
	next := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		calls.Add(1)
		seen, _ = tenancy.FromContext(req.Context())
	})
	h := r.Middleware(tenancy.MiddlewareOptions{Applies: func(req *http.Request) bool { return req.Method == http.MethodPost }})(next)

	tenant := uuid.New()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, request("", tenant.String()))
	if rec.Code != 200 || seen != tenant {
		t.Fatalf("got %d %v, want 200 and %v", rec.Code, seen, tenant)
	}
	// A bad token on a checked request stops it here.
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, request("bad.token.here", tenant.String()))
	if rec.Code != http.StatusUnauthorized || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("got %d %q, want 401 problem+json", rec.Code, rec.Header().Get("Content-Type"))
	}
	// Requests the middleware does not apply to are not checked at all.
	get := httptest.NewRequest(http.MethodGet, "/", nil)
	get.Header.Set("Authorization", "Bearer bad.token.here")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, get)
	if rec.Code != 200 {
		t.Fatalf("unchecked request: got %d, want 200", rec.Code)
	}
	if calls.Load() != 2 {
		t.Fatalf("next called %d times, want 2", calls.Load())
	}
}

func FuzzParseTenant(f *testing.F) {
	f.Add("0b9f6a3e-4d1c-4c7e-9f2a-5e8b7d6c1a20")
	f.Add("")
	f.Add("{0b9f6a3e-4d1c-4c7e-9f2a-5e8b7d6c1a20}")
	f.Add("0b9f6a3e4d1c4c7e9f2a5e8b7d6c1a20")
	f.Fuzz(func(t *testing.T, s string) {
		u, err := tenancy.ParseTenant(s)
		if err != nil {
			return
		}
		// Only the canonical form is accepted, so one tenant has one
		// spelling up to letter case.
		if !strings.EqualFold(u.String(), s) {
			t.Fatalf("ParseTenant(%q) = %s: not its canonical form", s, u)
		}
	})
}

// Tokens naming unknown kids are refused at once: they must not queue on
// the JWKS refresh limiter (anyone can mint them).
func TestUnknownKIDFloodDoesNotWait(t *testing.T) {
	rk := rsaKey(t)
	ek, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srv, fetches := jwksServer(t, &rk.PublicKey, &ek.PublicKey)
	r := newResolver(t, tenancy.Config{Sources: []tenancy.Source{tenancy.SourceJWT}, JWKSURL: srv.URL})
	const n = 8
	done := make(chan *idemproxy.Problem, n)
	for i := range n {
		tok := sign(t, jwt.SigningMethodRS256, rk, claims(uuid.NewString()), fmt.Sprint("unknown-", i))
		go func() {
			_, _, p := r.Resolve(request(tok, ""))
			done <- p
		}()
	}
	// Waiting on the limiter would take 10 s per token; refusal is at once.
	deadline := time.After(5 * time.Second)
	for range n {
		select {
		case p := <-done:
			if p == nil || p.Type != idemproxy.ProblemUnauthorized {
				t.Fatalf("unknown kid: got %v, want 401", p)
			}
		case <-deadline:
			t.Fatal("tokens with unknown kids were held waiting for a JWKS refresh")
		}
	}
	if got := fetches.Load(); got > 2 {
		t.Fatalf("%d JWKS fetches for %d unknown kids: the refresh is not rate limited", got, n)
	}
}
