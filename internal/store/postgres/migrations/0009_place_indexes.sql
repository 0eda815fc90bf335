-- What a placement reads of its nodes' sandboxes grew by the columns of a
-- warm reservation (template version, runtime, warm): the covering index
-- carries them, so that the read stays an index-only scan (without them
-- every row was fetched from the table, under the node's lock, and 50,000
-- placements took twice as long).
DROP INDEX sandboxes_node;
CREATE INDEX sandboxes_node ON sandboxes (node, created_at, id) INCLUDE (slot, state, cpu, memory_mib, disk_gib, template_version, runtime, warm);

-- Nodes counts pooled sandboxes and the warm placements creating: only
-- those rows, not every placement still creating (a burst's thousands).
DROP INDEX sandboxes_warm;
CREATE INDEX sandboxes_warm ON sandboxes (node, template_version) WHERE state = 'pooled' OR (state = 'creating' AND warm);
