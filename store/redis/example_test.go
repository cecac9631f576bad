package redis_test

import (
	"log"
	"net/http"

	"github.com/idemproxy/idemproxy/idempotency"
	"github.com/idemproxy/idemproxy/store/redis"
)

// Replicas that share a Redis share the keys: a retry that reaches
// another replica is answered from the same record. (It needs a Redis,
// so go test compiles it without running it.)
func ExampleNew() {
	st, err := redis.New(redis.Options{URL: "redis://127.0.0.1:6379/0"})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	step, err := idempotency.New(idempotency.Config{Store: st})
	if err != nil {
		log.Fatal(err)
	}
	defer step.Close()
	http.Handle("POST /orders", step.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
}
