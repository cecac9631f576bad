// Package redis is the idempotency store for replicas that share a Redis
// server or a Redis Cluster (go-redis v9): one Lua script per operation on
// Redis's clock, key TTLs doing the purge. No go-redis type leaves the
// package: failures come back as the idemproxy sentinels.
package redis

import (
	_ "embed"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/configerr"
)

// Options configures New. URL is required; every other zero
// value is replaced by the default its comment gives.
type Options struct {
	// URL is a redis:// or rediss:// URL with optional user, password and
	// database (go-redis's ParseURL form). With Cluster it is read as a
	// cluster URL (ParseClusterURL): more seed nodes as addr= parameters,
	// no database.
	URL string
	// Cluster makes the store a Redis Cluster client.
	Cluster bool
	// Prefix begins every key the store writes. It may not contain '{',
	// '}' or a glob character (*?[]\). Empty means DefaultPrefix.
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
	// as warnings, and the index updates of a cluster that failed (the
	// entry then missing from admin listings). go-redis keeps one logger
	// per process, so the last store opened with a Logger sets it; nil
	// leaves go-redis's (standard error) and drops the store's own.
	Logger *slog.Logger
	// WaitReplicas, when positive, makes every claim, renewal and
	// completion wait (Redis WAIT, on the same connection) until that many
	// replicas have acknowledged it; a write acknowledged by fewer fails
	// with idemproxy.ErrUnavailable. Zero waits for none.
	WaitReplicas int
}

// Store is the store for replicas that share a Redis server or a Redis
// Cluster. Each operation is one server-side Lua script on the entry's
// key (and on a single server its tenant's index), atomic on the server;
// leases and expiry are judged by Redis's clock (TIME), and every key
// carries a TTL (lease + LockGrace for a lock, the record's TTL for a
// record), so Redis's own expiry purges them. It is safe for concurrent
// use.
//
// The key of (tenant, key) is Prefix + the tenant's UUID + ':' + the key
// with '%', '{' and '}' percent-encoded. The tenant's UUID has a fixed
// length, so no two (tenant, key) pairs share a Redis key; the encoded key
// has no '{', so no client-chosen key can pick a Cluster hash tag, and the
// keys of every tenant spread over all the Cluster's slots.
//
// Each tenant also has an index for the admin listing: a sorted set of its
// keys scored by their created time, Prefix + '{' + tenant + "}:index",
// and one of its held keys alone, Prefix + '{' + tenant + "}:held",
// which cannot meet an entry's key (whose tenant part begins with a hex
// digit); the held keys of every tenant have one more, Prefix +
// "{held}:all", for the on-call page's listing across tenants. Its member "" records the longest life of an entry indexed
// there, by which claims trim the keys of ended entries, and the index
// expires after its newest entry; so the store indexes no empty key. On a
// single server the scripts keep the index in the same atomic step as the
// entry. On a cluster the entry and the index are in different slots, so
// the store updates the index with a second script once the entry's has
// answered (one more round trip for a claim that locks, a completion, a
// release and a delete); List checks every key it takes from the index
// against its entry, drops the keys of ended entries and moves those the
// index has at another time.
type Store struct {
	c            goredis.UniversalClient
	pipeline     *goredis.AutoPipeliner // nil unless AutoPipeline
	cluster      *goredis.ClusterClient // nil for a single server
	prefix       string
	opTimeout    time.Duration
	graceUS      int64
	waitReplicas int
	log          *slog.Logger // for the index updates of a cluster that failed
}

// DefaultPrefix begins the store's keys when Options.Prefix is
// empty.
const DefaultPrefix = "idemproxy:"

// The scripts. Times are microseconds of Redis's clock, formatted with
// %d (Lua numbers are doubles: exact to 2^53 µs, about 285 years). Each
// declares its flags (Redis 7): those without allow-oom or no-writes are
// refused as a whole by a server out of memory.
var (
	//go:embed claim.lua
	claimLua    string
	claimScript = newLuaScript(withIndexFn(claimLua))
	//go:embed complete.lua
	completeLua    string
	completeScript = newLuaScript(withIndexFn(completeLua))
	//go:embed release.lua
	releaseLua    string
	releaseScript = newLuaScript(releaseLua)
	//go:embed lookup.lua
	lookupLua    string
	lookupScript = newLuaScript(lookupLua)
	//go:embed renew.lua
	renewLua    string
	renewScript = newLuaScript(renewLua)
	//go:embed hold.lua
	holdLua    string
	holdScript = newLuaScript(withIndexFn(holdLua))
)

// The scripts of the admin API, of the index and of Ping.
var (
	//go:embed delete.lua
	deleteLua    string
	deleteScript = newLuaScript(deleteLua)
	//go:embed resolve.lua
	resolveLua    string
	resolveScript = newLuaScript(withIndexFn(resolveLua))
	//go:embed index.lua
	indexLua    string
	indexScript = newLuaScript(withIndexFn(indexLua))
	//go:embed reindex.lua
	reindexLua    string
	reindexScript = newLuaScript(reindexLua)
	//go:embed ping.lua
	pingLua    string
	pingScript = newLuaScript(pingLua)
)

//go:embed indexfn.lua
var indexFnLua string

// withIndexFn is src with indexfn.lua's function put after its first
// line: a script's first line declares its flags (#!lua flags=…), and
// must stay first.
func withIndexFn(src string) string {
	first, rest, _ := strings.Cut(src, "\n")
	return first + "\n" + indexFnLua + rest
}

// luaScript is a script and its source, which the autopipelined path sends
// itself when the server does not have the script cached.
type luaScript struct {
	*goredis.Script
	src string
}

func newLuaScript(src string) luaScript { return luaScript{goredis.NewScript(src), src} }

// New returns a store on the server or cluster at opts.URL. It does
// not connect: a Redis that is down at start makes operations fail with
// idemproxy.ErrUnavailable until it comes back, and New fails only on
// a bad URL or option. Call Check before serving, and Close to release
// the connections.
func New(opts Options) (*Store, error) {
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
		opts.Prefix = DefaultPrefix
	}
	r := &Store{
		prefix:       opts.Prefix,
		opTimeout:    opts.OpTimeout,
		graceUS:      opts.LockGrace.Microseconds(),
		waitReplicas: opts.WaitReplicas,
		log:          slog.New(slog.DiscardHandler),
	}
	if opts.Logger != nil {
		goredis.SetLogger(logAdapter{opts.Logger})
		r.log = opts.Logger
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
		co, err := goredis.ParseClusterURL(opts.URL)
		if err != nil {
			return nil, fmt.Errorf("store: redis cluster url: %w", redactURLError(err))
		}
		tune(&co.ContextTimeoutEnabled, &co.DialTimeout, &co.ReadTimeout, &co.WriteTimeout, &co.PoolTimeout, &co.MaxRetries, &co.PoolSize)
		r.cluster = goredis.NewClusterClient(co)
		r.c = r.cluster
	} else {
		o, err := goredis.ParseURL(opts.URL)
		if err != nil {
			return nil, fmt.Errorf("store: redis url: %w", redactURLError(err))
		}
		tune(&o.ContextTimeoutEnabled, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout, &o.MaxRetries, &o.PoolSize)
		r.c = goredis.NewClient(o)
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

// Validate reports every setting of o that New refuses, as
// *idemproxy.ConfigError values joined in one error; it connects to
// nothing. An error never echoes the URL, which may carry a password.
func (o Options) Validate() error {
	errs := configerr.Errors{Struct: "redis.Options"}
	var err error
	switch {
	case o.URL == "":
		errs.Add("URL", "is required")
	case o.Cluster:
		_, err = goredis.ParseClusterURL(o.URL)
	default:
		_, err = goredis.ParseURL(o.URL)
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

// Capabilities reports a store shared by replicas over the network.
func (r *Store) Capabilities() idemproxy.Capabilities { return idemproxy.Capabilities{Shared: true} }

// Close closes every connection. The store is unusable afterwards.
func (r *Store) Close() error {
	if r.pipeline != nil {
		r.pipeline.Close()
	}
	return r.c.Close()
}

// key is the Redis key of (tenant, key); see Store.
func (r *Store) key(tenant uuid.UUID, key string) string {
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

// indexKey returns the key of tenant's index; see Store.
func (r *Store) indexKey(tenant uuid.UUID) string {
	return r.prefix + "{" + tenant.String() + "}:index"
}

// heldKey is tenant's index of held keys: a sorted set like its index
// (indexKey), of the held keys alone, in the same slot.
func (r *Store) heldKey(tenant uuid.UUID) string {
	return r.prefix + "{" + tenant.String() + "}:held"
}

// heldAllKey is the index of the held keys of every tenant: a sorted set
// of members heldMember(tenant, key) scored by their created time (µs),
// in a slot of its own ("{held}", which no tenant's index or entry key
// can name). Members of one score come in the byte order of tenant, then
// key, as the listing wants: the tenant's canonical form has a fixed
// length and sorts as its bytes do.
func (r *Store) heldAllKey() string { return r.prefix + "{held}:all" }

// heldMember is (tenant, key)'s member in heldAllKey: the tenant's
// canonical form, ':' and the key.
func heldMember(tenant uuid.UUID, key string) string {
	var t [36]byte
	hexUUID(t[:], tenant)
	return string(t[:]) + ":" + key
}

// parseHeldMember reverses heldMember.
func parseHeldMember(m string) (uuid.UUID, string, bool) {
	if len(m) < 38 || m[36] != ':' {
		return uuid.Nil, "", false
	}
	tenant, err := uuid.Parse(m[:36])
	return tenant, m[37:], err == nil
}

// heldScriptKeys returns the KEYS of a script that may change whether
// (tenant, key) is held: scriptKeys' and, on a single server, the
// tenant's held keys and the held keys of every tenant.
func (r *Store) heldScriptKeys(tenant uuid.UUID, key string) []string {
	keys := r.scriptKeys(tenant, key)
	if len(keys) == 2 {
		keys = append(keys, r.heldKey(tenant), r.heldAllKey())
	}
	return keys
}

// scriptKeys returns the KEYS of a script on (tenant, key): the entry's
// key, and on a single server the tenant's index, which the script keeps
// in step with the entry (unless key is empty: see Store).
func (r *Store) scriptKeys(tenant uuid.UUID, key string) []string {
	if r.cluster != nil || key == "" {
		return []string{r.key(tenant, key)}
	}
	return []string{r.key(tenant, key), r.indexKey(tenant)}
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
