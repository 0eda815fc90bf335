-- Cluster mode (store.Cluster): sandboxes carry the node that runs them,
-- and their slot is unique on that node only; a lost sandbox remembers the
-- state it was in. The nodes, with their leases and epochs, and the
-- cluster's shared secrets.

ALTER TABLE sandboxes ADD COLUMN node text NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN lost_from text NOT NULL DEFAULT '';
ALTER TABLE sandboxes DROP CONSTRAINT sandboxes_slot_key;
ALTER TABLE sandboxes ADD CONSTRAINT sandboxes_node_slot_key UNIQUE (node, slot);
-- ListNode, in List's order; and what a placement sums, under the node's
-- lock, of the node's sandboxes, read from the index alone (an index-only
-- scan: a node's rows are spread over the table's pages, and reading them
-- there made the lock's hold several times longer).
CREATE INDEX sandboxes_node ON sandboxes (node, created_at, id) INCLUDE (slot, state, cpu, memory_mib, disk_gib);

-- Lists and maps are JSON in text columns, as in sandboxes.
CREATE TABLE nodes (
	name text PRIMARY KEY,
	address text NOT NULL,
	version text NOT NULL,
	runtimes text NOT NULL,
	labels text NOT NULL,
	cpu double precision NOT NULL,
	memory_mib bigint NOT NULL,
	disk_gib bigint NOT NULL,
	sandboxes bigint NOT NULL,
	epoch bigint NOT NULL,
	state text NOT NULL,
	schedule text NOT NULL DEFAULT '',
	joined_at timestamptz NOT NULL,
	heartbeat timestamptz NOT NULL,
	lease_expires timestamptz NOT NULL,
	status text NOT NULL DEFAULT '{}'
);

CREATE TABLE secrets (
	name text PRIMARY KEY,
	value bytea NOT NULL
);
