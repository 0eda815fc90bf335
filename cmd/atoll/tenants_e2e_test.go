package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/network/nettest"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// v1 sends one request to atoll's API with key and returns the status and
// body.
func (d *daemon) v1(t *testing.T, method, path, key, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, d.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	hc := http.DefaultClient
	if d.netns != "" {
		// In the daemon's namespace, as its clients dial.
		hc = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			err = nettest.In(d.netns, func() (err error) {
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		}}}
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// wantV1 checks a status and, for errors, atoll's {"code","message"} with
// code.
func wantV1(t *testing.T, what string, status int, body []byte, wantStatus int, wantCode string) {
	t.Helper()
	if status != wantStatus {
		t.Errorf("%s: %d %s, want %d", what, status, body, wantStatus)
		return
	}
	if wantCode != "" {
		var e api.Error
		if err := json.Unmarshal(body, &e); err != nil || e.Code != wantCode || e.Message == "" {
			t.Errorf("%s: body %s, want code %q", what, body, wantCode)
		}
	}
}

// TestTenants checks that API keys of different tenants see only their own
// sandboxes and snapshots through every route of atoll's API, that only
// admin keys manage keys and templates, and that revoking a key takes
// effect at once and survives a restart.
func TestTenants(t *testing.T) {
	testenv.RequireRoot(t)
	data := filepath.Join(testenv.Dir(t), "data")
	d := startDaemon(t, data, "--warm-pool", "1")
	admin := d.key
	mkKey := func(key string, req api.CreateKeyRequest) api.APIKey {
		t.Helper()
		b, _ := json.Marshal(req)
		status, body := d.v1(t, "POST", "/v1/keys", key, string(b))
		wantV1(t, "create key", status, body, 201, "")
		var k api.APIKey
		if err := json.Unmarshal(body, &k); err != nil || !strings.HasPrefix(k.Key, "atoll_") {
			t.Fatalf("create key answered %s", body)
		}
		return k
	}
	a := mkKey(admin, api.CreateKeyRequest{Name: "Team-A"})
	if a.Tenant != "team-a" || a.Admin || len(a.ID) != 20 {
		t.Errorf("key of team A: %+v", a)
	}
	a2 := mkKey(admin, api.CreateKeyRequest{Name: "ci", Tenant: "team-a"})
	b := mkKey(admin, api.CreateKeyRequest{Name: "team-b"})

	create := func(key string) string {
		t.Helper()
		status, body := d.v1(t, "POST", "/v1/sandboxes", key, `{"labels":{"t":"x"}}`)
		wantV1(t, "create", status, body, 201, "")
		var sb api.Sandbox
		json.Unmarshal(body, &sb)
		return sb.ID
	}
	sa := create(a.Key)
	sb := create(b.Key)
	sAdmin := create(admin)
	status, body := d.v1(t, "POST", "/v1/sandboxes/"+sa+"/snapshots", a.Key, `{"name":"a-snap"}`)
	wantV1(t, "snapshot", status, body, 201, "")
	var snap api.Snapshot
	json.Unmarshal(body, &snap)

	t.Run("lists", func(t *testing.T) {
		for _, c := range []struct {
			key  string
			want []string
		}{{a.Key, []string{sa}}, {a2.Key, []string{sa}}, {b.Key, []string{sb}}, {admin, []string{sAdmin}}} {
			status, body := d.v1(t, "GET", "/v1/sandboxes", c.key, "")
			wantV1(t, "list", status, body, 200, "")
			var list api.SandboxList
			json.Unmarshal(body, &list)
			var ids []string
			for _, s := range list.Sandboxes {
				ids = append(ids, s.ID)
			}
			if !slices.Equal(ids, c.want) {
				t.Errorf("list: %v, want %v", ids, c.want)
			}
		}
		for _, c := range []struct {
			key  string
			want int
		}{{a.Key, 1}, {b.Key, 0}, {admin, 0}} {
			status, body := d.v1(t, "GET", "/v1/snapshots", c.key, "")
			var list api.SnapshotList
			json.Unmarshal(body, &list)
			if status != 200 || len(list.Snapshots) != c.want {
				t.Errorf("snapshots: %d %s, want %d of them", status, body, c.want)
			}
		}
	})

	t.Run("another tenant's sandbox is not found", func(t *testing.T) {
		routes := []struct{ method, path, body string }{
			{"GET", "", ""}, {"DELETE", "", ""}, {"POST", "/stop", ""}, {"POST", "/start", ""},
			{"POST", "/pause", ""}, {"POST", "/resume", ""}, {"POST", "/archive", ""},
			{"POST", "/timeout", `{"timeout_sec":60}`}, {"GET", "/network", ""},
			{"PUT", "/network", `{"egress":"deny-all"}`}, {"PUT", "/ports", `{"public":true}`},
			{"GET", "/ports/8080", ""}, {"POST", "/fork", `{"count":1}`},
			{"POST", "/restore", `{"snapshot":"` + snap.ID + `"}`}, {"POST", "/snapshots", `{}`},
			{"GET", "/snapshots", ""},
		}
		for _, ar := range []struct{ method, path string }{
			{"GET", "/health"}, {"POST", "/exec"}, {"GET", "/processes"}, {"GET", "/processes/1"},
			{"GET", "/processes/1/attach"}, {"POST", "/processes/1/stdin"}, {"POST", "/processes/1/stdin/close"},
			{"POST", "/processes/1/signal"}, {"POST", "/processes/1/resize"}, {"GET", "/processes/1/ws"},
			{"GET", "/files?path=/etc/hostname"}, {"PUT", "/files?path=/tmp/x"}, {"DELETE", "/files?path=/tmp"},
			{"GET", "/files/stat?path=/"}, {"GET", "/files/list?path=/"}, {"POST", "/files/mkdir"},
			{"POST", "/files/rename"}, {"POST", "/files/chmod"}, {"GET", "/files/tar?path=/tmp"},
			{"PUT", "/files/tar?path=/tmp"}, {"GET", "/files/watch?path=/tmp"},
		} {
			body := ""
			if ar.method == "POST" || ar.method == "PUT" {
				body = `{"cmd":["true"],"path":"/tmp/x","signal":"KILL"}`
			}
			routes = append(routes, struct{ method, path, body string }{ar.method, ar.path, body})
		}
		for _, c := range []struct{ key, id string }{{b.Key, sa}, {admin, sa}, {a.Key, sb}, {a2.Key, sAdmin}} {
			for _, rt := range routes {
				path := "/v1/sandboxes/" + c.id + rt.path
				status, body := d.v1(t, rt.method, path, c.key, rt.body)
				if rt.path == "/snapshots" && rt.method == "GET" {
					// Listing by sandbox shows none of another tenant's.
					wantV1(t, rt.method+" "+path, status, body, 200, "")
					if strings.Contains(string(body), snap.ID) {
						t.Errorf("%s lists another tenant's snapshot: %s", path, body)
					}
					continue
				}
				wantV1(t, rt.method+" "+path, status, body, 404, "not_found")
			}
		}
		// Their snapshot, by ID or to create from.
		for _, rt := range []struct{ method, path, body string }{
			{"GET", "/v1/snapshots/" + snap.ID, ""}, {"DELETE", "/v1/snapshots/" + snap.ID, ""},
			{"POST", "/v1/snapshots/" + snap.ID + "/archive", ""},
			{"POST", "/v1/sandboxes", `{"snapshot":"` + snap.ID + `"}`},
			{"POST", "/v1/sandboxes/" + sb + "/restore", `{"snapshot":"` + snap.ID + `"}`},
		} {
			status, body := d.v1(t, rt.method, rt.path, b.Key, rt.body)
			wantV1(t, rt.method+" "+rt.path+" with another tenant's snapshot", status, body, 404, "not_found")
		}
		// Still all there for their owners.
		for _, c := range []struct{ key, id string }{{a.Key, sa}, {a2.Key, sa}, {b.Key, sb}, {admin, sAdmin}} {
			status, body := d.v1(t, "GET", "/v1/sandboxes/"+c.id, c.key, "")
			wantV1(t, "get own", status, body, 200, "")
		}
		status, body := d.v1(t, "POST", "/v1/sandboxes/"+sa+"/exec", a2.Key, `{"cmd":["echo","hi"]}`)
		wantV1(t, "exec by the tenant's other key", status, body, 200, "")
		// A fork is its parent's tenant's.
		status, body = d.v1(t, "POST", "/v1/sandboxes/"+sa+"/fork", a.Key, `{"count":1}`)
		wantV1(t, "fork", status, body, 201, "")
		var kids []api.Sandbox
		json.Unmarshal(body, &kids)
		if len(kids) == 1 {
			status, body = d.v1(t, "GET", "/v1/sandboxes/"+kids[0].ID, b.Key, "")
			wantV1(t, "another tenant's fork", status, body, 404, "not_found")
			status, body = d.v1(t, "DELETE", "/v1/sandboxes/"+kids[0].ID, a2.Key, "")
			wantV1(t, "delete the fork", status, body, 204, "")
		}
	})

	t.Run("keys", func(t *testing.T) {
		for _, rt := range []struct{ method, path, body string }{
			{"POST", "/v1/keys", `{"name":"x"}`}, {"GET", "/v1/keys", ""}, {"DELETE", "/v1/keys/" + b.ID, ""},
			{"POST", "/v1/templates/import", `{"name":"x","ref":"example.com/x"}`}, {"DELETE", "/v1/templates/host", ""},
			{"POST", "/v1/templates/host/tag", `{"tag":"y"}`},
		} {
			status, body := d.v1(t, rt.method, rt.path, a.Key, rt.body)
			wantV1(t, rt.method+" "+rt.path+" with a tenant's key", status, body, 403, "forbidden")
		}
		status, body := d.v1(t, "GET", "/v1/templates", a.Key, "")
		wantV1(t, "templates are shared", status, body, 200, "")
		for _, c := range []struct {
			body   string
			status int
		}{
			{`{}`, 400}, {`{"name":"has space"}`, 400}, {`{"name":"` + strings.Repeat("n", 64) + `"}`, 400},
			{`{"name":"ok","tenant":"Bad"}`, 400}, {`{"name":"ok","tenant":"-x"}`, 400}, {`{"name":"_x"}`, 400},
			{`{"name":`, 400}, {`[1]`, 400},
		} {
			status, body := d.v1(t, "POST", "/v1/keys", admin, c.body)
			wantV1(t, "create key "+c.body, status, body, c.status, "invalid")
		}
		for _, id := range []string{"x", "zzzzzzzzzzzzzzzzzzzz", strings.Repeat("a", 300)} {
			status, body := d.v1(t, "DELETE", "/v1/keys/"+id, admin, "")
			wantV1(t, "delete key "+id, status, body, 400, "invalid")
		}
		status, body = d.v1(t, "DELETE", "/v1/keys/00000000000000000000", admin, "")
		wantV1(t, "delete an unknown key", status, body, 404, "not_found")
		status, body = d.v1(t, "GET", "/v1/keys", admin, "")
		wantV1(t, "list keys", status, body, 200, "")
		var list api.APIKeyList
		json.Unmarshal(body, &list)
		ks := list.Keys
		var adminID string
		for _, k := range ks {
			if k.Key != "" {
				t.Errorf("key list shows a key: %+v", k)
			}
			if k.Admin {
				adminID = k.ID
			}
		}
		if len(ks) != 4 || adminID == "" {
			t.Errorf("keys: %s", body)
		}
		status, body = d.v1(t, "DELETE", "/v1/keys/"+adminID, admin, "")
		wantV1(t, "delete the last admin key", status, body, 409, "conflict")
		// Revoking works at once; the tenant's other key keeps working.
		status, body = d.v1(t, "DELETE", "/v1/keys/"+a.ID, admin, "")
		wantV1(t, "revoke", status, body, 204, "")
		status, body = d.v1(t, "GET", "/v1/sandboxes", a.Key, "")
		wantV1(t, "a revoked key", status, body, 401, "unauthorized")
		status, body = d.v1(t, "GET", "/v1/sandboxes/"+sa, a2.Key, "")
		wantV1(t, "the tenant's other key", status, body, 200, "")
		// The CLI.
		out, code := d.cli("key", "create", "--name", "from-cli")
		if code != 0 || !strings.HasPrefix(out, "atoll_") {
			t.Errorf("atoll key create: %d %s", code, out)
		}
		out, code = d.cli("key", "ls")
		if code != 0 || !strings.Contains(out, "from-cli") || !strings.Contains(out, "team-b") || strings.Contains(out, "atoll_") {
			t.Errorf("atoll key ls: %d %s", code, out)
		}
	})

	t.Run("restart", func(t *testing.T) {
		d.stop()
		d.start()
		status, body := d.v1(t, "GET", "/v1/sandboxes/"+sa, b.Key, "")
		wantV1(t, "another tenant's sandbox after a restart", status, body, 404, "not_found")
		status, body = d.v1(t, "GET", "/v1/sandboxes/"+sa, a2.Key, "")
		wantV1(t, "own sandbox after a restart", status, body, 200, "")
		status, body = d.v1(t, "GET", "/v1/sandboxes", a.Key, "")
		wantV1(t, "a revoked key after a restart", status, body, 401, "unauthorized")
		for _, c := range []struct{ key, id string }{{a2.Key, sa}, {b.Key, sb}} {
			status, body := d.v1(t, "DELETE", "/v1/sandboxes/"+c.id, c.key, "")
			wantV1(t, "delete own", status, body, 204, "")
		}
	})
}
