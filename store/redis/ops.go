package redis

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	goredis "github.com/redis/go-redis/v9"

	"github.com/idemproxy/idemproxy"
)

// Claim locks (tenant, key) unless a live lock or record is there, in which
// case it reports that entry. A lock whose lease ended or a record past its
// expiry is taken over, judged by Redis's clock. A server out of memory
// takes nothing: a claim that would lock the key, a free one or one whose
// lease ended, fails with ErrUnavailable; one that meets a live entry
// still reports it.
func (r *Store) Claim(ctx context.Context, c idemproxy.Claim) (idemproxy.ClaimResult, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	keys := r.scriptKeys(c.Tenant, c.Key)
	v, err := r.runKeys(ctx, claimScript, keys, true,
		c.Owner[:], c.CommandID[:], c.CommandType, c.Fingerprint[:], c.Lease.Microseconds(), r.graceUS, c.Key)
	if short := (*waitShortfall)(nil); errors.As(err, &short) {
		if reply, ok := v.([]any); ok && len(reply) > 0 && reply[0] == int64(1) {
			// Locked on the primary only: the claim fails and nothing is
			// forwarded, so drop the lock instead of leaving the key
			// locked, and a retry refused, until the lease ends.
			_, _ = r.runKeys(ctx, releaseScript, keys, false, c.Owner[:], c.Key)
		}
	}
	if goredis.IsOOMError(err) {
		return r.claimRefused(ctx, c, err)
	}
	if err != nil {
		return idemproxy.ClaimResult{}, failure("claim", err)
	}
	reply, ok := v.([]any)
	if !ok || len(reply) < 2 {
		return idemproxy.ClaimResult{}, malformed("claim", v)
	}
	if claimed, _ := reply[0].(int64); claimed == 1 {
		now, _ := reply[1].(int64)
		r.index(ctx, c.Tenant, c.Key, now, c.Lease.Microseconds()+r.graceUS)
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
	e, err := parseEntry(reply[1:])
	if err != nil {
		return idemproxy.ClaimResult{}, fmt.Errorf("%w: redis claim: %v", idemproxy.ErrUnavailable, err)
	}
	e.Tenant, e.Key = c.Tenant, c.Key
	return idemproxy.ClaimResult{Entry: e}, nil
}

// claimRefused answers a claim that a server out of memory refused before
// it ran. A live entry at the key is reported as the claim would have
// reported it (replays and in-progress answers go on), and this claim's
// own lock, which an earlier send of it took, as claimed; otherwise the
// claim fails with refused, whether the key was free or held by a lock
// whose lease ended.
func (r *Store) claimRefused(ctx context.Context, c idemproxy.Claim, refused error) (idemproxy.ClaimResult, error) {
	e, err := r.Lookup(ctx, c.Tenant, c.Key)
	switch {
	case err != nil:
		return idemproxy.ClaimResult{}, failure("claim", refused)
	case e.State == idemproxy.StateInFlight && e.CommandID == c.CommandID:
		return idemproxy.ClaimResult{Claimed: true, Entry: e}, nil
	default:
		return idemproxy.ClaimResult{Entry: e}, nil
	}
}

// Complete turns the caller's lock into a record that replays for c.TTL
// from now, by Redis's clock. It fails with idemproxy.ErrNotOwner if the
// lock is gone, already completed or held by another owner. A lock whose
// lease ended but that no one claimed since is still completed, for
// LockGrace after its lease.
func (r *Store) Complete(ctx context.Context, c idemproxy.Completion) error {
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
	ttl := max(c.TTL.Microseconds(), 1)
	v, err := r.runKeys(ctx, completeScript, r.scriptKeys(c.Tenant, c.Key), true,
		c.Owner[:], c.Status, ttl, responded, truncated, hasHeader, header, hasBody, body, c.Key)
	if err != nil {
		return failure("complete", err)
	}
	created, _ := v.(int64)
	if created == 0 {
		return idemproxy.ErrNotOwner
	}
	r.index(ctx, c.Tenant, c.Key, created, ttl)
	return nil
}

// Release drops the caller's lock. It fails with idemproxy.ErrNotOwner if
// the lock is gone, completed or held by another owner.
func (r *Store) Release(ctx context.Context, tenant uuid.UUID, key string, owner uuid.UUID) error {
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	v, err := r.runKeys(ctx, releaseScript, r.scriptKeys(tenant, key), false, owner[:], key)
	if err != nil {
		return failure("release", err)
	}
	created, ok := v.(string)
	if !ok {
		return idemproxy.ErrNotOwner
	}
	r.unindex(ctx, tenant, key, created)
	return nil
}

// Renew moves the end of the caller's lease to lease from now, by Redis's
// clock, and the key's TTL to lease + LockGrace, even after the lease
// ended if no one claimed the key since. It fails with
// idemproxy.ErrNotOwner if the lock is gone, completed or held by another
// owner. It waits for WaitReplicas as a claim does, so that a failover
// does not shorten the lease, and it runs at maxmemory, where a claim is
// refused: it grows nothing.
func (r *Store) Renew(ctx context.Context, tenant uuid.UUID, key string, owner uuid.UUID, lease time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	v, err := r.runKeys(ctx, renewScript, r.scriptKeys(tenant, key), true, owner[:], max(lease.Microseconds(), 1), r.graceUS)
	if err != nil {
		return failure("renew", err)
	}
	if n, _ := v.(int64); n != 1 {
		return idemproxy.ErrNotOwner
	}
	return nil
}

// Lookup returns the live lock or record for (tenant, key), or
// idemproxy.ErrNotFound.
func (r *Store) Lookup(ctx context.Context, tenant uuid.UUID, key string) (idemproxy.Entry, error) {
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	v, err := r.run(ctx, lookupScript, r.key(tenant, key), false)
	if errors.Is(err, goredis.Nil) {
		return idemproxy.Entry{}, idemproxy.ErrNotFound
	}
	if err != nil {
		return idemproxy.Entry{}, failure("lookup", err)
	}
	reply, ok := v.([]any)
	if !ok {
		return idemproxy.Entry{}, malformed("lookup", v)
	}
	e, err := parseEntry(reply)
	if err != nil {
		return idemproxy.Entry{}, fmt.Errorf("%w: redis lookup: %v", idemproxy.ErrUnavailable, err)
	}
	e.Tenant, e.Key = tenant, key
	return e, nil
}

// Delete removes the lock or record for (tenant, key), live or ended but
// not yet expired by Redis, or reports idemproxy.ErrNotFound.
func (r *Store) Delete(ctx context.Context, tenant uuid.UUID, key string) error {
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	v, err := r.runKeys(ctx, deleteScript, r.heldScriptKeys(tenant, key), false, key, heldMember(tenant, key))
	if err != nil {
		return failure("delete", err)
	}
	created, ok := v.(string)
	if !ok {
		return idemproxy.ErrNotFound
	}
	r.unindex(ctx, tenant, key, created)
	r.unindexHeld(ctx, tenant, key, created)
	return nil
}

// Hold turns the caller's lock into a held key that lives h.TTL from now,
// by Redis's clock, even after its lease ended if no one claimed the key
// since. It fails with idemproxy.ErrNotOwner if the lock is gone,
// completed or held by another owner. It waits for WaitReplicas as a
// completion does.
func (r *Store) Hold(ctx context.Context, h idemproxy.Holding) error {
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	ttl := max(h.TTL.Microseconds(), 1)
	v, err := r.runKeys(ctx, holdScript, r.heldScriptKeys(h.Tenant, h.Key), true, h.Owner[:], ttl, h.Key, heldMember(h.Tenant, h.Key))
	if err != nil {
		return failure("hold", err)
	}
	s, ok := v.(string)
	if !ok {
		return idemproxy.ErrNotOwner
	}
	if created, err := strconv.ParseInt(s, 10, 64); err == nil && r.cluster != nil {
		life := time.Now().UnixMicro() + ttl - created
		r.index(ctx, h.Tenant, h.Key, created, life)
		r.indexIn(ctx, r.heldKey(h.Tenant), h.Tenant, h.Key, created, life)
		r.indexIn(ctx, r.heldAllKey(), h.Tenant, heldMember(h.Tenant, h.Key), created, life)
	}
	return nil
}

// Resolve turns a held key into a record with r.Status that replays for
// r.TTL from now, by Redis's clock. It fails with idemproxy.ErrNotFound
// when no live entry is there, and with idemproxy.ErrNotHeld when the
// entry is not held or is another command's.
func (r *Store) Resolve(ctx context.Context, res idemproxy.Resolution) error {
	ctx, cancel := context.WithTimeout(ctx, r.opTimeout)
	defer cancel()
	var command []byte
	if res.CommandID != uuid.Nil {
		command = res.CommandID[:]
	}
	ttl := max(res.TTL.Microseconds(), 1)
	v, err := r.runKeys(ctx, resolveScript, r.heldScriptKeys(res.Tenant, res.Key), true,
		command, res.Status, ttl, res.Key, heldMember(res.Tenant, res.Key))
	if err != nil {
		return failure("resolve", err)
	}
	reply, ok := v.([]any)
	if !ok || len(reply) == 0 {
		return malformed("resolve", v)
	}
	switch n, _ := reply[0].(int64); {
	case n == 0:
		return idemproxy.ErrNotFound
	case n < 0:
		return idemproxy.ErrNotHeld
	case len(reply) != 3:
		return malformed("resolve", v)
	}
	created, _ := reply[1].(int64)
	held, _ := reply[2].(string)
	r.index(ctx, res.Tenant, res.Key, created, ttl)
	r.unindexHeld(ctx, res.Tenant, res.Key, held)
	return nil
}

// index puts key in tenant's index at created, on a cluster; on a single
// server the script that changed the entry did. A failure is logged and
// leaves the key out of the index, or at an older time: a new lock is then
// missing from admin listings until its completion indexes it, and an
// entry completed or claimed again until the first listing that meets it
// at its older time moves it.
func (r *Store) index(ctx context.Context, tenant uuid.UUID, key string, created, life int64) {
	r.indexIn(ctx, r.indexKey(tenant), tenant, key, created, life)
}

// indexIn is index into idx of member: key in the tenant's index or its
// held keys, heldMember(tenant, key) in the held keys of every tenant.
func (r *Store) indexIn(ctx context.Context, idx string, tenant uuid.UUID, member string, created, life int64) {
	if r.cluster == nil || member == "" {
		return
	}
	if _, err := r.run(ctx, indexScript, idx, false, member, created, life); err != nil {
		r.log.WarnContext(ctx, "redis: an admin listing's index was not updated; listings may miss the key for a while",
			"tenant", tenant, "member", member, "index", idx, "error", err)
	}
}

// unindexHeld drops key from tenant's held keys, and from the held keys
// of every tenant, if they still have it at created, on a cluster, as
// unindex does from its index.
func (r *Store) unindexHeld(ctx context.Context, tenant uuid.UUID, key, created string) {
	if r.cluster == nil || key == "" {
		return
	}
	_, _ = r.run(ctx, reindexScript, r.heldKey(tenant), false, key, created, "")
	_, _ = r.run(ctx, reindexScript, r.heldAllKey(), false, heldMember(tenant, key), created, "")
}

// unindex drops key from tenant's index if the index still has it at
// created (a string of µs), on a cluster; on a single server the script
// that dropped the entry did. A failure leaves a key that List drops when
// it meets it.
func (r *Store) unindex(ctx context.Context, tenant uuid.UUID, key, created string) {
	if r.cluster == nil || key == "" {
		return
	}
	_, _ = r.run(ctx, reindexScript, r.indexKey(tenant), false, key, created, "")
}

// parseEntry reads a script's entry reply: now, state, command id, command
// type, fingerprint, created, ends, status, header, body, truncated (all
// times in microseconds). Tenant and Key are left for the caller.
func parseEntry(v []any) (idemproxy.Entry, error) {
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
	case "u":
		e.State = idemproxy.StateUnknown
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
