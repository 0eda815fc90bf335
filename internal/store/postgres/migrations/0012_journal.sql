-- The journal (store.Journal): the audit log of the API's changes, the
-- sandboxes' lifecycle events, and the webhooks that deliver them with
-- their deliveries. Events are appended under an advisory lock (see
-- journal.go), so that their seq is also their commit order.
CREATE TABLE audit (
	seq bigserial PRIMARY KEY,
	at timestamptz NOT NULL,
	tenant text NOT NULL,
	key_id text NOT NULL,
	source text NOT NULL,
	action text NOT NULL,
	target text NOT NULL,
	status integer NOT NULL,
	request_id text NOT NULL
);
CREATE INDEX audit_at ON audit (at);
CREATE INDEX audit_tenant ON audit (tenant, seq);
CREATE INDEX audit_target ON audit (target, seq);
CREATE TABLE events (
	seq bigserial PRIMARY KEY,
	id text NOT NULL UNIQUE,
	at timestamptz NOT NULL,
	type text NOT NULL,
	tenant text NOT NULL,
	sandbox text NOT NULL,
	state text NOT NULL,
	reason text NOT NULL
);
CREATE INDEX events_at ON events (at);
CREATE TABLE webhooks (
	id text PRIMARY KEY,
	tenant text NOT NULL,
	url text NOT NULL,
	events text NOT NULL,
	secret text NOT NULL,
	created_at timestamptz NOT NULL
);
CREATE INDEX webhooks_tenant ON webhooks (tenant);
CREATE TABLE deliveries (
	seq bigserial PRIMARY KEY,
	webhook_id text NOT NULL REFERENCES webhooks(id) ON DELETE CASCADE,
	event_seq bigint NOT NULL,
	sandbox text NOT NULL,
	state text NOT NULL,
	attempts integer NOT NULL DEFAULT 0,
	next_at timestamptz NOT NULL,
	last_status integer NOT NULL DEFAULT 0,
	last_error text NOT NULL DEFAULT '',
	created_at timestamptz NOT NULL,
	done_at timestamptz
);
CREATE INDEX deliveries_due ON deliveries (state, next_at);
CREATE INDEX deliveries_queue ON deliveries (webhook_id, sandbox, seq);
CREATE INDEX deliveries_event ON deliveries (event_seq);
