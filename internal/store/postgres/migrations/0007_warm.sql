-- A placement that takes a warm sandbox of its template waiting on its node
-- (store.Sandbox.Warm): while it is creating, it holds one of the node's
-- pooled sandboxes of its version, which Place counts as reserved.

ALTER TABLE sandboxes ADD COLUMN warm boolean NOT NULL DEFAULT false;

-- Nodes counts each node's pooled sandboxes, less those reserved, from the
-- rows in these two states only.
CREATE INDEX sandboxes_warm ON sandboxes (node, template_version) WHERE state IN ('pooled', 'creating');
