package server

import (
	"net/http"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
)

func TestPauseResume(t *testing.T) {
	f := newFixture(t)
	_, body := f.do("POST", "/v1/sandboxes", nil)
	id := decode[api.Sandbox](t, body).ID

	resp, body := f.do("POST", "/v1/sandboxes/"+id+"/pause", nil)
	if resp.StatusCode != 200 || decode[api.Sandbox](t, body).State != api.StatePaused {
		t.Fatalf("pause: %d %s", resp.StatusCode, body)
	}
	resp, body = f.do("POST", "/v1/sandboxes/"+id+"/pause", nil)
	wantError(t, resp, body, http.StatusConflict, "conflict")
	resp, body = f.do("GET", "/v1/sandboxes?state=paused", nil)
	if resp.StatusCode != 200 || len(decode[api.SandboxList](t, body).Sandboxes) != 1 {
		t.Fatalf("list paused: %d %s", resp.StatusCode, body)
	}
	resp, body = f.do("POST", "/v1/sandboxes/"+id+"/exec", api.ExecRequest{Shell: "true"})
	wantError(t, resp, body, http.StatusConflict, "conflict")
	resp, body = f.do("POST", "/v1/sandboxes/"+id+"/resume", nil)
	if resp.StatusCode != 200 || decode[api.Sandbox](t, body).State != api.StateRunning {
		t.Fatalf("resume: %d %s", resp.StatusCode, body)
	}
	resp, body = f.do("POST", "/v1/sandboxes/"+id+"/resume", nil)
	wantError(t, resp, body, http.StatusConflict, "conflict")

	// Without memory: shelved; not together with to_disk.
	resp, body = f.do("POST", "/v1/sandboxes/"+id+"/pause", `{"memory":false,"to_disk":true}`)
	wantError(t, resp, body, http.StatusBadRequest, "invalid")
	resp, body = f.do("POST", "/v1/sandboxes/"+id+"/pause", `{"memory":false}`)
	if resp.StatusCode != 200 || decode[api.Sandbox](t, body).State != api.StateShelved {
		t.Fatalf("pause without memory: %d %s", resp.StatusCode, body)
	}
	resp, body = f.do("GET", "/v1/sandboxes?state=shelved", nil)
	if resp.StatusCode != 200 || len(decode[api.SandboxList](t, body).Sandboxes) != 1 {
		t.Fatalf("list shelved: %d %s", resp.StatusCode, body)
	}
}

func TestFork(t *testing.T) {
	f := newFixture(t)
	_, body := f.do("POST", "/v1/sandboxes", api.CreateSandboxRequest{Template: "py"})
	id := decode[api.Sandbox](t, body).ID

	for _, tc := range []struct {
		name string
		body any
		want int
	}{
		{"empty body", nil, 1},
		{"count 0", `{"count":0}`, 1},
		{"count 3", api.ForkRequest{Count: 3, Labels: map[string]string{"run": "7"}}, 3},
		{"count 100", api.ForkRequest{Count: 100}, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := f.with(t).do("POST", "/v1/sandboxes/"+id+"/fork", tc.body)
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			got := decode[api.SandboxList](t, body).Sandboxes
			if len(got) != tc.want {
				t.Fatalf("%d children, want %d", len(got), tc.want)
			}
			for _, sb := range got {
				if sb.ID == id || sb.Template != "py" {
					t.Errorf("child %+v", sb)
				}
			}
		})
	}
}

func TestSnapshots(t *testing.T) {
	f := newFixture(t)
	_, body := f.do("POST", "/v1/sandboxes", api.CreateSandboxRequest{Template: "py"})
	id := decode[api.Sandbox](t, body).ID
	_, body = f.do("POST", "/v1/sandboxes", nil)
	other := decode[api.Sandbox](t, body).ID

	resp, body := f.do("POST", "/v1/sandboxes/"+id+"/snapshots", api.CreateSnapshotRequest{Name: "before-tests_1.0"})
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %s", resp.StatusCode, body)
	}
	snap := decode[api.Snapshot](t, body)
	if !idPattern.MatchString(snap.ID) || snap.SandboxID != id || snap.Name != "before-tests_1.0" || resp.Header.Get("Location") != "/v1/snapshots/"+snap.ID {
		t.Fatalf("create: %+v, Location %q", snap, resp.Header.Get("Location"))
	}
	// An empty body takes an unnamed snapshot.
	if resp, body := f.do("POST", "/v1/sandboxes/"+id+"/snapshots", nil); resp.StatusCode != http.StatusCreated {
		t.Fatalf("create with empty body: %d %s", resp.StatusCode, body)
	}

	for _, tc := range []struct {
		path string
		want int
	}{
		{"/v1/snapshots", 2},
		{"/v1/snapshots?sandbox=" + id, 2},
		{"/v1/snapshots?sandbox=" + other, 0},
		{"/v1/sandboxes/" + id + "/snapshots", 2},
		{"/v1/sandboxes/" + other + "/snapshots", 0},
	} {
		wantListed(t, f, tc.path, "snapshots", tc.want, func(l api.SnapshotList) int { return len(l.Snapshots) })
	}

	resp, body = f.do("POST", "/v1/sandboxes/"+other+"/restore", api.RestoreRequest{Snapshot: snap.ID})
	if resp.StatusCode != 200 || decode[api.Sandbox](t, body).ID != other {
		t.Fatalf("restore: %d %s", resp.StatusCode, body)
	}

	resp, body = f.do("POST", "/v1/sandboxes", api.CreateSandboxRequest{Snapshot: snap.ID})
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("create from snapshot: %d %s", resp.StatusCode, body)
	}
	child := decode[api.Sandbox](t, body)
	if child.Template != "py" {
		t.Errorf("created from snapshot: template %q, want py", child.Template)
	}
	resp, body = f.do("GET", "/v1/snapshots/"+snap.ID, nil)
	if resp.StatusCode != 200 || decode[api.Snapshot](t, body).Sandboxes != 1 {
		t.Fatalf("get: %d %s", resp.StatusCode, body)
	}
	resp, body = f.do("DELETE", "/v1/snapshots/"+snap.ID, nil)
	wantError(t, resp, body, http.StatusConflict, "conflict")
	f.do("DELETE", "/v1/sandboxes/"+child.ID, nil)
	wantDeleted(t, f, "/v1/snapshots/"+snap.ID)
}

func TestSnapshotBadInput(t *testing.T) {
	f := newFixture(t)
	_, body := f.do("POST", "/v1/sandboxes", nil)
	id := decode[api.Sandbox](t, body).ID
	_, body = f.do("POST", "/v1/sandboxes", nil)
	paused := decode[api.Sandbox](t, body).ID
	f.do("POST", "/v1/sandboxes/"+paused+"/pause", nil)
	_, body = f.do("POST", "/v1/sandboxes/"+id+"/snapshots", nil)
	snap := decode[api.Snapshot](t, body).ID
	const unknown = "abcdefghij0123456789"
	sb := "/v1/sandboxes/" + id

	for _, tc := range []struct {
		name         string
		method, path string
		body         any
		status       int
		code         string
	}{
		{"fork count -1", "POST", sb + "/fork", `{"count":-1}`, 400, "invalid"},
		{"fork count 101", "POST", sb + "/fork", `{"count":101}`, 400, "invalid"},
		{"fork count 10000", "POST", sb + "/fork", `{"count":10000}`, 400, "invalid"},
		{"fork count not a number", "POST", sb + "/fork", `{"count":"2"}`, 400, "invalid"},
		{"fork unknown field", "POST", sb + "/fork", `{"n":2}`, 400, "invalid"},
		{"fork bad label", "POST", sb + "/fork", `{"labels":{"a=b":"c"}}`, 400, "invalid"},
		{"fork bad ID", "POST", "/v1/sandboxes/ABC/fork", nil, 400, "invalid"},
		{"fork unknown sandbox", "POST", "/v1/sandboxes/" + unknown + "/fork", nil, 404, "not_found"},
		{"pause bad ID", "POST", "/v1/sandboxes/abc/pause", nil, 400, "invalid"},
		{"pause unknown sandbox", "POST", "/v1/sandboxes/" + unknown + "/pause", nil, 404, "not_found"},
		{"pause paused", "POST", "/v1/sandboxes/" + paused + "/pause", nil, 409, "conflict"},
		{"resume running", "POST", sb + "/resume", nil, 409, "conflict"},
		{"files of paused", "GET", "/v1/sandboxes/" + paused + "/files?path=/etc/hostname", nil, 409, "conflict"},
		{"restore empty body", "POST", sb + "/restore", nil, 400, "invalid"},
		{"restore no snapshot", "POST", sb + "/restore", `{}`, 400, "invalid"},
		{"restore bad snapshot ID", "POST", sb + "/restore", `{"snapshot":"../../etc"}`, 400, "invalid"},
		{"restore unknown snapshot", "POST", sb + "/restore", api.RestoreRequest{Snapshot: unknown}, 404, "not_found"},
		{"restore unknown sandbox", "POST", "/v1/sandboxes/" + unknown + "/restore", api.RestoreRequest{Snapshot: snap}, 404, "not_found"},
		{"restore paused", "POST", "/v1/sandboxes/" + paused + "/restore", api.RestoreRequest{Snapshot: snap}, 409, "conflict"},
		{"snapshot name with slash", "POST", sb + "/snapshots", `{"name":"a/b"}`, 400, "invalid"},
		{"snapshot name with NUL", "POST", sb + "/snapshots", `{"name":"a\u0000b"}`, 400, "invalid"},
		{"snapshot name dot-dot path", "POST", sb + "/snapshots", `{"name":"../x"}`, 400, "invalid"},
		{"snapshot name too long", "POST", sb + "/snapshots", `{"name":"` + strings.Repeat("a", 64) + `"}`, 400, "invalid"},
		{"snapshot name with space", "POST", sb + "/snapshots", `{"name":"a b"}`, 400, "invalid"},
		{"snapshot unknown field", "POST", sb + "/snapshots", `{"label":"x"}`, 400, "invalid"},
		{"snapshot unknown sandbox", "POST", "/v1/sandboxes/" + unknown + "/snapshots", nil, 404, "not_found"},
		{"list snapshots unknown sandbox", "GET", "/v1/sandboxes/" + unknown + "/snapshots", nil, 404, "not_found"},
		{"list snapshots bad sandbox filter", "GET", "/v1/snapshots?sandbox=x", nil, 400, "invalid"},
		{"get bad snapshot ID", "GET", "/v1/snapshots/ABCDEFGHIJ0123456789", nil, 400, "invalid"},
		{"get short snapshot ID", "GET", "/v1/snapshots/abc", nil, 400, "invalid"},
		{"get unknown snapshot", "GET", "/v1/snapshots/" + unknown, nil, 404, "not_found"},
		{"delete bad snapshot ID", "DELETE", "/v1/snapshots/..%2f..%2fetc", nil, 400, "invalid"},
		{"delete unknown snapshot", "DELETE", "/v1/snapshots/" + unknown, nil, 404, "not_found"},
		{"create from bad snapshot ID", "POST", "/v1/sandboxes", `{"snapshot":"x/y"}`, 400, "invalid"},
		{"create from unknown snapshot", "POST", "/v1/sandboxes", api.CreateSandboxRequest{Snapshot: unknown}, 404, "not_found"},
		{"wrong method", "PUT", "/v1/snapshots/" + snap, nil, 405, "invalid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := f.with(t).do(tc.method, tc.path, tc.body)
			wantError(t, resp, body, tc.status, tc.code)
		})
	}
}
