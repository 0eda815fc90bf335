package e2b

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/audit"
	"github.com/atoll-dev/atoll/internal/dockerfile"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
)

// none is a sandbox and template service that holds nothing: every route
// runs to its own answer (mostly not found), which is all the audit needs.
type none struct{}

var errNone = errdefs.ErrNotFound

func (none) Create(context.Context, api.CreateSandboxRequest) (api.Sandbox, error) {
	return api.Sandbox{}, errNone
}
func (none) Get(context.Context, string) (api.Sandbox, error) { return api.Sandbox{}, errNone }
func (none) List(context.Context, string, map[string]string) ([]api.Sandbox, error) {
	return nil, nil
}
func (none) Start(context.Context, string) (api.Sandbox, error)  { return api.Sandbox{}, errNone }
func (none) Delete(context.Context, string) error                { return errNone }
func (none) Pause(context.Context, string) (api.Sandbox, error)  { return api.Sandbox{}, errNone }
func (none) Resume(context.Context, string) (api.Sandbox, error) { return api.Sandbox{}, errNone }
func (none) Shelve(context.Context, string) (api.Sandbox, error) { return api.Sandbox{}, errNone }
func (none) SetTimeout(context.Context, string, api.TimeoutRequest) (api.Sandbox, error) {
	return api.Sandbox{}, errNone
}
func (none) Fork(context.Context, string, api.ForkRequest) ([]api.Sandbox, error) {
	return nil, errNone
}
func (none) CreateSnapshot(context.Context, string, api.CreateSnapshotRequest) (api.Snapshot, error) {
	return api.Snapshot{}, errNone
}
func (none) ListSnapshots(context.Context, string) ([]api.Snapshot, error) { return nil, nil }
func (none) GetSnapshot(context.Context, string) (api.Snapshot, error) {
	return api.Snapshot{}, errNone
}
func (none) DeleteSnapshot(context.Context, string) error { return errNone }
func (none) AgentDialer(context.Context, string) (func(context.Context) (net.Conn, error), error) {
	return nil, errNone
}
func (none) SetNetwork(context.Context, string, api.NetworkPolicy) (api.SandboxNetwork, error) {
	return api.SandboxNetwork{}, errNone
}
func (none) Metrics(context.Context, string, time.Time, time.Time) ([]api.Metric, error) {
	return nil, errNone
}
func (none) LatestMetrics(context.Context, []string) (map[string]api.Metric, error) { return nil, nil }
func (none) BuildSteps(context.Context, string, []dockerfile.Instruction, func(api.BuildEvent)) (api.Template, error) {
	return api.Template{}, errNone
}
func (none) AddBuildFiles(context.Context, string, io.Reader) error { return errNone }
func (none) HasBuildFiles(string) bool                              { return false }
func (none) Tag(context.Context, string, string) (api.Template, error) {
	return api.Template{}, errNone
}

type templatesOf struct{ none }

func (templatesOf) Get(context.Context, string) (api.Template, error) { return api.Template{}, errNone }
func (templatesOf) List(context.Context) ([]api.Template, error)      { return nil, nil }
func (templatesOf) Delete(context.Context, string) (api.TemplateRemoved, error) {
	return api.TemplateRemoved{}, errNone
}

type adminKey struct{}

func (adminKey) Authenticate(ctx context.Context, key string) (string, error) {
	if key != "atoll_test" {
		return "", errdefs.ErrUnauthorized
	}
	return "default", nil
}

// TestEveryChangeIsAudited walks the E2B API's routes: every one whose
// method asks for a change leaves an audit row naming it.
func TestEveryChangeIsAudited(t *testing.T) {
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	rec := audit.New(audit.Config{Journal: st, Logger: quiet})
	defer rec.Close()
	s, err := New(Config{Sandboxes: none{}, Templates: templatesOf{}, Auth: rec.Auth(adminKey{}), TokenKey: make([]byte, 32), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ts := httptest.NewServer(rec.Wrap(s))
	defer ts.Close()
	want := map[string]bool{}
	for _, p := range s.Routes() {
		method, path, ok := strings.Cut(p, " ")
		if !ok || !audit.Mutating(method) {
			continue
		}
		for _, w := range []string{"{sandboxID}", "{templateID}", "{buildID}", "{hash}"} {
			path = strings.ReplaceAll(path, w, "x0123456789abcdefghi")
		}
		req, _ := http.NewRequest(method, ts.URL+path, strings.NewReader("{}"))
		req.Header.Set("X-API-Key", "atoll_test")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		want[p] = true
	}
	if len(want) < 12 {
		t.Fatalf("only %d changing routes: the walk is broken", len(want))
	}
	rec.Close()
	entries, err := st.Audit(context.Background(), store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		// The build files upload is authorised by its URL's signature,
		// not a key.
		if e.Action != "PUT /templates/{templateID}/files/{hash}" && e.Tenant != "default" {
			t.Errorf("entry without the key's tenant: %+v", e)
		}
		delete(want, e.Action)
	}
	for p := range want {
		t.Errorf("%s left no audit entry", p)
	}
}
