-- Memory vaults (store.Vaults): a tenant's git repositories, whose packs
-- are in object storage and whose refs are rows here, moved together with
-- the names of the packs a push added.
CREATE TABLE vaults (
	id text PRIMARY KEY,
	tenant text NOT NULL,
	name text NOT NULL,
	layout text NOT NULL DEFAULT '',
	allow_rewrite boolean NOT NULL DEFAULT false,
	created_at timestamptz NOT NULL,
	UNIQUE (tenant, name)
);
CREATE TABLE vault_refs (
	vault_id text NOT NULL REFERENCES vaults(id) ON DELETE CASCADE,
	name text NOT NULL,
	oid text NOT NULL,
	PRIMARY KEY (vault_id, name)
);
CREATE TABLE vault_packs (
	vault_id text NOT NULL REFERENCES vaults(id) ON DELETE CASCADE,
	seq bigint NOT NULL,
	name text NOT NULL,
	PRIMARY KEY (vault_id, seq),
	UNIQUE (vault_id, name)
);
