-- The idempotency store: one row per (tenant, key). While its command is in
-- flight the row is a lock (state in_flight, owner_token, lease_expires_at);
-- once the upstream answered 2xx it is a record (state succeeded, status,
-- the response in replay mode).
--
-- expires_at is when the row may be purged. For a record it is also when
-- the record stops replaying (created_at + IDEMPROXY_KEY_TTL). For a lock it
-- is lease_expires_at plus a grace period: a lock whose lease ended counts as
-- absent for claims and lookups at once, but is kept a while so that a late
-- completion from its owner still lands if no one has claimed the key since.

-- +goose Up
CREATE TABLE idempotency_keys (
    tenant_id        uuid        NOT NULL,
    key              text        NOT NULL,
    command_id       uuid        NOT NULL,
    command_type     text        NOT NULL,
    state            text        NOT NULL,
    owner_token      uuid        NOT NULL,
    fingerprint      bytea       NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    lease_expires_at timestamptz,
    expires_at       timestamptz NOT NULL,
    status           integer,
    resp_headers     jsonb,
    resp_body        bytea,
    resp_truncated   boolean,
    PRIMARY KEY (tenant_id, key),
    CONSTRAINT idempotency_keys_key_length CHECK (octet_length(key) BETWEEN 1 AND 255),
    CONSTRAINT idempotency_keys_fingerprint_length CHECK (octet_length(fingerprint) = 32),
    CONSTRAINT idempotency_keys_state CHECK (
        (state = 'in_flight'
            AND lease_expires_at IS NOT NULL
            AND expires_at >= lease_expires_at
            AND status IS NULL
            AND resp_truncated IS NULL)
        OR
        (state = 'succeeded'
            AND lease_expires_at IS NULL
            AND status BETWEEN 100 AND 599)
    ),
    -- A stored response is present exactly when resp_truncated is set.
    CONSTRAINT idempotency_keys_response CHECK (
        resp_truncated IS NOT NULL OR (resp_headers IS NULL AND resp_body IS NULL)
    )
);

-- The purge deletes rows past expires_at in batches.
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);

-- +goose Down
DROP TABLE idempotency_keys;
