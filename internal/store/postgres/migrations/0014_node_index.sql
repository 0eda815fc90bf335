-- Place and Move read what a node's sandboxes hold from node_committed
-- (0013), not from the sandboxes' rows: the index by node need not carry
-- their slots, states and resources any more (a narrower index is less
-- to write with each of a burst's rows). ListNode reads it in List's order.
DROP INDEX sandboxes_node;
CREATE INDEX sandboxes_node ON sandboxes (node, created_at, id);
