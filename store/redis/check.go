package redis

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy"
)

// ReasonEvictingPolicy is the reason of the *idemproxy.MisconfiguredError
// Check returns for a Redis whose maxmemory-policy may evict keys.
const ReasonEvictingPolicy = "maxmemory-policy may evict keys"

// Ping reports whether the server, or every master of the cluster,
// answers and takes writes: it runs a script that does nothing but that,
// like a claim, a server out of memory refuses, which Ping reports as an
// *idemproxy.UnavailableError with ReasonMaxmemory. Its error satisfies
// errors.Is(err, idemproxy.ErrUnavailable); a permanent one is an
// *idemproxy.MisconfiguredError.
func (r *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	err := r.eachMaster(ctx, func(ctx context.Context, c goredis.Cmdable) error {
		return pingScript.Run(ctx, c, nil).Err()
	})
	if err != nil {
		return failure("ping", err)
	}
	return nil
}

// Check verifies, on the server or every master of the cluster, what the
// store's guarantees rest on and Ping does not show, and should be run
// before serving. First, that maxmemory-policy is noeviction: any other
// policy lets Redis delete a lock or record under memory pressure, and a
// retry would then run its command again. The policy is read from INFO
// memory, or CONFIG GET where INFO is refused; a server that refuses both
// (some managed services) fails the check, since the policy cannot be
// known. Then, that the credentials and the user's ACL allow every
// operation: it claims, releases, claims, completes, looks up, lists and
// deletes a key of its own under the nil tenant. A Redis that cannot be
// reached, or that is out of memory, gives an error satisfying
// errors.Is(err, idemproxy.ErrUnavailable): try again later. A check that
// retrying will not pass fails with an *idemproxy.MisconfiguredError
// (which satisfies ErrUnavailable too): among others a single-server
// store on a cluster node (ReasonClusterMode).
func (r *Store) Check(ctx context.Context) error {
	policyCtx, cancel := context.WithTimeout(ctx, r.opTimeout)
	err := r.eachMaster(policyCtx, func(ctx context.Context, c goredis.Cmdable) error {
		policy, err := maxmemoryPolicy(ctx, c)
		if err != nil {
			return err
		}
		if policy != "noeviction" {
			return idemproxy.Misconfigured(ReasonEvictingPolicy, fmt.Errorf("redis maxmemory-policy is %q: Redis may evict "+
				"idempotency keys under memory pressure, letting a retried command run twice; "+
				"set maxmemory-policy noeviction on the server", policy))
		}
		return nil
	})
	cancel()
	if err != nil {
		return err
	}
	var se *serverError
	if err := r.probe(ctx); errors.As(err, &se) && r.cluster == nil && (strings.HasPrefix(se.msg, "MOVED ") || strings.HasPrefix(se.msg, "CROSSSLOT ")) {
		return idemproxy.Misconfigured(ReasonClusterMode,
			fmt.Errorf("redis answered as a cluster node (%s): %s", se.msg, hint(ReasonClusterMode)))
	} else if errors.As(err, &se) {
		return idemproxy.Misconfigured(idemproxy.ReasonPermissionDenied,
			fmt.Errorf("redis refused an operation idemproxy needs (check the user's ACL): %s", se.msg))
	} else if err != nil {
		return err
	}
	return nil
}

// probe runs every operation once on a key of its own.
func (r *Store) probe(ctx context.Context) error {
	var id [8]byte
	_, _ = rand.Read(id[:])
	key := "idemproxy-start-check-" + hex.EncodeToString(id[:])
	c := idemproxy.Claim{Key: key, CommandID: uuid.New(), CommandType: "CHECK", Owner: uuid.New(), Lease: time.Minute}
	if _, err := r.Claim(ctx, c); err != nil {
		return err
	}
	if err := r.Release(ctx, c.Tenant, key, c.Owner); err != nil {
		return fmt.Errorf("store: redis start-up check: release: %w", err)
	}
	if _, err := r.Claim(ctx, c); err != nil {
		return err
	}
	if err := r.Renew(ctx, c.Tenant, key, c.Owner, c.Lease); err != nil {
		return fmt.Errorf("store: redis start-up check: renew: %w", err)
	}
	if err := r.Complete(ctx, idemproxy.Completion{Key: key, Owner: c.Owner, Status: 200, TTL: time.Minute}); err != nil {
		return fmt.Errorf("store: redis start-up check: complete: %w", err)
	}
	if _, err := r.Lookup(ctx, c.Tenant, key); err != nil {
		return fmt.Errorf("store: redis start-up check: lookup: %w", err)
	}
	if _, err := r.List(ctx, c.Tenant, idemproxy.ListOptions{Limit: 1}); err != nil {
		return fmt.Errorf("store: redis start-up check: list: %w", err)
	}
	return r.Delete(ctx, c.Tenant, key)
}

// maxmemoryPolicy reads the policy from INFO memory, falling back to
// CONFIG GET.
func maxmemoryPolicy(ctx context.Context, c goredis.Cmdable) (string, error) {
	info, infoErr := c.Info(ctx, "memory").Result()
	if infoErr == nil {
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "maxmemory_policy:"); ok {
				return v, nil
			}
		}
	}
	if infoErr != nil && !goredis.IsPermissionError(infoErr) {
		return "", failure("check", infoErr)
	}
	cfg, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	if err == nil && cfg["maxmemory-policy"] != "" {
		return cfg["maxmemory-policy"], nil
	}
	if err != nil && !goredis.IsPermissionError(err) {
		return "", failure("check", err)
	}
	return "", idemproxy.Misconfigured(idemproxy.ReasonPermissionDenied, fmt.Errorf(
		"redis maxmemory-policy cannot be read (INFO memory: %v; CONFIG GET maxmemory-policy: %v): "+
			"idemproxy needs noeviction and will not start without knowing it; allow the user INFO or CONFIG GET",
		describe(infoErr, "no maxmemory_policy field"), describe(err, "not answered")))
}

// describe describes err, or says what was missing when there was none.
func describe(err error, missing string) string {
	if err != nil {
		return err.Error()
	}
	return missing
}

// eachMaster runs fn on the server, or on every master of the cluster.
func (r *Store) eachMaster(ctx context.Context, fn func(context.Context, goredis.Cmdable) error) error {
	if r.cluster == nil {
		return fn(ctx, r.c)
	}
	return r.cluster.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error { return fn(ctx, c) })
}
