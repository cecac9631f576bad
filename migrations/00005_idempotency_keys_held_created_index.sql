-- The on-call page lists the held keys (state unknown) of every tenant
-- newest first, a page at a time (keyset pagination on created_at, then
-- tenant_id and key in byte order). Migration 00004's index leads with
-- tenant_id, so it serves one tenant's; this one, partial like it, serves
-- the listing across tenants, read backwards: a page costs the page,
-- however many records the table holds.
--
-- Built CONCURRENTLY, as 00002's and 00004's indexes are, so claims and
-- completions keep running while a large table is scanned; the DROP makes
-- an interrupted build start afresh.

-- +goose NO TRANSACTION

-- +goose Up
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_held_created_idx;
CREATE INDEX CONCURRENTLY idempotency_keys_held_created_idx
    ON idempotency_keys (created_at, tenant_id, key COLLATE "C")
    WHERE state = 'unknown';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_held_created_idx;
