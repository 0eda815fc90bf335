package peer

import (
	"net"
	"net/http"
	"strings"

	"github.com/atoll-dev/atoll/api"
)

// How a request names the sandbox it is about, one rule a row, tried in
// order; the first that finds a well-formed ID wins. They follow the
// handlers that serve those requests: the REST API (internal/server), E2B's
// API and its envd traffic (internal/e2b), and the port proxy
// (internal/portproxy). A request no rule matches (a list, a create, a
// template) is any node's to serve.
var targetRules = []struct {
	name string
	find func(r *http.Request) string
}{
	// REST: /v1/sandboxes/{id} and everything under it.
	{"rest path", func(r *http.Request) string { return pathID(r.URL.Path, "/v1/sandboxes/") }},
	// E2B's API: /sandboxes/{id}/..., and /v2/sandboxes/{id}/connect.
	{"e2b path", func(r *http.Request) string { return pathID(r.URL.Path, "/sandboxes/") }},
	{"e2b v2 path", func(r *http.Request) string { return pathID(r.URL.Path, "/v2/sandboxes/") }},
	// envd and the port proxy: the host {port}-{id}.{domain}.
	{"port host", func(r *http.Request) string { return hostID(r.Host) }},
	// E2B_SANDBOX_URL's traffic, and the port proxy by header.
	{"e2b header", func(r *http.Request) string { return r.Header.Get("E2b-Sandbox-Id") }},
	{"port header", func(r *http.Request) string { return r.Header.Get("Atoll-Sandbox-Id") }},
}

// sandboxOf returns the ID of the sandbox r is about, "" for none.
func sandboxOf(r *http.Request) string {
	for _, rule := range targetRules {
		if id := rule.find(r); api.ValidSandboxID(id) {
			return id
		}
	}
	return ""
}

// pathID is the path segment right after prefix.
func pathID(path, prefix string) string {
	rest, ok := strings.CutPrefix(path, prefix)
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, "/")
	return id
}

// hostID is id in a host {port}-{id}.{domain}[:port], as E2B's SDKs and
// the port proxy address a sandbox's port; the domain is not checked, as
// envd's handler does not: a well-formed first label is enough to ask
// where the sandbox is.
func hostID(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, _, ok := strings.Cut(host, ".")
	if !ok {
		return ""
	}
	port, id, ok := strings.Cut(label, "-")
	if !ok || port == "" || len(port) > 5 || strings.Trim(port, "0123456789") != "" {
		return ""
	}
	return strings.ToLower(id)
}
