package proxy_test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"

	"github.com/idemproxy/idemproxy/proxy"
	"github.com/idemproxy/idemproxy/tenancy"
)

// TestTokenCatalogue: every kind of bad bearer token on a keyed request is
// a 401 problem, and nothing is forwarded or stored.
func TestTokenCatalogue(t *testing.T) { forEachStore(t, testTokenCatalogue) }

func testTokenCatalogue(t *testing.T, st option) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	b64 := func(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
	jwks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"keys": []map[string]any{{
			"kty": "RSA", "kid": "k1", "alg": "RS256", "use": "sig",
			"n": b64(key.N.Bytes()), "e": b64(big.NewInt(int64(key.E)).Bytes()),
		}}})
	}))
	defer jwks.Close()
	e := newEnv(t, st, func(_ *env, _ *proxy.Config, tc *tenancy.Config) {
		tc.Sources = []tenancy.Source{tenancy.SourceJWT}
		tc.JWKSURL = jwks.URL
		tc.Issuer = "https://issuer.example"
		tc.Audience = "orders"
	})
	tenant := e.tenant.String()
	claims := func(mod func(jwt.MapClaims)) jwt.MapClaims {
		c := jwt.MapClaims{"tenant_id": tenant, "exp": time.Now().Add(time.Hour).Unix(),
			"iss": "https://issuer.example", "aud": "orders"}
		if mod != nil {
			mod(c)
		}
		return c
	}
	sign := func(m jwt.SigningMethod, k any, kid string, c jwt.MapClaims) string {
		tok := jwt.NewWithClaims(m, c)
		tok.Header["kid"] = kid
		s, err := tok.SignedString(k)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	other, _ := rsa.GenerateKey(rand.Reader, 2048)
	pubDER, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	none := b64([]byte(`{"alg":"none","typ":"JWT","kid":"k1"}`)) + "." + func() string {
		b, _ := json.Marshal(claims(nil))
		return b64(b)
	}() + "."

	good := sign(jwt.SigningMethodRS256, key, "k1", claims(nil))
	for name, tok := range map[string]string{
		"forged":              sign(jwt.SigningMethodRS256, other, "k1", claims(nil)),
		"alg none":            none,
		"expired":             sign(jwt.SigningMethodRS256, key, "k1", claims(func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-time.Hour).Unix() })),
		"not yet valid":       sign(jwt.SigningMethodRS256, key, "k1", claims(func(c jwt.MapClaims) { c["nbf"] = time.Now().Add(time.Hour).Unix() })),
		"wrong issuer":        sign(jwt.SigningMethodRS256, key, "k1", claims(func(c jwt.MapClaims) { c["iss"] = "https://evil.example" })),
		"wrong audience":      sign(jwt.SigningMethodRS256, key, "k1", claims(func(c jwt.MapClaims) { c["aud"] = "payments" })),
		"algorithm confusion": sign(jwt.SigningMethodHS256, pubDER, "k1", claims(nil)),
		"unknown kid":         sign(jwt.SigningMethodRS256, key, "k2", claims(nil)),
	} {
		t.Run(name, func(t *testing.T) {
			wantProblem(t, e.do(req{key: "k", tenant: "-", headers: map[string]string{"Authorization": "Bearer " + tok}}),
				http.StatusUnauthorized, "unauthorized")
			e.wantCalls(0)
			if n := e.entries(); n != 0 {
				t.Fatalf("store holds %d entries, want 0", n)
			}
		})
	}
	// Conflicting tenant header when the token is the source: refused too.
	wantProblem(t, e.do(req{key: "k", tenant: uuid.NewString(), headers: map[string]string{"Authorization": "Bearer " + good}}),
		http.StatusBadRequest, "tenant-conflict")
	e.wantCalls(0)
	// The good token goes through.
	wantStatus(t, e.do(req{key: "k", tenant: "-", headers: map[string]string{"Authorization": "Bearer " + good}}), http.StatusCreated)
	e.wantCalls(1)
}
