-- Moves an existing, unpartitioned idempotency_keys table to one
-- PARTITION BY HASH (tenant_id), as IDEMPROXY_DB_PARTITIONS would have
-- created it (docs/scaling-postgres.md, "Partitioned by tenant"). Run it with psql, in the schema the
-- sidecars use, with the number of partitions:
--
--   psql "$DATABASE_URL" -v partitions=16 -f scripts/partition-existing.sql
--
-- It runs in one transaction that holds the table exclusively: keyed
-- requests wait meanwhile, and get 503 (fail closed, nothing forwarded)
-- once IDEMPROXY_STORE_TIMEOUT passes, so run it at a quiet time; it
-- takes about as long as copying the table's live rows. Rows that have
-- already expired are not copied. If anything fails, nothing changes; if
-- the table's lock cannot be had within 5 s (a long transaction holds
-- it), it stops with "lock timeout": run it again later. Run it as the
-- table's owner or a superuser: the new table gets the old one's owner
-- and grants, so the sidecars' role keeps its rights. The sidecars need
-- no restart: their statements name the table, not its storage.
-- migrations/partitions_test.go runs this script.

\set ON_ERROR_STOP on

-- What is wrong is said before anything is changed.
\if :{?partitions}
\else
  DO $$ BEGIN RAISE EXCEPTION 'give the number of partitions: psql -v partitions=N -f scripts/partition-existing.sql (N from 1 to 1024)'; END $$;
\endif
SELECT :'partitions' ~ '^[0-9]{1,4}$' AS partitions_ok \gset
\if :partitions_ok
  SELECT :'partitions'::int BETWEEN 1 AND 1024 AS partitions_ok \gset
\endif
\if :partitions_ok
\else
  DO $$ BEGIN RAISE EXCEPTION 'partitions must be between 1 and 1024 (psql -v partitions=N)'; END $$;
\endif
SELECT to_regclass('idempotency_keys') IS NOT NULL AS table_ok \gset
\if :table_ok
\else
  DO $$ BEGIN RAISE EXCEPTION 'no idempotency_keys table in the search path: run it with the search_path the sidecars use (PGOPTIONS=''-c search_path=...'')'; END $$;
\endif
SELECT relkind = 'p' AS already_partitioned FROM pg_class WHERE oid = 'idempotency_keys'::regclass \gset
\if :already_partitioned
  DO $$ BEGIN RAISE EXCEPTION 'idempotency_keys is already partitioned: nothing to do'; END $$;
\endif

BEGIN;

SET LOCAL lock_timeout = '5s';
LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE;

-- The old table steps aside with its indexes, so the new one can take
-- their names.
ALTER TABLE idempotency_keys RENAME TO idempotency_keys_unpartitioned;
ALTER INDEX idempotency_keys_pkey RENAME TO idempotency_keys_unpartitioned_pkey;
ALTER INDEX idempotency_keys_expires_at_idx RENAME TO idempotency_keys_unpartitioned_expires_at_idx;
ALTER INDEX idempotency_keys_tenant_created_idx RENAME TO idempotency_keys_unpartitioned_tenant_created_idx;
ALTER INDEX idempotency_keys_held_idx RENAME TO idempotency_keys_unpartitioned_held_idx;
ALTER INDEX idempotency_keys_held_created_idx RENAME TO idempotency_keys_unpartitioned_held_created_idx;

-- The same columns, defaults and CHECK constraints, and the indexes
-- migrations 00001, 00002, 00004 and 00005 create.
CREATE TABLE idempotency_keys (
    LIKE idempotency_keys_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
    PRIMARY KEY (tenant_id, key)
) PARTITION BY HASH (tenant_id);
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
CREATE INDEX idempotency_keys_tenant_created_idx ON idempotency_keys (tenant_id, created_at, key COLLATE "C");
CREATE INDEX idempotency_keys_held_idx ON idempotency_keys (tenant_id, created_at, key COLLATE "C") WHERE state = 'unknown';
CREATE INDEX idempotency_keys_held_created_idx ON idempotency_keys (created_at, tenant_id, key COLLATE "C") WHERE state = 'unknown';

SELECT format('CREATE TABLE idempotency_keys_p%s PARTITION OF idempotency_keys FOR VALUES WITH (MODULUS %s, REMAINDER %s)',
              r, :partitions, r)
FROM generate_series(0, :partitions - 1) AS r
\gexec

-- The old table's grants, then its owner (after the grants: a new owner
-- may be a role the one running this cannot grant for).
SELECT format('GRANT %s ON idempotency_keys TO %s', a.privilege_type,
              CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END)
FROM pg_class c, aclexplode(c.relacl) a
WHERE c.oid = 'idempotency_keys_unpartitioned'::regclass AND a.grantee <> c.relowner
\gexec
SELECT format('ALTER TABLE idempotency_keys OWNER TO %I', pg_get_userbyid(relowner))
FROM pg_class WHERE oid = 'idempotency_keys_unpartitioned'::regclass
\gexec

INSERT INTO idempotency_keys SELECT * FROM idempotency_keys_unpartitioned WHERE expires_at > now();
DROP TABLE idempotency_keys_unpartitioned;

COMMIT;
