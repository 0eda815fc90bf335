-- Tenants' quotas (store.Tenants). A write that may grow what a tenant
-- holds updates its row (charged), which orders such writes per tenant:
-- see tenants.go.
CREATE TABLE tenants (
	name text PRIMARY KEY,
	max_sandboxes integer NOT NULL DEFAULT 0,
	max_cpu double precision NOT NULL DEFAULT 0,
	max_memory_mib bigint NOT NULL DEFAULT 0,
	max_disk_gib bigint NOT NULL DEFAULT 0,
	creates_per_second double precision NOT NULL DEFAULT 0,
	charged bigint NOT NULL DEFAULT 0
);
-- A tenant's use is summed by state, from the index alone where the
-- visibility map allows (as sandboxes_node for a node's).
CREATE INDEX sandboxes_tenant ON sandboxes (tenant, state) INCLUDE (cpu, memory_mib, disk_gib);
