// Package citus reads how a database's idempotency_keys is distributed,
// for the migrations (which distribute it) and the Postgres store's
// readiness check (which needs it distributed by tenant_id).
package citus

import (
	"errors"
	"fmt"

	"github.com/idemproxy/idemproxy"
	"github.com/idemproxy/idemproxy/internal/pgerr"
)

// DistributionSQL reads, in one round trip and without failing on a
// database that has no Citus, the citus extension's version (NULL: not
// installed) and how the search_path's idempotency_keys is distributed:
// 'hash:COLUMN', 'none' (a reference table) or NULL (not distributed, or
// no table). The Citus catalogue is named only in a string run when it
// exists.
const DistributionSQL = `SELECT (SELECT extversion FROM pg_extension WHERE extname = 'citus'),
	CASE WHEN to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL
		AND to_regclass('idempotency_keys') IS NOT NULL THEN
	(xpath('/row/d/text()', query_to_xml(format(
		$q$SELECT (SELECT CASE partmethod WHEN 'h' THEN 'hash:' || column_to_column_name(logicalrelid, partkey)
			WHEN 'n' THEN 'none' ELSE partmethod::text END
		FROM pg_catalog.pg_dist_partition WHERE logicalrelid = %s) AS d$q$,
		to_regclass('idempotency_keys')::oid), false, true, '')))[1]::text
	END`

// ByTenant is DistributionSQL's distribution of a table distributed by
// hash of tenant_id.
const ByTenant = "hash:tenant_id"

// Check says what DistributionSQL's answer lacks: nil when the extension
// is installed and the table distributed by tenant_id, an
// *idemproxy.MisconfiguredError otherwise (ReasonCitusMissing,
// ReasonNotDistributed). installed is whether the version was not NULL,
// dist the distribution ("" for NULL).
func Check(installed bool, dist string) error {
	switch {
	case !installed:
		return idemproxy.Misconfigured(pgerr.ReasonCitusMissing,
			errors.New("the citus extension is not installed in this database (CREATE EXTENSION citus on the coordinator and every worker)"))
	case dist == "":
		return idemproxy.Misconfigured(pgerr.ReasonNotDistributed,
			errors.New("idempotency_keys is not distributed: SELECT create_distributed_table('idempotency_keys', 'tenant_id') on the coordinator"))
	case dist != ByTenant:
		return idemproxy.Misconfigured(pgerr.ReasonNotDistributed,
			fmt.Errorf("idempotency_keys is distributed as %s, not by hash of tenant_id: every statement of the store would span shards", dist))
	}
	return nil
}
