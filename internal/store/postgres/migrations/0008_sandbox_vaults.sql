-- The memory vaults cloned into a sandbox at its creation
-- (api.Sandbox.Vaults), JSON; '' for none.
ALTER TABLE sandboxes ADD COLUMN vaults text NOT NULL DEFAULT '';
