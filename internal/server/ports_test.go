package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// noTargets serves the port proxy that only gives URLs here.
type noTargets struct{}

func (noTargets) PortTarget(context.Context, string) (netip.Addr, bool, error) {
	return netip.Addr{}, false, errdefs.ErrNotFound
}
func (noTargets) Touch(string) {}

func TestPorts(t *testing.T) {
	f := newFixture(t)
	_, body := f.do("POST", "/v1/sandboxes", api.CreateSandboxRequest{})
	sb := decode[api.Sandbox](t, body)
	if sb.Ports.Public {
		t.Fatal("ports public by default")
	}
	resp, body := f.do("GET", "/v1/sandboxes/"+sb.ID+"/ports/8080?ttl_sec=60", nil)
	u := decode[api.PortURL](t, body)
	if resp.StatusCode != 200 || u.URL != "http://8080-"+sb.ID+".localhost:7401/" || u.Token == "" ||
		!strings.HasPrefix(u.SignedURL, u.URL+"?atoll_expires=") || u.ExpiresAt == nil {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	resp, body = f.do("PUT", "/v1/sandboxes/"+sb.ID+"/ports", api.PortAccess{Public: true})
	if resp.StatusCode != 200 || !decode[api.Sandbox](t, body).Ports.Public {
		t.Fatalf("PUT ports: %d %s", resp.StatusCode, body)
	}
	_, body = f.do("GET", "/v1/sandboxes/"+sb.ID+"/ports/8080", nil)
	if u := decode[api.PortURL](t, body); !u.Public || u.Token != "" || u.SignedURL != "" {
		t.Errorf("public: %s", body)
	}
	for _, tc := range []struct {
		method, path string
		body         any
		want         int
	}{
		{"GET", "/v1/sandboxes/" + sb.ID + "/ports/0", nil, 400},
		{"GET", "/v1/sandboxes/" + sb.ID + "/ports/65536", nil, 400},
		{"GET", "/v1/sandboxes/" + sb.ID + "/ports/http", nil, 400},
		{"GET", "/v1/sandboxes/" + sb.ID + "/ports/-1", nil, 400},
		{"GET", "/v1/sandboxes/" + sb.ID + "/ports/8080?ttl_sec=0", nil, 400},
		{"GET", "/v1/sandboxes/" + sb.ID + "/ports/8080?ttl_sec=99999999999", nil, 400},
		{"GET", "/v1/sandboxes/" + sb.ID + "/ports/8080?ttl_sec=1h", nil, 400},
		{"GET", "/v1/sandboxes/NOTANID/ports/8080", nil, 400},
		{"GET", "/v1/sandboxes/aaaaaaaaaaaaaaaaaaaa/ports/8080", nil, 404},
		{"PUT", "/v1/sandboxes/" + sb.ID + "/ports", `{"public":"yes"}`, 400},
		{"PUT", "/v1/sandboxes/" + sb.ID + "/ports", `{"public":true,"extra":1}`, 400},
		{"PUT", "/v1/sandboxes/aaaaaaaaaaaaaaaaaaaa/ports", api.PortAccess{}, 404},
	} {
		if resp, body := f.do(tc.method, tc.path, tc.body); resp.StatusCode != tc.want {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, resp.StatusCode, body, tc.want)
		}
	}
	// Without a port proxy: 503.
	s, err := New(Config{Sandboxes: f.sbs, Auth: keyAuth(testKey)})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", "/v1/sandboxes/"+sb.ID+"/ports/8080", nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, req)
	if rec.Code != 503 {
		t.Errorf("no proxy: %d %s", rec.Code, rec.Body.String())
	}
}
