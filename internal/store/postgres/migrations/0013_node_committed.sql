-- What each node's sandboxes hold (store.Holds), kept as running sums, so
-- that a placement's capacity check and a read of the nodes cost one row a
-- node, not one a sandbox (at 50,000 sandboxes the sums Nodes made took
-- ~30 ms, and a batch's sums of its target nodes ~9 ms under their locks).
--
-- The sums are kept by triggers on sandboxes, in the transaction of the
-- statement that changes a sandbox's node, slot, state or resources:
-- every path (a placement, a create, an update, a delete, a move, a fence)
-- keeps them, with no code of its own. One statement's rows are summed by
-- node first (statement triggers with transition tables): a batch of 64
-- placements is one upsert, not 64.
--
-- A table of its own, not columns of nodes: a node's own writes (As) hold
-- its nodes row FOR SHARE, to be ordered with Join and Expire; updating
-- that row would turn two such writes at once into a deadlock. A change of
-- state that holds the same (creating to running) does not touch the row.
--
-- recorded counts every sandbox recorded on the node (each has a slot), and
-- slot_top is above every slot it has held since it was last empty: when
-- recorded = slot_top the slots 0 .. slot_top-1 are all taken, and the lowest
-- free one is slot_top, which a placement takes without reading a row.
-- CPU is numeric, so that the sums are exact in any order.
CREATE TABLE node_committed (
	node text PRIMARY KEY,
	cpu numeric NOT NULL DEFAULT 0,
	memory_mib bigint NOT NULL DEFAULT 0,
	disk_gib bigint NOT NULL DEFAULT 0,
	sandboxes bigint NOT NULL DEFAULT 0,
	recorded bigint NOT NULL DEFAULT 0,
	slot_top bigint NOT NULL DEFAULT 0
);

-- store.Holds, in SQL (TestHoldsSQL checks that they agree on every state):
-- compute (CPU and memory) and a slot (disk and one of the sandbox count).
CREATE FUNCTION holds_compute(state text) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
	SELECT state NOT IN ('stopped', 'stopping', 'error', 'archiving', 'suspended', 'shelved', 'archived', 'lost', 'deleting')
$$;
CREATE FUNCTION holds_slot(state text) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
	SELECT state NOT IN ('archived', 'lost', 'deleting')
$$;

-- The rows a statement changed, as signed rows: +1 what is there now, -1
-- what was there before. An update's rows count only if the change matters
-- to the sums (node, slot, what the state holds, the resources). Summed by
-- node, in name order (the order Place and Expire lock nodes in), then
-- added to each node's row.
CREATE FUNCTION node_committed_apply() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_OP = 'INSERT' THEN
		INSERT INTO node_committed AS c (node, cpu, memory_mib, disk_gib, sandboxes, recorded, slot_top)
		SELECT node,
			SUM(CASE WHEN holds_compute(state) THEN cpu::numeric ELSE 0 END),
			SUM(CASE WHEN holds_compute(state) THEN memory_mib ELSE 0 END),
			SUM(CASE WHEN holds_slot(state) THEN disk_gib ELSE 0 END),
			COUNT(*) FILTER (WHERE holds_slot(state)),
			COUNT(*), MAX(slot) + 1
		FROM new_rows WHERE node <> '' GROUP BY node ORDER BY node
		ON CONFLICT (node) DO UPDATE SET cpu = c.cpu + excluded.cpu, memory_mib = c.memory_mib + excluded.memory_mib,
			disk_gib = c.disk_gib + excluded.disk_gib, sandboxes = c.sandboxes + excluded.sandboxes,
			recorded = c.recorded + excluded.recorded, slot_top = GREATEST(c.slot_top, excluded.slot_top);
	ELSIF TG_OP = 'DELETE' THEN
		INSERT INTO node_committed AS c (node, cpu, memory_mib, disk_gib, sandboxes, recorded, slot_top)
		SELECT node,
			-SUM(CASE WHEN holds_compute(state) THEN cpu::numeric ELSE 0 END),
			-SUM(CASE WHEN holds_compute(state) THEN memory_mib ELSE 0 END),
			-SUM(CASE WHEN holds_slot(state) THEN disk_gib ELSE 0 END),
			-COUNT(*) FILTER (WHERE holds_slot(state)),
			-COUNT(*), 0
		FROM old_rows WHERE node <> '' GROUP BY node ORDER BY node
		ON CONFLICT (node) DO UPDATE SET cpu = c.cpu + excluded.cpu, memory_mib = c.memory_mib + excluded.memory_mib,
			disk_gib = c.disk_gib + excluded.disk_gib, sandboxes = c.sandboxes + excluded.sandboxes,
			recorded = c.recorded + excluded.recorded,
			slot_top = CASE WHEN c.recorded + excluded.recorded = 0 THEN 0 ELSE c.slot_top END;
	ELSE
		INSERT INTO node_committed AS c (node, cpu, memory_mib, disk_gib, sandboxes, recorded, slot_top)
		SELECT node,
			SUM(sign * CASE WHEN holds_compute(state) THEN cpu::numeric ELSE 0 END),
			SUM(sign * CASE WHEN holds_compute(state) THEN memory_mib ELSE 0 END),
			SUM(sign * CASE WHEN holds_slot(state) THEN disk_gib ELSE 0 END),
			COALESCE(SUM(sign) FILTER (WHERE holds_slot(state)), 0),
			SUM(sign), COALESCE(MAX(slot) FILTER (WHERE sign > 0) + 1, 0)
		FROM (
			SELECT v.* FROM old_rows o JOIN new_rows n ON n.id = o.id
			CROSS JOIN LATERAL (VALUES (o.node, -1, o.state, o.cpu, o.memory_mib, o.disk_gib, o.slot),
				(n.node, 1, n.state, n.cpu, n.memory_mib, n.disk_gib, n.slot)) v(node, sign, state, cpu, memory_mib, disk_gib, slot)
			WHERE o.node <> n.node OR o.slot <> n.slot OR o.cpu <> n.cpu OR o.memory_mib <> n.memory_mib
				OR o.disk_gib <> n.disk_gib OR holds_compute(o.state) <> holds_compute(n.state)
				OR holds_slot(o.state) <> holds_slot(n.state)
		) d WHERE node <> '' GROUP BY node ORDER BY node
		ON CONFLICT (node) DO UPDATE SET cpu = c.cpu + excluded.cpu, memory_mib = c.memory_mib + excluded.memory_mib,
			disk_gib = c.disk_gib + excluded.disk_gib, sandboxes = c.sandboxes + excluded.sandboxes,
			recorded = c.recorded + excluded.recorded,
			slot_top = CASE WHEN c.recorded + excluded.recorded = 0 THEN 0 ELSE GREATEST(c.slot_top, excluded.slot_top) END;
	END IF;
	RETURN NULL;
END
$$;

CREATE TRIGGER sandboxes_committed_insert AFTER INSERT ON sandboxes
	REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION node_committed_apply();
CREATE TRIGGER sandboxes_committed_update AFTER UPDATE ON sandboxes
	REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION node_committed_apply();
CREATE TRIGGER sandboxes_committed_delete AFTER DELETE ON sandboxes
	REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION node_committed_apply();

-- The sums of the sandboxes already recorded.
INSERT INTO node_committed (node, cpu, memory_mib, disk_gib, sandboxes, recorded, slot_top)
SELECT node,
	COALESCE(SUM(cpu::numeric) FILTER (WHERE holds_compute(state)), 0),
	COALESCE(SUM(memory_mib) FILTER (WHERE holds_compute(state)), 0),
	COALESCE(SUM(disk_gib) FILTER (WHERE holds_slot(state)), 0),
	COUNT(*) FILTER (WHERE holds_slot(state)),
	COUNT(*), MAX(slot) + 1
FROM sandboxes WHERE node <> '' GROUP BY node;
