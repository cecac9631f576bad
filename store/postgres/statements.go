package postgres

// entryColumns are the columns scanEntry reads, in order: entryHead, then
// the stored response. An entry ends at its lease's end while it is a lock
// and at expires_at once it is a record; Remaining is measured by the
// database's clock.
const (
	entryHead = `state, command_id, command_type, fingerprint, created_at,
	COALESCE(lease_expires_at, expires_at) AS ends_at,
	(extract(epoch FROM COALESCE(lease_expires_at, expires_at) - clock_timestamp()) * 1000000)::bigint AS remaining_us,
	COALESCE(status, 0) AS status`
	entryColumns = entryHead + `, resp_headers, resp_body, resp_truncated`
)

// claimTakeover makes an INSERT INTO idempotency_keys AS k a claim: a
// row whose lease or record has ended is taken over, a live one is left
// as it is (and not returned).
const claimTakeover = takeoverSet + `
	WHERE COALESCE(k.lease_expires_at, k.expires_at) <= now()`

// takeoverSet is what a claim writes over a row it takes over.
const takeoverSet = `ON CONFLICT (tenant_id, key) DO UPDATE SET
		command_id = excluded.command_id,
		command_type = excluded.command_type,
		state = excluded.state,
		owner_token = excluded.owner_token,
		fingerprint = excluded.fingerprint,
		created_at = excluded.created_at,
		lease_expires_at = excluded.lease_expires_at,
		expires_at = excluded.expires_at,
		status = NULL,
		resp_headers = NULL,
		resp_body = NULL,
		resp_truncated = NULL`

// claimSQL is the statement of Store.Claim: it inserts a lock, or
// takes over a row whose lease or record has ended, and returns it with
// claimed true; when the row is live it returns it unchanged with claimed
// false. Its parameters: $1 tenant, $2 key, $3 command id, $4 command
// type, $5 owner, $6 fingerprint, $7 lease and $8 lock grace (both in
// microseconds). Under READ COMMITTED the second SELECT reads the
// statement's snapshot, which may miss a row committed concurrently (or
// show its older, ended version): the statement then returns no row and
// Claim runs it again. cmd/idembench's pgbench script runs it without the
// store (TestPgbenchScriptMatchesStore keeps the two equal).
const claimSQL = `WITH ins AS (
	INSERT INTO idempotency_keys AS k
		(tenant_id, key, command_id, command_type, state, owner_token, fingerprint,
		 created_at, lease_expires_at, expires_at)
	VALUES ($1, $2, $3, $4, 'in_flight', $5, $6,
		now(), now() + $7::bigint * interval '1 microsecond',
		now() + ($7::bigint + $8::bigint) * interval '1 microsecond')
	` + claimTakeover + `
	RETURNING ` + entryColumns + `
)
SELECT true, * FROM ins
UNION ALL
SELECT false, ` + entryColumns + `
FROM idempotency_keys
WHERE tenant_id = $1 AND key = $2
	AND COALESCE(lease_expires_at, expires_at) > now()
	AND NOT EXISTS (SELECT 1 FROM ins)`

// completeSQL is the statement of Store.Complete: it turns the lock
// held by the owner into a record, or changes no row. Its parameters: $1
// tenant, $2 key, $3 owner, $4 status, $5 response header (JSON), $6
// response body, $7 response truncated (all three NULL without a stored
// response) and $8 TTL in microseconds; the pgbench script runs it too.
// The record's life counts from this statement
// (statement_timestamp), not from its transaction's start (now()): in a
// command's transaction it is the last statement before the commit, so a
// long transaction does not shorten its record's life.
const completeSQL = `UPDATE idempotency_keys SET
	state = 'succeeded',
	status = $4,
	resp_headers = $5,
	resp_body = $6,
	resp_truncated = $7,
	created_at = statement_timestamp(),
	lease_expires_at = NULL,
	expires_at = statement_timestamp() + $8::bigint * interval '1 microsecond'
WHERE tenant_id = $1 AND key = $2 AND owner_token = $3 AND state = 'in_flight'`

const releaseSQL = `DELETE FROM idempotency_keys
WHERE tenant_id = $1 AND key = $2 AND owner_token = $3 AND state = 'in_flight'`

// renewSQL is the statement of Postgres.Renew: it moves the end of the
// lease of the lock held by the owner, and the row's purge time with it,
// or changes no row. Its parameters: $1 tenant, $2 key, $3 owner, $4
// lease and $5 lock grace (both in microseconds).
const renewSQL = `UPDATE idempotency_keys SET
	lease_expires_at = now() + $4::bigint * interval '1 microsecond',
	expires_at = now() + ($4::bigint + $5::bigint) * interval '1 microsecond'
WHERE tenant_id = $1 AND key = $2 AND owner_token = $3 AND state = 'in_flight'`

// holdSQL is the statement of Postgres.Hold: it turns the lock held by
// the owner into a held key, owned by nobody (the nil UUID), that lives
// until its expiry; or it changes no row. Its parameters: $1 tenant, $2
// key, $3 owner and $4 TTL in microseconds.
const holdSQL = `UPDATE idempotency_keys SET
	state = 'unknown',
	owner_token = '00000000-0000-0000-0000-000000000000',
	lease_expires_at = NULL,
	expires_at = now() + $4::bigint * interval '1 microsecond'
WHERE tenant_id = $1 AND key = $2 AND owner_token = $3 AND state = 'in_flight'`

// resolveSQL is the statement of Postgres.Resolve: it turns a live held
// key into a record with a status and no stored response, or changes no
// row. Its parameters: $1 tenant, $2 key, $3 the held command's id (NULL:
// any), $4 status and $5 TTL in microseconds.
const resolveSQL = `UPDATE idempotency_keys SET
	state = 'succeeded',
	status = $4,
	created_at = now(),
	expires_at = now() + $5::bigint * interval '1 microsecond'
WHERE tenant_id = $1 AND key = $2 AND state = 'unknown' AND expires_at > now()
	AND ($3::uuid IS NULL OR command_id = $3::uuid)`

const lookupSQL = `SELECT ` + entryColumns + `
FROM idempotency_keys
WHERE tenant_id = $1 AND key = $2 AND COALESCE(lease_expires_at, expires_at) > now()`

const deleteSQL = `DELETE FROM idempotency_keys WHERE tenant_id = $1 AND key = $2`

// purgeSQL is the one statement not filtered on tenant_id: it sweeps the
// whole table, a bounded batch at a time, skipping rows that another
// replica's purge (or a claim) holds.
const purgeSQL = `DELETE FROM idempotency_keys AS k
USING (
	SELECT tenant_id, key FROM idempotency_keys
	WHERE expires_at <= now()
	LIMIT $1
	FOR UPDATE SKIP LOCKED
) AS d
WHERE k.tenant_id = d.tenant_id AND k.key = d.key AND k.expires_at <= now()`

// entryNames are the names of entryColumns' output columns, in order.
const entryNames = `state, command_id, command_type, fingerprint, created_at, ends_at,
	remaining_us, status, resp_headers, resp_body, resp_truncated`

// claimBatchSQL is claimSQL for many keys of one tenant (group commit):
// $1 is the tenant, $2…$7 arrays with one element per claim (key, command
// id, command type, owner, fingerprint, lease in microseconds), $8 the
// lock grace; the batched pgbench script runs it too.
const claimBatchSQL = `WITH input AS MATERIALIZED (
	SELECT * FROM unnest($2::text[], $3::uuid[], $4::text[], $5::uuid[], $6::bytea[], $7::bigint[])
		WITH ORDINALITY AS i(in_key, in_command_id, in_command_type, in_owner, in_fingerprint, in_lease_us, ord)
), ins AS (
	INSERT INTO idempotency_keys AS k
		(tenant_id, key, command_id, command_type, state, owner_token, fingerprint,
		 created_at, lease_expires_at, expires_at)
	SELECT $1::uuid, in_key, in_command_id, in_command_type, 'in_flight', in_owner, in_fingerprint,
		now(), now() + in_lease_us * interval '1 microsecond',
		now() + (in_lease_us + $8::bigint) * interval '1 microsecond'
	FROM input
	ORDER BY ord
	` + claimTakeover + `
	RETURNING key, ` + entryColumns + `
)
SELECT i.ord, true, ` + entryNames + `
FROM ins JOIN input i ON i.in_key = ins.key
UNION ALL
SELECT i.ord, false, ` + entryColumns + `
FROM input i JOIN idempotency_keys k ON k.tenant_id = $1::uuid AND k.key = i.in_key
WHERE COALESCE(k.lease_expires_at, k.expires_at) > now()
	AND NOT EXISTS (SELECT 1 FROM ins WHERE ins.key = i.in_key)`

// completeBatchSQL is completeSQL for many keys of one tenant (group
// commit): $1 is the tenant, $2…$8 arrays with one element per completion
// (key, owner, status, resp_headers as JSON text, body, truncated, TTL in
// microseconds); the batched pgbench script runs it too. The rows are locked in
// array order first: an UPDATE … FROM would touch them in whatever order
// its join plan yields. The expiry is computed in the input, not in SET:
// Citus refuses a STABLE function applied to a column in an UPDATE.
const completeBatchSQL = `WITH input AS MATERIALIZED (
	SELECT *, statement_timestamp() + in_ttl_us * interval '1 microsecond' AS in_expires_at
	FROM unnest($2::text[], $3::uuid[], $4::int[], $5::text[], $6::bytea[], $7::bool[], $8::bigint[])
		WITH ORDINALITY AS i(in_key, in_owner, in_status, in_headers, in_body, in_truncated, in_ttl_us, ord)
), locked AS MATERIALIZED (
	SELECT i.* FROM input i JOIN idempotency_keys k ON k.tenant_id = $1::uuid AND k.key = i.in_key
	WHERE k.owner_token = i.in_owner AND k.state = 'in_flight'
	ORDER BY i.ord
	FOR UPDATE OF k
)
UPDATE idempotency_keys SET
	state = 'succeeded',
	status = l.in_status,
	resp_headers = l.in_headers::jsonb,
	resp_body = l.in_body,
	resp_truncated = l.in_truncated,
	created_at = statement_timestamp(),
	lease_expires_at = NULL,
	expires_at = l.in_expires_at
FROM locked l
WHERE tenant_id = $1::uuid AND key = l.in_key AND owner_token = l.in_owner AND state = 'in_flight'
RETURNING l.ord`

// releaseBatchSQL is releaseSQL for many keys of one tenant ($1; $2 and
// $3 the arrays of keys and owners), locking in array order as
// completeBatchSQL does.
const releaseBatchSQL = `WITH input AS MATERIALIZED (
	SELECT * FROM unnest($2::text[], $3::uuid[])
		WITH ORDINALITY AS i(in_key, in_owner, ord)
), locked AS MATERIALIZED (
	SELECT i.* FROM input i JOIN idempotency_keys k ON k.tenant_id = $1::uuid AND k.key = i.in_key
	WHERE k.owner_token = i.in_owner AND k.state = 'in_flight'
	ORDER BY i.ord
	FOR UPDATE OF k
)
DELETE FROM idempotency_keys USING locked l
WHERE tenant_id = $1::uuid AND key = l.in_key AND owner_token = l.in_owner AND state = 'in_flight'
RETURNING l.ord`

// listSQL reads a page of a tenant's live entries after the cursor
// ($2, $3), newest first, without the stored responses. It is served by
// idempotency_keys_tenant_created_idx (migration 00002), read backwards.
// Keys are compared in byte order (COLLATE "C"), whatever the database's
// collation, as every store orders them.
const listSQL = `SELECT key, ` + entryHead + `, NULL::jsonb, NULL::bytea, NULL::boolean
FROM idempotency_keys
WHERE tenant_id = $1
	AND (created_at, key COLLATE "C") < ($2::timestamptz, $3::text COLLATE "C")
	AND COALESCE(lease_expires_at, expires_at) > now()
ORDER BY created_at DESC, key COLLATE "C" DESC
LIMIT $4`

// listHeldSQL is listSQL for the held keys alone, served by the partial
// index idempotency_keys_held_idx (migration 00004): a page costs the
// page, however many records the tenant has.
const listHeldSQL = `SELECT key, ` + entryHead + `, NULL::jsonb, NULL::bytea, NULL::boolean
FROM idempotency_keys
WHERE tenant_id = $1 AND state = 'unknown'
	AND (created_at, key COLLATE "C") < ($2::timestamptz, $3::text COLLATE "C")
	AND expires_at > now()
ORDER BY created_at DESC, key COLLATE "C" DESC
LIMIT $4`

// listHeldAllSQL reads a page of the live held keys of every tenant after
// the cursor ($1 created_at, $2 tenant, $3 key), newest first, without
// stored responses: the on-call page's listing. It is the one request-free
// statement besides the purge that spans tenants, served by the partial
// index idempotency_keys_held_created_idx (migration 00005), read
// backwards, so a page costs the page however many records the table
// holds. On a table partitioned by tenant it reads each partition's index
// in order and merges them (MergeAppend); on Citus each shard returns at
// most a page, which the coordinator merges.
const listHeldAllSQL = `SELECT tenant_id, key, ` + entryHead + `, NULL::jsonb, NULL::bytea, NULL::boolean
FROM idempotency_keys
WHERE state = 'unknown'
	AND (created_at, tenant_id, key COLLATE "C") < ($1::timestamptz, $2::uuid, $3::text COLLATE "C")
	AND expires_at > now()
ORDER BY created_at DESC, tenant_id DESC, key COLLATE "C" DESC
LIMIT $4`
