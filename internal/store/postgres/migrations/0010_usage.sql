-- Usage metering (store.Usage): one row per sandbox and metering interval,
-- written once (a second write of the same interval changes nothing), and
-- each metered sandbox's tenant, template and labels, which outlive it.
CREATE TABLE usage (
	sandbox_id text NOT NULL,
	start bigint NOT NULL,
	node text NOT NULL,
	seconds bigint NOT NULL,
	cpu_us bigint NOT NULL,
	mem_byte_s bigint NOT NULL,
	disk_byte_s bigint NOT NULL,
	snapshot_byte_s bigint NOT NULL,
	archive_byte_s bigint NOT NULL,
	net_in bigint NOT NULL,
	net_out bigint NOT NULL,
	running_ms bigint NOT NULL,
	paused_ms bigint NOT NULL,
	suspended_ms bigint NOT NULL,
	stopped_ms bigint NOT NULL,
	archived_ms bigint NOT NULL,
	cpu_counter bigint NOT NULL,
	net_in_counter bigint NOT NULL,
	net_out_counter bigint NOT NULL,
	instance bigint NOT NULL,
	PRIMARY KEY (sandbox_id, start)
);
CREATE INDEX usage_start ON usage (start);
CREATE TABLE usage_sandboxes (
	sandbox_id text PRIMARY KEY,
	tenant text NOT NULL,
	template text NOT NULL,
	labels text NOT NULL,
	node text NOT NULL,
	last_start bigint NOT NULL
);
CREATE INDEX usage_sandboxes_tenant ON usage_sandboxes (tenant);
CREATE INDEX usage_sandboxes_node ON usage_sandboxes (node);
