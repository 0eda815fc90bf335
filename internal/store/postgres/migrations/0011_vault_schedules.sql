-- Memory vaults' compaction schedules (store.VaultSchedules): one row a
-- vault that has a schedule or a summarizer; a node claims a due one by
-- moving next_at on, compare-and-set. And each vault's log of events
-- (compactions made or failed), the newest kept.
CREATE TABLE vault_schedules (
	vault_id text PRIMARY KEY REFERENCES vaults(id) ON DELETE CASCADE,
	every text NOT NULL DEFAULT '',
	summarizer text NOT NULL DEFAULT '',
	next_at timestamptz
);
CREATE INDEX vault_schedules_due ON vault_schedules (next_at) WHERE every <> '';
CREATE TABLE vault_events (
	seq bigserial PRIMARY KEY,
	vault_id text NOT NULL REFERENCES vaults(id) ON DELETE CASCADE,
	at timestamptz NOT NULL,
	kind text NOT NULL,
	trigger text NOT NULL DEFAULT '',
	commit_id text NOT NULL DEFAULT '',
	error text NOT NULL DEFAULT '',
	detail text NOT NULL DEFAULT ''
);
CREATE INDEX vault_events_vault ON vault_events (vault_id, seq);
