-- The store's tables, as store/sqlite has them, in PostgreSQL's types:
-- times are timestamptz (the contract asks for microseconds); maps, lists
-- and policies are JSON in text columns, kept byte for byte (jsonb would
-- reorder keys and refuses \u0000).

CREATE TABLE sandboxes (
	id text PRIMARY KEY,
	state text NOT NULL,
	template text NOT NULL,
	template_version text NOT NULL DEFAULT '', -- '' is the built-in template
	runtime text NOT NULL,
	cpu double precision NOT NULL,
	memory_mib bigint NOT NULL,
	disk_gib bigint NOT NULL,
	pids bigint NOT NULL,
	env text NOT NULL,
	labels text NOT NULL,
	error text NOT NULL DEFAULT '',
	slot integer NOT NULL UNIQUE,
	created_at timestamptz NOT NULL,
	started_at timestamptz,
	stopped_at timestamptz,
	pid integer NOT NULL DEFAULT 0,
	start_time bigint NOT NULL DEFAULT 0,
	socket text NOT NULL DEFAULT '',
	timeout_sec bigint NOT NULL DEFAULT 0,
	expires_at timestamptz,
	ephemeral boolean NOT NULL DEFAULT false,
	auto_delete_sec bigint NOT NULL DEFAULT 0,
	auto_stop_sec bigint NOT NULL DEFAULT 0,
	auto_archive_sec bigint NOT NULL DEFAULT 0,
	auto_resume boolean NOT NULL DEFAULT false,
	from_snapshot text NOT NULL DEFAULT '',
	egress text NOT NULL DEFAULT '',
	public_ports boolean NOT NULL DEFAULT false,
	tenant text NOT NULL
);
CREATE INDEX sandboxes_template_version ON sandboxes (template_version);

-- Transitions outlive their sandbox's row: no foreign key.
CREATE TABLE transitions (
	seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	sandbox_id text NOT NULL,
	from_state text NOT NULL,
	to_state text NOT NULL,
	reason text NOT NULL DEFAULT '',
	at timestamptz NOT NULL
);
CREATE INDEX transitions_sandbox ON transitions (sandbox_id);

CREATE TABLE template_versions (
	id text PRIMARY KEY,
	name text NOT NULL,
	number integer NOT NULL,
	source text NOT NULL,
	digest text NOT NULL,
	layers text NOT NULL,
	size bigint NOT NULL,
	config text NOT NULL,
	created_at timestamptz NOT NULL,
	UNIQUE (name, number)
);

CREATE TABLE template_names (
	name text PRIMARY KEY,
	version text NOT NULL REFERENCES template_versions (id)
);

CREATE TABLE snapshots (
	id text PRIMARY KEY,
	name text NOT NULL,
	sandbox_id text NOT NULL,
	template text NOT NULL,
	template_version text NOT NULL DEFAULT '',
	state text NOT NULL,
	tenant text NOT NULL,
	created_at timestamptz NOT NULL
);
CREATE INDEX snapshots_sandbox ON snapshots (sandbox_id);
CREATE INDEX snapshots_template_version ON snapshots (template_version);

CREATE TABLE api_keys (
	hash text PRIMARY KEY,
	name text NOT NULL,
	tenant text NOT NULL,
	created_at timestamptz NOT NULL
);
