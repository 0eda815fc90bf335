package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// schedules is a Nodes that records schedules (the routes' own logic is
// under test; the cluster store's is storetest's).
type schedules struct {
	mu    sync.Mutex
	nodes map[string]string
}

func (n *schedules) List(context.Context) ([]api.Node, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var l []api.Node
	for name, sched := range n.nodes {
		l = append(l, api.Node{Name: name, State: "live", Schedule: sched})
	}
	return l, nil
}

func (n *schedules) SetSchedule(_ context.Context, name, sched string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.nodes[name]; !ok {
		return fmt.Errorf("node %s: %w", name, errdefs.ErrNotFound)
	}
	n.nodes[name] = sched
	return nil
}

// TestNodeRoutes: admins list, cordon, uncordon and drain nodes; other
// keys get 403, bad names 400, unknown nodes 404, and a single machine
// 409.
func TestNodeRoutes(t *testing.T) {
	keys, admin := adminKeys(t)
	k, err := keys.Create(context.Background(), api.CreateKeyRequest{Name: "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	serve := func(nodes Nodes) *fixture {
		cfg := Config{Sandboxes: &memSandboxes{sbs: map[string]api.Sandbox{}}, Auth: keys, Keys: keys,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
		if nodes != nil {
			cfg.Nodes = nodes
		}
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ts := httptest.NewServer(s.Handler())
		t.Cleanup(ts.Close)
		return &fixture{t: t, s: s, url: ts.URL}
	}
	as := func(key string) []string { return []string{"X-API-Key", key} }

	one := serve(nil)
	resp, body := one.do("GET", "/v1/nodes", "", as(admin)...)
	wantError(t, resp, body, 409, "conflict")

	nodes := &schedules{nodes: map[string]string{"node-a": "", "node-b": ""}}
	f := serve(nodes)
	for _, verb := range []string{"cordon", "drain", "uncordon"} {
		resp, body := f.do("POST", "/v1/nodes/node-b/"+verb, "", as(k.Key)...)
		wantError(t, resp, body, 403, "forbidden")
		resp, body = f.do("POST", "/v1/nodes/node-b/"+verb, "", as(admin)...)
		if resp.StatusCode != 204 {
			t.Fatalf("%s: %d %s", verb, resp.StatusCode, body)
		}
		want := map[string]string{"cordon": api.NodeCordoned, "drain": api.NodeDraining, "uncordon": ""}[verb]
		if nodes.nodes["node-b"] != want || nodes.nodes["node-a"] != "" {
			t.Errorf("after %s: %v", verb, nodes.nodes)
		}
	}
	resp, body = f.do("GET", "/v1/nodes", "", as(admin)...)
	var l api.NodeList
	if resp.StatusCode != 200 || json.Unmarshal(body, &l) != nil || len(l.Nodes) != 2 {
		t.Fatalf("list: %d %s", resp.StatusCode, body)
	}
	resp, body = f.do("GET", "/v1/nodes", "", as(k.Key)...)
	wantError(t, resp, body, 403, "forbidden")
	for _, bad := range []string{"Node-B", "-x", strings.Repeat("n", 64), "a%2F..%2Fb", "a.b"} {
		resp, body := f.do("POST", "/v1/nodes/"+bad+"/cordon", "", as(admin)...)
		wantError(t, resp, body, 400, "invalid")
	}
	resp, body = f.do("POST", "/v1/nodes/node-z/cordon", "", as(admin)...)
	wantError(t, resp, body, 404, "not_found")
}
