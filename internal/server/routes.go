package server

import (
	"net/http"
	"strings"

	"github.com/atoll-dev/atoll/api"
)

// route is one entry of the API. The table is the source of the mux and of the
// test that keeps api/openapi.yaml in step with the server.
type route struct {
	method  string
	path    string // ServeMux path pattern, also the OpenAPI path
	auth    bool
	handler http.HandlerFunc
}

func (rt route) pattern() string { return rt.method + " " + rt.path }

const (
	sandboxPath  = "/v1/sandboxes/{id}"
	snapshotPath = "/v1/snapshots/{snap}"
	templatePath = "/v1/templates/{name}"
)

// agentRoutes are the agent protocol's routes (docs/agent-protocol.md), all
// forwarded under /v1/sandboxes/{id}. jsonBody marks those whose request body
// is a small JSON document rather than a stream.
var agentRoutes = []struct {
	method, path string
	jsonBody     bool
}{
	{"GET", "/health", false},
	{"POST", "/exec", true},
	{"GET", "/logs", false},
	{"GET", "/processes", false},
	{"GET", "/processes/{pid}", false},
	{"GET", "/processes/{pid}/attach", false},
	{"POST", "/processes/{pid}/stdin", false},
	{"POST", "/processes/{pid}/stdin/close", false},
	{"POST", "/processes/{pid}/signal", true},
	{"POST", "/processes/{pid}/resize", true},
	{"GET", "/processes/{pid}/ws", false},
	{"GET", "/files", false},
	{"PUT", "/files", false},
	{"DELETE", "/files", false},
	{"GET", "/files/stat", false},
	{"GET", "/files/list", false},
	{"POST", "/files/mkdir", true},
	{"POST", "/files/rename", true},
	{"POST", "/files/chmod", true},
	{"GET", "/files/tar", false},
	{"PUT", "/files/tar", false},
	{"GET", "/files/watch", false},
	// The code interpreter (templates/code-interpreter), which the agent
	// reaches on the sandbox's loopback.
	{"POST", "/code/execute", true},
	{"GET", "/code/contexts", false},
	{"POST", "/code/contexts", true},
	{"DELETE", "/code/contexts/{ctx}", false},
	{"POST", "/code/contexts/{ctx}/restart", false},
}

func (s *Server) routes() []route {
	rts := []route{
		{"GET", "/v1/health", false, s.health},
		{"GET", "/v1/runtimes", true, s.listRuntimes},
		{"GET", "/v1/metrics", true, s.admin(s.serveMetrics)},
		{"POST", "/v1/sandboxes", true, s.createSandbox},
		{"GET", "/v1/sandboxes", true, s.listSandboxes},
		{"GET", sandboxPath, true, handle(s, sandboxID, s.cfg.Sandboxes.Get)},
		{"DELETE", sandboxPath, true, handleDelete(s, sandboxID, s.cfg.Sandboxes.Delete)},
		{"POST", sandboxPath + "/stop", true, handle(s, sandboxID, s.cfg.Sandboxes.Stop)},
		{"POST", sandboxPath + "/start", true, handle(s, sandboxID, s.renewingVaults(s.cfg.Sandboxes.Start))},
		{"POST", sandboxPath + "/pause", true, s.pauseSandbox},
		{"POST", sandboxPath + "/archive", true, handle(s, sandboxID, s.cfg.Sandboxes.Archive)},
		{"POST", sandboxPath + "/resume", true, handle(s, sandboxID, s.renewingVaults(s.cfg.Sandboxes.Resume))},
		{"POST", sandboxPath + "/timeout", true, s.setTimeout},
		{"GET", sandboxPath + "/metrics", true, s.getMetrics},
		{"GET", sandboxPath + "/network", true, handle(s, sandboxID, s.cfg.Sandboxes.GetNetwork)},
		{"GET", sandboxPath + "/placement", true, handle(s, sandboxID, s.cfg.Sandboxes.Placement)},
		{"PUT", sandboxPath + "/network", true, s.setNetwork},
		{"PUT", sandboxPath + "/ports", true, s.setPorts},
		{"GET", sandboxPath + "/ports/{port}", true, s.getPortURL},
		{"POST", sandboxPath + "/fork", true, s.forkSandbox},
		{"POST", sandboxPath + "/restore", true, s.restoreSandbox},
		{"POST", sandboxPath + "/snapshots", true, s.createSnapshot},
		{"GET", sandboxPath + "/snapshots", true, s.listSandboxSnapshots},
		{"GET", "/v1/snapshots", true, s.listSnapshots},
		{"GET", snapshotPath, true, handle(s, snapshotID, s.cfg.Sandboxes.GetSnapshot)},
		{"DELETE", snapshotPath, true, handleDelete(s, snapshotID, s.cfg.Sandboxes.DeleteSnapshot)},
		{"POST", snapshotPath + "/archive", true, handle(s, snapshotID, s.cfg.Sandboxes.ArchiveSnapshot)},
		// Templates are the server's, shared by every tenant: any key uses
		// them, admin keys change them.
		{"POST", "/v1/templates/import", true, s.admin(s.importTemplate)},
		{"POST", "/v1/templates/build", true, s.admin(s.buildTemplate)},
		{"GET", "/v1/templates", true, s.listTemplates},
		{"GET", templatePath, true, s.getTemplate},
		{"DELETE", templatePath, true, s.admin(s.deleteTemplate)},
		{"POST", templatePath + "/tag", true, s.admin(s.tagTemplate)},
		{"POST", "/v1/templates/bootstrap", true, s.admin(s.bootstrapTemplate)},
		{"POST", "/v1/vaults", true, s.createVault},
		{"GET", "/v1/vaults", true, s.listVaults},
		{"GET", vaultPath, true, s.getVault},
		{"DELETE", vaultPath, true, s.deleteVault},
		{"PATCH", vaultPath, true, s.updateVault},
		{"GET", vaultPath + "/events", true, s.vaultEvents},
		{"POST", vaultPath + "/credentials", true, s.vaultCredentials},
		{"GET", vaultPath + "/log", true, s.vaultLog},
		{"GET", vaultPath + "/files/{path...}", true, s.vaultFile},
		{"GET", vaultPath + "/search", true, s.vaultSearch},
		{"GET", vaultPath + "/links", true, s.vaultLinks},
		{"POST", vaultPath + "/compact", true, s.vaultCompact},
		// MCP's streamable HTTP transport: POST carries messages, GET
		// opens a session's stream, DELETE ends a session.
		{"POST", "/v1/mcp", true, s.mcp},
		{"GET", "/v1/mcp", true, s.mcp},
		{"DELETE", "/v1/mcp", true, s.mcp},
		{"POST", "/v1/keys", true, s.admin(s.createKey)},
		{"GET", "/v1/keys", true, s.admin(s.listKeys)},
		{"DELETE", "/v1/keys/{key}", true, s.admin(s.deleteKey)},
		{"GET", "/v1/usage", true, s.getUsage},
		{"GET", "/v1/tenants", true, s.admin(s.listTenants)},
		{"GET", "/v1/tenants/{tenant}", true, s.getTenant},
		{"PUT", "/v1/tenants/{tenant}/quota", true, s.admin(s.setQuota)},
		{"GET", "/v1/audit", true, s.admin(s.listAudit)},
		{"GET", "/v1/events", true, s.streamEvents},
		{"POST", "/v1/webhooks", true, s.createWebhook},
		{"GET", "/v1/webhooks", true, s.listWebhooks},
		{"DELETE", "/v1/webhooks/{webhook}", true, s.deleteWebhook},
		{"GET", "/v1/webhooks/{webhook}/deliveries", true, s.listDeliveries},
		{"GET", "/v1/nodes", true, s.admin(s.listNodes)},
		{"POST", "/v1/nodes/{node}/cordon", true, s.admin(s.setSchedule(api.NodeCordoned))},
		{"POST", "/v1/nodes/{node}/uncordon", true, s.admin(s.setSchedule(""))},
		{"POST", "/v1/nodes/{node}/drain", true, s.admin(s.setSchedule(api.NodeDraining))},
	}
	for _, ar := range agentRoutes {
		rts = append(rts, route{ar.method, sandboxPath + ar.path, true, s.forward(strings.Contains(ar.path, "{pid}"), ar.jsonBody)})
	}
	return rts
}
