-- Periodic checkpoints of a running sandbox to object storage (cluster
-- mode), for a lost one to be restored from.
ALTER TABLE sandboxes ADD COLUMN checkpoint_every_sec bigint NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN checkpointed_at timestamptz;
