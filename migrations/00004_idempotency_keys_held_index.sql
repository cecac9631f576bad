-- The admin API lists a tenant's held keys (state unknown) newest first, a
-- page at a time, as it lists all its keys (migration 00002). Held keys
-- are few among many records, so they get a partial index of their own:
-- a page of them costs the page, however many records the tenant has.
--
-- Built CONCURRENTLY, as 00002's index is, so claims and completions keep
-- running while a large table is scanned; the DROP makes an interrupted
-- build start afresh. The state constraint of 00003 is validated here
-- too, outside a transaction, which takes no lock that blocks writes.

-- +goose NO TRANSACTION

-- +goose Up
ALTER TABLE idempotency_keys VALIDATE CONSTRAINT idempotency_keys_state;
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_held_idx;
CREATE INDEX CONCURRENTLY idempotency_keys_held_idx
    ON idempotency_keys (tenant_id, created_at, key COLLATE "C")
    WHERE state = 'unknown';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS idempotency_keys_held_idx;
