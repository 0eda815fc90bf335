-- The tenants' create rates, shared by the nodes of a cluster
-- (store.Cluster.TakeCreates): a token bucket per tenant with a rate,
-- refilled by PostgreSQL's clock when a create takes from it. A row is
-- made by a tenant's first limited create; a tenant without a rate has none.
CREATE TABLE create_buckets (
	tenant text PRIMARY KEY,
	tokens double precision NOT NULL,
	at timestamptz NOT NULL
);
