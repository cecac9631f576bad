package store

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy"
)

// RedisOptions configures NewRedis. URL is required; every other zero
// value is replaced by the default its comment gives.
type RedisOptions struct {
	// URL is a redis:// or rediss:// URL with optional user, password and
	// database (go-redis's ParseURL form). With Cluster it is read as a
	// cluster URL (ParseClusterURL): more seed nodes as addr= parameters,
	// no database.
	URL string
	// Cluster makes the store a Redis Cluster client.
	Cluster bool
	// Prefix begins every key the store writes. It may not contain '{',
	// '}' or a glob character (*?[]\). Empty means DefaultRedisPrefix.
	Prefix string
	// OpTimeout bounds each operation, including the wait for a pooled
	// connection, the dial and a server that does not answer at all
	// (IDEMPROXY_STORE_TIMEOUT). Zero means three seconds.
	OpTimeout time.Duration
	// PoolSize bounds the connections per Redis node. Zero means go-redis's
	// default, ten per CPU.
	PoolSize int
	// LockGrace is how long a lock outlives its lease in Redis before the
	// key's TTL removes it. Such a lock counts as absent for Claim and
	// Lookup at once; it is kept so that a late Complete from its owner
	// still lands if no one has claimed the key since. Zero means one hour.
	LockGrace time.Duration
	// AutoPipeline sends the operations of concurrent requests to Redis
	// together, several per write and per read, on go-redis's
	// autopipeliner (experimental in go-redis v9): fewer system calls on
	// both sides, so more keyed requests per CPU. An operation still
	// returns when OpTimeout ends; its command may then still run, as one
	// whose reply was lost may, and every script is safe to run again.
	// Not used with WaitReplicas.
	AutoPipeline bool
	// Logger receives go-redis's own messages (dial failures, reconnects)
	// as warnings. go-redis keeps one logger per process, so the last store
	// opened with a Logger sets it; nil leaves go-redis's (standard error).
	Logger *slog.Logger
	// WaitReplicas, when positive, makes every claim and completion wait
	// (Redis WAIT, on the same connection) until that many replicas have
	// acknowledged it; a write acknowledged by fewer fails with
	// idemproxy.ErrUnavailable. Zero waits for none.
	WaitReplicas int
}

// Redis is the store for replicas that share a Redis server or a Redis
// Cluster. Each operation is one server-side Lua script on one Redis key,
// atomic on the server; leases and expiry are judged by Redis's clock
// (TIME), and every key carries a TTL (lease + LockGrace for a lock,
// the record's TTL for a record), so Redis's own expiry purges them. It is
// safe for concurrent use.
//
// The key of (tenant, key) is Prefix + the tenant's UUID + ':' + the key
// with '%', '{' and '}' percent-encoded. The tenant's UUID has a fixed
// length, so no two (tenant, key) pairs share a Redis key; the encoded key
// has no '{', so no client-chosen key can pick a Cluster hash tag, and the
// keys of every tenant spread over all the Cluster's slots. A tenant's
// entries are found by SCAN MATCH Prefix + tenant + ":*" on every master.
type Redis struct {
	c            redis.UniversalClient
	pipeline     *redis.AutoPipeliner // nil unless AutoPipeline
	cluster      *redis.ClusterClient // nil for a single server
	prefix       string
	opTimeout    time.Duration
	graceUS      int64
	waitReplicas int
}

// DefaultRedisPrefix begins the store's keys when RedisOptions.Prefix is
// empty.
const DefaultRedisPrefix = "idemproxy:"

// RedisCompleteSHA is the SHA-1 by which Complete calls its script
// (EVALSHA), for tests that pick completions out of the traffic.
var RedisCompleteSHA = completeScript.Hash()

// The scripts. Times are microseconds of Redis's clock, formatted with
// %d (Lua numbers are doubles: exact to 2^53 µs, about 285 years).
var (
	//go:embed redis_claim.lua
	claimLua    string
	claimScript = newLuaScript(claimLua)
	//go:embed redis_complete.lua
	completeLua    string
	completeScript = newLuaScript(completeLua)
	//go:embed redis_release.lua
	releaseLua    string
	releaseScript = newLuaScript(releaseLua)
	//go:embed redis_lookup.lua
	lookupLua    string
	lookupScript = newLuaScript(lookupLua)
)

// luaScript is a script and its source, which the autopipelined path sends
// itself when the server does not have the script cached.
type luaScript struct {
	*redis.Script
	src string
}

func newLuaScript(src string) luaScript { return luaScript{redis.NewScript(src), src} }

// NewRedis returns a store on the server or cluster at opts.URL. It does
// not connect: a Redis that is down at start makes operations fail with
// idemproxy.ErrUnavailable until it comes back, and NewRedis fails only on
// a bad URL or option. Call Check before serving, and Close to release
// the connections.
func NewRedis(opts RedisOptions) (*Redis, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.OpTimeout <= 0 {
		opts.OpTimeout = 3 * time.Second
	}
	if opts.LockGrace <= 0 {
		opts.LockGrace = time.Hour
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultRedisPrefix
	}
	if opts.Logger != nil {
		redis.SetLogger(redisLog{opts.Logger})
	}
	r := &Redis{
		prefix:       opts.Prefix,
		opTimeout:    opts.OpTimeout,
		graceUS:      opts.LockGrace.Microseconds(),
		waitReplicas: opts.WaitReplicas,
	}
	// The operation's context bounds every wait (ContextTimeoutEnabled);
	// the socket timeouts are only a backstop. A command is retried once
	// on a broken connection: the claim script treats a rerun by the same
	// owner as its own claim, and a rerun completion or release reports
	// ErrNotOwner, which the proxy resolves with a lookup.
	tune := func(ctxTimeout *bool, dial, read, write, wait *time.Duration, retries, poolSize *int) {
		*ctxTimeout = true
		*dial, *read, *write, *wait = opts.OpTimeout, opts.OpTimeout, opts.OpTimeout, opts.OpTimeout
		*retries = 1
		if opts.PoolSize > 0 {
			*poolSize = opts.PoolSize
		}
	}
	if opts.Cluster {
		co, err := redis.ParseClusterURL(opts.URL)
		if err != nil {
			return nil, fmt.Errorf("store: redis cluster url: %w", redactURLError(err))
		}
		tune(&co.ContextTimeoutEnabled, &co.DialTimeout, &co.ReadTimeout, &co.WriteTimeout, &co.PoolTimeout, &co.MaxRetries, &co.PoolSize)
		r.cluster = redis.NewClusterClient(co)
		r.c = r.cluster
	} else {
		o, err := redis.ParseURL(opts.URL)
		if err != nil {
			return nil, fmt.Errorf("store: redis url: %w", redactURLError(err))
		}
		tune(&o.ContextTimeoutEnabled, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout, &o.MaxRetries, &o.PoolSize)
		r.c = redis.NewClient(o)
	}
	if opts.AutoPipeline && opts.WaitReplicas == 0 {
		ap, err := r.c.AsyncAutoPipeline()
		if err != nil {
			r.c.Close()
			return nil, fmt.Errorf("store: redis autopipeline: %w", err)
		}
		r.pipeline = ap
	}
	return r, nil
}

// Validate reports every setting of o that NewRedis refuses, as
// *idemproxy.ConfigError values joined in one error; it connects to
// nothing. An error never echoes the URL, which may carry a password.
func (o RedisOptions) Validate() error {
	errs := idemproxy.ConfigErrors{Struct: "store.RedisOptions"}
	var err error
	switch {
	case o.URL == "":
		errs.Add("URL", "is required")
	case o.Cluster:
		_, err = redis.ParseClusterURL(o.URL)
	default:
		_, err = redis.ParseURL(o.URL)
	}
	if err != nil {
		errs.Add("URL", "is not a redis:// or rediss:// URL go-redis reads (%v)", redactURLError(err))
	}
	if strings.ContainsAny(o.Prefix, "{}*?[]\\") {
		errs.Add("Prefix", "may not contain '{', '}' or a glob character, got %q", o.Prefix)
	}
	if o.PoolSize < 0 {
		errs.Add("PoolSize", "must be positive, got %d", o.PoolSize)
	}
	if o.WaitReplicas < 0 {
		errs.Add("WaitReplicas", "must not be negative, got %d", o.WaitReplicas)
	}
	for field, d := range map[string]time.Duration{"OpTimeout": o.OpTimeout, "LockGrace": o.LockGrace} {
		if d < 0 {
			errs.Add(field, "must be a positive duration, got %s", d)
		}
	}
	return errs.Err()
}

// redisLog passes go-redis's messages to a slog.Logger.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, "redis client", "message", fmt.Sprintf(format, v...))
}

// redactURLError keeps a URL parse error from echoing the URL, which may
// carry a password.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// ReasonEvictingPolicy is the reason of the *idemproxy.MisconfiguredError
// Check returns for a Redis whose maxmemory-policy may evict keys.
const ReasonEvictingPolicy = "maxmemory-policy may evict keys"

// Capabilities reports a store shared by replicas over the network.
func (r *Redis) Capabilities() idemproxy.Capabilities { return idemproxy.Capabilities{Shared: true} }

// Close closes every connection. The store is unusable afterwards.
func (r *Redis) Close() error {
	if r.pipeline != nil {
		r.pipeline.Close()
	}
	return r.c.Close()
}

// key is the Redis key of (tenant, key); see Redis.
func (r *Redis) key(tenant uuid.UUID, key string) string {
	var b strings.Builder
	b.Grow(len(r.prefix) + 37 + len(key) + 8)
	b.WriteString(r.prefix)
	var t [36]byte
	hexUUID(t[:], tenant)
	b.Write(t[:])
	b.WriteByte(':')
	for i := 0; i < len(key); i++ {
		switch c := key[i]; c {
		case '%':
			b.WriteString("%25")
		case '{':
			b.WriteString("%7B")
		case '}':
			b.WriteString("%7D")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// hexUUID writes u's canonical form into dst (36 bytes) without the
// allocation of u.String().
func hexUUID(dst []byte, u uuid.UUID) {
	const digits = "0123456789abcdef"
	j := 0
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			dst[j] = '-'
			j++
		}
		dst[j], dst[j+1] = digits[c>>4], digits[c&0xf]
		j += 2
	}
}

// run runs a script on key, waiting for WaitReplicas replicas when wait is
// set and the store has them.
func (r *Redis) run(ctx context.Context, s luaScript, key string, wait bool, args ...any) (any, error) {
	switch {
	case r.pipeline != nil:
		return r.runPipelined(ctx, s, key, args)
	case wait && r.waitReplicas > 0:
		return r.runWaiting(ctx, s, key, args)
	default:
		return s.Run(ctx, r.c, []string{key}, args...).Result()
	}
}

// waitShortfall is the error of a script that ran on the primary but that
// fewer replicas than WaitReplicas acknowledged.
type waitShortfall struct {
	acked int64
	want  int
	cause error // WAIT's own error, if it failed
}

func (e *waitShortfall) Error() string {
	return fmt.Sprintf("%v: redis write acknowledged by %d of the %d replicas waited for (%v)",
		idemproxy.ErrUnavailable, e.acked, e.want, e.cause)
}

func (e *waitShortfall) Unwrap() error { return idemproxy.ErrUnavailable }

// runWaiting sends the script and WAIT down one connection, so that WAIT
// counts the replicas that have the script's writes. When fewer
// acknowledge it than WaitReplicas it returns the script's reply with a
// *waitShortfall.
func (r *Redis) runWaiting(ctx context.Context, s luaScript, key string, args []any) (any, error) {
	node := redis.Cmdable(r.c)
	if r.cluster != nil {
		c, err := r.cluster.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		node = c
	}
	send := func(whole bool) (any, error) {
		var eval, acked *redis.Cmd
		_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
			if whole {
				eval = s.Eval(ctx, p, []string{key}, args...)
			} else {
				eval = s.EvalSha(ctx, p, []string{key}, args...)
			}
			acked = p.Do(ctx, "WAIT", r.waitReplicas, (r.opTimeout / 2).Milliseconds())
			return nil
		})
		v, evalErr := eval.Result()
		if evalErr != nil {
			return nil, evalErr
		}
		if err != nil {
			return nil, err
		}
		if n, err := acked.Int64(); err != nil || n < int64(r.waitReplicas) {
			return v, &waitShortfall{acked: n, want: r.waitReplicas, cause: err}
		}
		return v, nil
	}
	v, err := send(false)
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		// Not in the server's cache (after SCRIPT FLUSH or a failover):
		// send it whole.
		return send(true)
	}
	return v, err
}

// runPipelined runs a script on the autopipeliner, waiting for its reply
// until ctx ends.
func (r *Redis) runPipelined(ctx context.Context, s luaScript, key string, args []any) (any, error) {
	send := func(verb, script string) (any, error) {
		cmd := redis.NewCmd(ctx, append([]any{verb, script, 1, key}, args...)...)
		if err := r.pipeline.Submit(ctx, cmd).WaitContext(ctx); err != nil && ctx.Err() != nil {
			return nil, err
		}
		return cmd.Result()
	}
	v, err := send("evalsha", s.Hash())
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		return send("eval", s.src)
	}
	return v, err
}

// Claim locks (tenant, key) unless a live lock or record is there, in which
// case it reports that entry. A lock whose lease ended or a record past its
// expiry is taken over, judged by Redis's clock.
func (r *Redis) Claim(ctx context.Context, c idemproxy.Claim) (idemproxy.ClaimResult, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	key := r.key(c.Tenant, c.Key)
	v, err := r.run(ctx, claimScript, key, true,
		c.Owner[:], c.CommandID[:], c.CommandType, c.Fingerprint[:], c.Lease.Microseconds(), r.graceUS)
	if short := (*waitShortfall)(nil); errors.As(err, &short) {
		if reply, ok := v.([]any); ok && len(reply) > 0 && reply[0] == int64(1) {
			// Locked on the primary only: the claim fails and nothing is
			// forwarded, so drop the lock instead of leaving the key
			// locked, and a retry refused, until the lease ends.
			_, _ = r.run(ctx, releaseScript, key, false, c.Owner[:])
		}
	}
	if err != nil {
		return idemproxy.ClaimResult{}, redisFailure("claim", err)
	}
	reply, ok := v.([]any)
	if !ok || len(reply) < 2 {
		return idemproxy.ClaimResult{}, redisMalformed("claim", v)
	}
	if claimed, _ := reply[0].(int64); claimed == 1 {
		now, _ := reply[1].(int64)
		created := time.UnixMicro(now)
		return idemproxy.ClaimResult{Claimed: true, Entry: idemproxy.Entry{
			Tenant:      c.Tenant,
			Key:         c.Key,
			State:       idemproxy.StateInFlight,
			CommandID:   c.CommandID,
			CommandType: c.CommandType,
			Fingerprint: c.Fingerprint,
			CreatedAt:   created,
			ExpiresAt:   created.Add(c.Lease.Truncate(time.Microsecond)),
			Remaining:   c.Lease.Truncate(time.Microsecond),
		}}, nil
	}
	e, err := redisEntry(reply[1:])
	if err != nil {
		return idemproxy.ClaimResult{}, fmt.Errorf("%w: redis claim: %v", idemproxy.ErrUnavailable, err)
	}
	e.Tenant, e.Key = c.Tenant, c.Key
	return idemproxy.ClaimResult{Entry: e}, nil
}

// Complete turns the caller's lock into a record that replays for c.TTL
// from now, by Redis's clock. It fails with idemproxy.ErrNotOwner if the
// lock is gone, already completed or held by another owner. A lock whose
// lease ended but that no one claimed since is still completed, for
// LockGrace after its lease.
func (r *Redis) Complete(ctx context.Context, c idemproxy.Completion) error {
	var (
		responded, truncated, hasHeader, hasBody string
		header, body                             []byte
	)
	if resp := c.Response; resp != nil {
		responded, truncated = "1", "0"
		if resp.Truncated {
			truncated = "1"
		}
		if resp.Header != nil {
			h, err := json.Marshal(resp.Header)
			if err != nil {
				return fmt.Errorf("store: redis complete: encode response header: %w", err)
			}
			hasHeader, header = "1", h
		}
		if resp.Body != nil {
			hasBody, body = "1", resp.Body
		}
	}
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	v, err := r.run(ctx, completeScript, r.key(c.Tenant, c.Key), true,
		c.Owner[:], c.Status, max(c.TTL.Microseconds(), 1), responded, truncated, hasHeader, header, hasBody, body)
	if err != nil {
		return redisFailure("complete", err)
	}
	if n, _ := v.(int64); n != 1 {
		return idemproxy.ErrNotOwner
	}
	return nil
}

// Release drops the caller's lock. It fails with idemproxy.ErrNotOwner if
// the lock is gone, completed or held by another owner.
func (r *Redis) Release(ctx context.Context, tenant uuid.UUID, key string, owner uuid.UUID) error {
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	v, err := r.run(ctx, releaseScript, r.key(tenant, key), false, owner[:])
	if err != nil {
		return redisFailure("release", err)
	}
	if n, _ := v.(int64); n != 1 {
		return idemproxy.ErrNotOwner
	}
	return nil
}

// Lookup returns the live lock or record for (tenant, key), or
// idemproxy.ErrNotFound.
func (r *Redis) Lookup(ctx context.Context, tenant uuid.UUID, key string) (idemproxy.Entry, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	v, err := r.run(ctx, lookupScript, r.key(tenant, key), false)
	if errors.Is(err, redis.Nil) {
		return idemproxy.Entry{}, idemproxy.ErrNotFound
	}
	if err != nil {
		return idemproxy.Entry{}, redisFailure("lookup", err)
	}
	reply, ok := v.([]any)
	if !ok {
		return idemproxy.Entry{}, redisMalformed("lookup", v)
	}
	e, err := redisEntry(reply)
	if err != nil {
		return idemproxy.Entry{}, fmt.Errorf("%w: redis lookup: %v", idemproxy.ErrUnavailable, err)
	}
	e.Tenant, e.Key = tenant, key
	return e, nil
}

// Delete removes the lock or record for (tenant, key), live or ended but
// not yet expired by Redis, or reports idemproxy.ErrNotFound.
func (r *Redis) Delete(ctx context.Context, tenant uuid.UUID, key string) error {
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	n, err := r.c.Del(ctx, r.key(tenant, key)).Result()
	if err != nil {
		return redisFailure("delete", err)
	}
	if n == 0 {
		return idemproxy.ErrNotFound
	}
	return nil
}

// Ping reports whether the server, or every master of the cluster,
// answers; its error satisfies errors.Is(err, idemproxy.ErrUnavailable)
// unless Redis refused the credentials.
func (r *Redis) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	err := r.eachMaster(ctx, func(ctx context.Context, c redis.Cmdable) error { return c.Ping(ctx).Err() })
	if err != nil {
		return redisFailure("ping", err)
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
// operation: it claims, releases, claims, completes, looks up and deletes
// a key of its own under the nil tenant. A Redis that cannot be reached
// gives an error satisfying errors.Is(err, idemproxy.ErrUnavailable): try
// again later. A check that retrying will not pass fails with an
// *idemproxy.MisconfiguredError (which satisfies ErrUnavailable too).
func (r *Redis) Check(ctx context.Context) error {
	policyCtx, cancel := context.WithTimeout(ctx, r.opTimeout)
	err := r.eachMaster(policyCtx, func(ctx context.Context, c redis.Cmdable) error {
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
	var se *redisServerError
	if err := r.probe(ctx); errors.As(err, &se) {
		return idemproxy.Misconfigured(idemproxy.ReasonPermissionDenied,
			fmt.Errorf("redis refused an operation idemproxy needs (check the user's ACL): %s", se.msg))
	} else if err != nil {
		return err
	}
	return nil
}

// probe runs every operation once on a key of its own.
func (r *Redis) probe(ctx context.Context) error {
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
	if err := r.Complete(ctx, idemproxy.Completion{Key: key, Owner: c.Owner, Status: 200, TTL: time.Minute}); err != nil {
		return fmt.Errorf("store: redis start-up check: complete: %w", err)
	}
	if _, err := r.Lookup(ctx, c.Tenant, key); err != nil {
		return fmt.Errorf("store: redis start-up check: lookup: %w", err)
	}
	return r.Delete(ctx, c.Tenant, key)
}

// maxmemoryPolicy reads the policy from INFO memory, falling back to
// CONFIG GET.
func maxmemoryPolicy(ctx context.Context, c redis.Cmdable) (string, error) {
	info, infoErr := c.Info(ctx, "memory").Result()
	if infoErr == nil {
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "maxmemory_policy:"); ok {
				return v, nil
			}
		}
	}
	if infoErr != nil && !redis.IsPermissionError(infoErr) {
		return "", redisFailure("check", infoErr)
	}
	cfg, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
	if err == nil && cfg["maxmemory-policy"] != "" {
		return cfg["maxmemory-policy"], nil
	}
	if err != nil && !redis.IsPermissionError(err) {
		return "", redisFailure("check", err)
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
func (r *Redis) eachMaster(ctx context.Context, fn func(context.Context, redis.Cmdable) error) error {
	if r.cluster == nil {
		return fn(ctx, r.c)
	}
	return r.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return fn(ctx, c) })
}

// redisEntry reads a script's entry reply: now, state, command id, command
// type, fingerprint, created, ends, status, header, body, truncated (all
// times in microseconds). Tenant and Key are left for the caller.
func redisEntry(v []any) (idemproxy.Entry, error) {
	var e idemproxy.Entry
	if len(v) != 11 {
		return e, fmt.Errorf("entry of %d fields, want 11", len(v))
	}
	str := func(i int) string { s, _ := v[i].(string); return s }
	now, _ := v[0].(int64)
	switch str(1) {
	case "l":
		e.State = idemproxy.StateInFlight
	case "r":
		e.State = idemproxy.StateSucceeded
	default:
		return e, fmt.Errorf("unknown state %q", str(1))
	}
	id, fp := str(2), str(4)
	if len(id) != len(e.CommandID) || len(fp) != len(e.Fingerprint) {
		return e, fmt.Errorf("command id of %d bytes and fingerprint of %d, want %d and %d", len(id), len(fp), len(e.CommandID), len(e.Fingerprint))
	}
	copy(e.CommandID[:], id)
	copy(e.Fingerprint[:], fp)
	e.CommandType = str(3)
	created, err1 := strconv.ParseInt(str(5), 10, 64)
	ends, err2 := strconv.ParseInt(str(6), 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return e, fmt.Errorf("times: %w", err)
	}
	e.CreatedAt, e.ExpiresAt = time.UnixMicro(created), time.UnixMicro(ends)
	e.Remaining = time.Duration(ends-now) * time.Microsecond
	if s := str(7); s != "" {
		status, err := strconv.Atoi(s)
		if err != nil {
			return e, fmt.Errorf("status: %w", err)
		}
		e.Status = status
	}
	if v[10] != nil {
		e.Response = &idemproxy.Response{Truncated: str(10) == "1"}
		if v[9] != nil {
			e.Response.Body = []byte(str(9))
		}
		if v[8] != nil {
			if err := json.Unmarshal([]byte(str(8)), &e.Response.Header); err != nil {
				return e, fmt.Errorf("decode response header: %w", err)
			}
		}
	}
	return e, nil
}

func redisMalformed(op string, v any) error {
	return fmt.Errorf("%w: redis %s: unexpected reply %T", idemproxy.ErrUnavailable, op, v)
}

// redisRefusal names the cause when Redis refused the client's
// credentials (WRONGPASS, NOAUTH) or permissions (NOPERM), which retrying
// will not cure, and is "" for any other error.
func redisRefusal(err error) string {
	switch {
	case redis.IsAuthError(err):
		return idemproxy.ReasonAuthentication
	case redis.IsPermissionError(err):
		return idemproxy.ReasonPermissionDenied
	default:
		return ""
	}
}

// redisFailure turns an error from the client into the store's. Refused
// credentials or permissions are an *idemproxy.MisconfiguredError; anything
// else means the store could not be used and satisfies
// errors.Is(err, idemproxy.ErrUnavailable) (so does a MisconfiguredError). The client's error is kept as
// text only, so that no go-redis type leaves the package; a context's
// deadline or cancellation stays matchable with errors.Is.
func redisFailure(op string, err error) error {
	if errors.Is(err, idemproxy.ErrUnavailable) {
		return fmt.Errorf("redis %s: %w", op, err)
	}
	if reason := redisRefusal(err); reason != "" {
		return idemproxy.Misconfigured(reason, fmt.Errorf("redis %s: %v (check the user and password in the URL and the user's ACL)", op, err))
	}
	for _, ce := range []error{context.DeadlineExceeded, context.Canceled} {
		if errors.Is(err, ce) {
			return fmt.Errorf("%w: redis %s: %w (%v)", idemproxy.ErrUnavailable, op, ce, err)
		}
	}
	var reply redis.Error
	if errors.As(err, &reply) && !redisTransient(err) {
		return &redisServerError{op: op, msg: reply.Error()}
	}
	return fmt.Errorf("%w: redis %s: %v", idemproxy.ErrUnavailable, op, err)
}

// redisTransient reports whether a server's error reply is one that passes
// by itself: loading, a read-only replica or a cluster in failover, too
// many clients, memory full (noeviction: keys expire and free it).
func redisTransient(err error) bool {
	return redis.IsLoadingError(err) || redis.IsReadOnlyError(err) || redis.IsClusterDownError(err) ||
		redis.IsTryAgainError(err) || redis.IsMasterDownError(err) || redis.IsMaxClientsError(err) ||
		redis.IsOOMError(err)
}

// redisServerError is an error reply of the server other than a refusal of
// credentials or a transient one — a script that an ACL stops, a key of
// another type. The request fails closed like with any
// unavailable store; at start, Check reports it as permanent.
type redisServerError struct{ op, msg string }

func (e *redisServerError) Error() string {
	return fmt.Sprintf("%v: redis %s: %s", idemproxy.ErrUnavailable, e.op, e.msg)
}

func (e *redisServerError) Unwrap() error { return idemproxy.ErrUnavailable }
