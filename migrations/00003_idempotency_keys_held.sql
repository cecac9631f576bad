-- Held keys: a row in state unknown is a command that was sent and whose
-- outcome can no longer be learnt (the upstream's connection broke off,
-- no answer came in time). It keeps the lock's command, fingerprint and
-- created_at (the time of the attempt), has no lease and no status, and
-- is never taken over: a retry meets it until expires_at, or until an
-- operator frees it or records it as succeeded. Its owner_token is the
-- nil UUID: nobody owns it.
--
-- The state constraint gains the third state. It is added NOT VALID (a
-- brief lock, no scan): every row already there satisfies it, since it
-- only admits more; migration 00004 validates it without blocking writes.

-- +goose Up
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_state;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_state CHECK (
    (state = 'in_flight'
        AND lease_expires_at IS NOT NULL
        AND expires_at >= lease_expires_at
        AND status IS NULL
        AND resp_truncated IS NULL)
    OR
    (state = 'succeeded'
        AND lease_expires_at IS NULL
        AND status BETWEEN 100 AND 599)
    OR
    (state = 'unknown'
        AND lease_expires_at IS NULL
        AND status IS NULL
        AND resp_truncated IS NULL)
) NOT VALID;

-- +goose Down
-- Held keys are let go: the state they are in does not exist below.
DELETE FROM idempotency_keys WHERE state = 'unknown';
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_state;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_state CHECK (
    (state = 'in_flight'
        AND lease_expires_at IS NOT NULL
        AND expires_at >= lease_expires_at
        AND status IS NULL
        AND resp_truncated IS NULL)
    OR
    (state = 'succeeded'
        AND lease_expires_at IS NULL
        AND status BETWEEN 100 AND 599)
);
