-- A sandbox's placement record: the scheduler's decision that put it on its
-- node (scheduler.Decision as JSON), '' if it was not placed. Written once
-- with the row; only GET /v1/sandboxes/{id}/placement reads it.

ALTER TABLE sandboxes ADD COLUMN placement text NOT NULL DEFAULT '';
