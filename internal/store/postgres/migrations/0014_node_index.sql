-- Place and Move read what a node's sandboxes hold from node_committed
-- (0013), not from the sandboxes' rows: the index by node need not carry
-- their slots, states and resources any more (a narrower index is less
-- to write with each of a burst's rows). ListNode reads it in List's order.
--
-- Not CONCURRENTLY: Open runs every missing step in one transaction
-- (migrate.go), where CREATE INDEX CONCURRENTLY cannot run, and a step
-- half applied is worse than a pause. The drop locks sandboxes (reads and
-- writes) until the migration commits; the build takes ~0.1-0.15 s at
-- 50,000 sandboxes on the 2-core test machine, once, when the first
-- upgraded node opens the database. The nodes' reads and writes wait for
-- the lock meanwhile; none fails or is lost.
DROP INDEX sandboxes_node;
CREATE INDEX sandboxes_node ON sandboxes (node, created_at, id);
