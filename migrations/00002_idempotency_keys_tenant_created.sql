-- The admin API lists a tenant's keys newest first, a page at a time
-- (keyset pagination on created_at, then key in byte order). This index
-- serves that listing, read backwards, without sorting the tenant's rows.
--
-- It is built CONCURRENTLY, so that claims and completions keep running
-- while it is built on a large table, which cannot happen inside a
-- transaction. A build that was interrupted leaves an INVALID index of
-- this name and the migration unrecorded; the DROP makes the next run
-- build it afresh.

-- +goose NO TRANSACTION

-- +goose Up
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_tenant_created_idx;
CREATE INDEX CONCURRENTLY idempotency_keys_tenant_created_idx
    ON idempotency_keys (tenant_id, created_at, key COLLATE "C");

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_tenant_created_idx;
