package tenancy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/idemproxy/idemproxy/tenancy"
)

// A legacy service's tenants are strings in a header: format any maps
// each to its UUIDv5, which is what the step and the store see. A request
// without one goes on with no tenant in its context: the idempotency step
// answers a keyed one 400 (tenant required).
func ExampleResolver_Middleware() {
	res, err := tenancy.New(context.Background(), tenancy.Config{
		Sources: []tenancy.Source{tenancy.SourceHeader},
		Format:  tenancy.FormatAny,
	})
	if err != nil {
		panic(err)
	}
	h := res.Middleware(tenancy.MiddlewareOptions{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant, _ := tenancy.FromContext(r.Context())
		fmt.Fprint(w, tenant)
	}))

	for _, header := range []string{"acme", ""} {
		req := httptest.NewRequest(http.MethodPost, "/orders", nil)
		if header != "" {
			req.Header.Set("X-Tenant-ID", header)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Body.String() == tenancy.MapTenant("acme").String())
	}
	// Output:
	// 200 true
	// 200 false
}

// MapTenant is the UUID a tenant string stands for under format any: the
// same on every replica and every restart.
func ExampleMapTenant() {
	fmt.Println(tenancy.MapTenant("acme"))
	// Output: b4bf1454-da16-5bb7-869e-9868b7db1266
}
