package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/server"
	"github.com/atoll-dev/atoll/internal/testenv"
	"github.com/atoll-dev/atoll/internal/testenv/memstore"
)

var templateFixture = []api.Template{
	{Name: "host", Source: "builtin", Sandboxes: 3},
	{
		Name: "python", Version: 3, VersionID: "v3c1a9e8f0b5d2e7a6c3", OldVersions: 1,
		Source: "docker.io/library/python:3.12-slim",
		Digest: "sha256:4c1a9e8f0b5d2e7a6c3f9b8d1e0a2c4f6b8d0e2a4c6e8f0a2b4d6f8a0c2e4f6a",
		Layers: []string{
			"sha256:0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9",
			"sha256:f9e8d7c6b5a40f1e2d3c4b5a69788796a5b4c3d2e1f0f9e8d7c6b5a40f1e2d3c",
		},
		Size:       131 << 20,
		Env:        []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"},
		Workdir:    "/app",
		User:       "app",
		Entrypoint: []string{"python3", "-m", "app"},
		Cmd:        []string{"--port", "8080"},
		Sandboxes:  1,
		CreatedAt:  now.Add(-26 * time.Hour),
		Versions: []api.TemplateVersion{
			{ID: "v3c1a9e8f0b5d2e7a6c3", Number: 3, Current: true, Layers: make([]string, 2), Sandboxes: 1, CreatedAt: now.Add(-26 * time.Hour)},
			{ID: "v0d0a9e8f0b5d2e7a6c3", Number: 1, Layers: make([]string, 2), Sandboxes: 2, Snapshots: 1, CreatedAt: now.Add(-72 * time.Hour)},
		},
	},
	{Name: "retired", Removed: true, OldVersions: 1, Sandboxes: 4, Versions: []api.TemplateVersion{
		{ID: "v1111111111111111111", Number: 2, Layers: make([]string, 1), Sandboxes: 4, CreatedAt: now.Add(-48 * time.Hour)},
	}},
	{
		Name: "saved", Version: 1, VersionID: "v00ff00ff00ff00ff00f", Source: "archive",
		Layers:    []string{"sha256:00ff"},
		Size:      4096,
		CreatedAt: now.Add(-5 * time.Minute),
	},
}

func TestRenderTemplates(t *testing.T) {
	goldenTable(t, "template-ls", renderTemplates, templateFixture)
}

func TestRenderTemplate(t *testing.T) {
	for _, tc := range []struct {
		name string
		t    api.Template
	}{
		{"template-inspect", templateFixture[1]},
		{"template-inspect-builtin", templateFixture[0]},
		{"template-inspect-removed", templateFixture[2]},
	} {
		var b bytes.Buffer
		if err := renderTemplate(&b, tc.t, now); err != nil {
			t.Fatal(err)
		}
		golden(t, tc.name, b.String())
	}
}

func TestFormatBytes(t *testing.T) {
	for n, want := range map[int64]string{
		0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB",
		131 << 20: "131.0 MiB", 5 << 30: "5.0 GiB", 3 << 40: "3.0 TiB", 2048 << 40: "2048.0 TiB",
	} {
		if got := formatBytes(n); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}

// progressEvents are an import of two layers, the second of unknown size
// until it is done.
var progressEvents = []api.ImportEvent{
	{Type: "progress", Layer: "sha256:0a1b2c3d4e5f60718293a4b5c6d7e8f9", Bytes: 0, Total: 3 << 20, Layers: 2},
	{Type: "progress", Layer: "sha256:0a1b2c3d4e5f60718293a4b5c6d7e8f9", Bytes: 1 << 20, Total: 3 << 20, Layers: 2},
	{Type: "progress", Layer: "sha256:f9e8d7c6b5a40f1e2d3c4b5a69788796", Bytes: 512, Layers: 2},
	{Type: "progress", Layer: "sha256:0a1b2c3d4e5f60718293a4b5c6d7e8f9", Bytes: 3 << 20, Total: 3 << 20, LayersDone: 1, Layers: 2},
	{Type: "progress", Layer: "sha256:f9e8d7c6b5a40f1e2d3c4b5a69788796", Bytes: 2048, LayersDone: 1, Layers: 2},
	{Type: "progress", Layer: "sha256:f9e8d7c6b5a40f1e2d3c4b5a69788796", Bytes: 4096, LayersDone: 2, Layers: 2},
}

func TestImportProgress(t *testing.T) {
	for _, tty := range []bool{false, true} {
		name := "import-progress-plain"
		if tty {
			name = "import-progress-tty"
		}
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			p := newImportProgress(&b, tty)
			p.now = func() time.Time { return now }
			p.every = 0 // redraw on every event
			for _, ev := range progressEvents {
				p.event(ev)
			}
			p.finish(true)
			golden(t, name, b.String())
		})
	}
	// Redraws are rate limited, but a new or finished layer is drawn at once.
	var b bytes.Buffer
	p := newImportProgress(&b, true)
	p.now = func() time.Time { return now }
	for _, ev := range progressEvents {
		p.event(ev)
	}
	if got := strings.Count(b.String(), "\x1b[K"); got != 1+2+2+2 {
		t.Errorf("%d lines drawn, want 7 (three redraws plus the first)", got)
	}
}

func TestShortLayer(t *testing.T) {
	for in, want := range map[string]string{
		"sha256:0a1b2c3d4e5f60718293a4b5c6d7e8f9":                          "0a1b2c3d4e5f",
		"6900d438ae23692518a0c43b164d2d3de0fc236ec968337142fecb7243b87e3b": "6900d438ae23",
		"sha256:00ff":           "sha256:00ff",
		"blobs/sha256/abc":      "blobs/sha256/abc",
		strings.Repeat("x", 50): strings.Repeat("x", 39) + "…",
	} {
		if got := shortLayer(in); got != want {
			t.Errorf("shortLayer(%q) = %q, want %q", in, got, want)
		}
	}
}

// memTemplates is an in-memory template store for driving the CLI through a
// real server. Archive imports make one layer per tar entry, named after it.
type memTemplates struct {
	memstore.Templates

	mu sync.Mutex
	// bootstrapped is the last bootstrap's request.
	bootstrapped api.BootstrapTemplateRequest
}

// newMemTemplates holds the built-in template, host, that sandboxes
// sandboxes were made from.
func newMemTemplates(sandboxes int) *memTemplates {
	return &memTemplates{Templates: memstore.NewTemplates(api.Template{Name: "host", Source: "builtin", Sandboxes: sandboxes})}
}

func (s *memTemplates) Import(ctx context.Context, req api.ImportTemplateRequest, archive io.Reader, progress func(api.ImportEvent)) (api.Template, error) {
	if s.Has(req.Name) {
		return api.Template{}, fmt.Errorf("template %s already exists: %w", req.Name, errdefs.ErrConflict)
	}
	t := api.Template{Name: req.Name, Source: req.Ref, CreatedAt: time.Now()}
	if archive != nil {
		t.Source = "archive"
		if err := memstore.ImportArchive(&t, archive, progress); err != nil {
			return api.Template{}, err
		}
	} else {
		if req.Username != "" && (req.Username != "bot" || req.Password != "s3cret") {
			return api.Template{}, fmt.Errorf("%w: the registry refused the credentials", errdefs.ErrUnauthorized)
		}
		if req.Insecure {
			t.Source = "http://" + req.Ref
		}
		t.Layers = []string{"sha256:0a1b2c3d4e5f60718293a4b5c6d7e8f9"}
		progress(api.ImportEvent{Layer: t.Layers[0], Bytes: 10, Total: 10, LayersDone: 1, Layers: 1})
	}
	s.Put(t.Name, t)
	return t, nil
}

// Build makes one step per line of the Dockerfile, cached if it ends in
// "# cached"; "RUN false" fails. The template's Layers are the context's
// entries, its Env the build args.
func (s *memTemplates) Build(ctx context.Context, name, dockerfile string, buildArgs map[string]string, buildContext io.Reader, events func(api.BuildEvent)) (api.Template, error) {
	if s.Has(name) {
		return api.Template{}, fmt.Errorf("template %s already exists: %w", name, errdefs.ErrConflict)
	}
	t := api.Template{Name: name, Source: "build", CreatedAt: time.Now()}
	lines, err := memstore.BuildContext(&t, buildContext, dockerfile)
	if err != nil {
		return api.Template{}, err
	}
	for i, l := range lines {
		l, cached := strings.CutSuffix(l, " # cached")
		events(api.BuildEvent{Type: "step", Step: i + 1, Steps: len(lines), Instruction: l, Cached: cached})
		if cmd, ok := strings.CutPrefix(l, "RUN "); ok && !cached {
			events(api.BuildEvent{Type: "log", Step: i + 1, Data: []byte("running ")})
			events(api.BuildEvent{Type: "log", Step: i + 1, Data: []byte(cmd)})
			if cmd == "false" {
				return api.Template{}, fmt.Errorf("%w: step %d: %s: exit status 1", errdefs.ErrInvalid, i+1, l)
			}
		}
	}
	for k, v := range buildArgs {
		t.Env = append(t.Env, k+"="+v)
	}
	slices.Sort(t.Env)
	s.Put(name, t)
	return t, nil
}

func (s *memTemplates) Delete(ctx context.Context, name string) (api.TemplateRemoved, error) {
	t, err := s.Table.Delete(name, func(t api.Template) error {
		if t.Source == "builtin" {
			return fmt.Errorf("%w: the built-in template cannot be deleted", errdefs.ErrConflict)
		}
		return nil
	})
	if err != nil {
		return api.TemplateRemoved{}, err
	}
	out := api.TemplateRemoved{Name: name}
	if t.Sandboxes > 0 {
		out.Held = []api.TemplateVersion{{ID: t.VersionID, Number: t.Version, Layers: t.Layers, Sandboxes: t.Sandboxes}}
	}
	return out, nil
}

// noSandboxes serves no sandboxes; these tests are about templates.
type noSandboxes struct{}

func (noSandboxes) Create(context.Context, api.CreateSandboxRequest) (api.Sandbox, error) {
	return api.Sandbox{}, errdefs.ErrUnavailable
}
func (noSandboxes) Placement(context.Context, string) (api.Placement, error) {
	return api.Placement{}, errdefs.ErrNotFound
}
func (noSandboxes) Get(context.Context, string) (api.Sandbox, error) {
	return api.Sandbox{}, errdefs.ErrNotFound
}
func (noSandboxes) List(context.Context, string, map[string]string) ([]api.Sandbox, error) {
	return nil, nil
}
func (noSandboxes) Stop(context.Context, string) (api.Sandbox, error) {
	return api.Sandbox{}, errdefs.ErrNotFound
}
func (noSandboxes) Start(context.Context, string) (api.Sandbox, error) {
	return api.Sandbox{}, errdefs.ErrNotFound
}
func (noSandboxes) Delete(context.Context, string) error { return errdefs.ErrNotFound }
func (noSandboxes) Shelve(context.Context, string) (api.Sandbox, error) {
	return api.Sandbox{}, errdefs.ErrNotFound
}
func (noSandboxes) Suspend(context.Context, string) (api.Sandbox, error) {
	return api.Sandbox{}, errdefs.ErrUnavailable
}
func (noSandboxes) Pause(context.Context, string) (api.Sandbox, error) {
	return api.Sandbox{}, errdefs.ErrNotFound
}
func (noSandboxes) Archive(context.Context, string) (api.Sandbox, error) {
	return api.Sandbox{}, errdefs.ErrNotFound
}
func (noSandboxes) Resume(context.Context, string) (api.Sandbox, error) {
	return api.Sandbox{}, errdefs.ErrNotFound
}
func (noSandboxes) SetTimeout(context.Context, string, api.TimeoutRequest) (api.Sandbox, error) {
	return api.Sandbox{}, errdefs.ErrNotFound
}
func (noSandboxes) Fork(context.Context, string, api.ForkRequest) ([]api.Sandbox, error) {
	return nil, errdefs.ErrNotFound
}
func (noSandboxes) Restore(context.Context, string, api.RestoreRequest) (api.Sandbox, error) {
	return api.Sandbox{}, errdefs.ErrNotFound
}
func (noSandboxes) CreateSnapshot(context.Context, string, api.CreateSnapshotRequest) (api.Snapshot, error) {
	return api.Snapshot{}, errdefs.ErrNotFound
}
func (noSandboxes) ListSnapshots(context.Context, string) ([]api.Snapshot, error) { return nil, nil }
func (noSandboxes) GetSnapshot(context.Context, string) (api.Snapshot, error) {
	return api.Snapshot{}, errdefs.ErrNotFound
}
func (noSandboxes) DeleteSnapshot(context.Context, string) error { return errdefs.ErrNotFound }
func (noSandboxes) ArchiveSnapshot(context.Context, string) (api.Snapshot, error) {
	return api.Snapshot{}, errdefs.ErrNotFound
}
func (noSandboxes) GetNetwork(context.Context, string) (api.SandboxNetwork, error) {
	return api.SandboxNetwork{}, errdefs.ErrUnavailable
}
func (noSandboxes) SetNetwork(context.Context, string, api.NetworkPolicy) (api.SandboxNetwork, error) {
	return api.SandboxNetwork{}, errdefs.ErrUnavailable
}
func (noSandboxes) SetPorts(context.Context, string, api.PortAccess) (api.Sandbox, error) {
	return api.Sandbox{}, errdefs.ErrNotFound
}
func (noSandboxes) Metrics(context.Context, string, time.Time, time.Time) ([]api.Metric, error) {
	return nil, errdefs.ErrNotFound
}
func (noSandboxes) AgentDialer(context.Context, string) (func(context.Context) (net.Conn, error), error) {
	return nil, errdefs.ErrNotFound
}

type oneKey string

func (k oneKey) Authenticate(ctx context.Context, key string) (string, error) {
	if key != string(k) {
		return "", errdefs.ErrUnauthorized
	}
	return "default", nil
}

// cliAgainst starts a server in this process with the services in cfg, and
// the API key "k", and returns a function that runs the CLI against it:
// args with --url, --api-key and a --data of its own added, stdin as its
// input.
func cliAgainst(t *testing.T, cfg server.Config) func(stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cfg.Auth = oneKey("k")
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return func(stdin string, args ...string) (string, string, error) {
		t.Helper()
		root := newRootCmd()
		var out, errOut bytes.Buffer
		root.SetIn(strings.NewReader(stdin))
		root.SetOut(&out)
		root.SetErr(&errOut)
		root.SetArgs(append(args, "--url", ts.URL, "--api-key", "k", "--data", t.TempDir()))
		err := root.ExecuteContext(context.Background())
		return out.String(), errOut.String(), err
	}
}

// TestTemplateCommands drives "atoll template" against a server in this
// process.
func TestTemplateCommands(t *testing.T) {
	tpls := newMemTemplates(2)
	run := cliAgainst(t, server.Config{Sandboxes: noSandboxes{}, Templates: tpls})

	dir := t.TempDir()
	archive := filepath.Join(dir, "image.tar")
	image := testenv.Tar("manifest.json", "[]").Bytes()
	os.WriteFile(archive, image, 0o644)
	layout := filepath.Join(dir, "layout")
	os.MkdirAll(filepath.Join(layout, "blobs", "sha256"), 0o755)
	os.WriteFile(filepath.Join(layout, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644)
	os.WriteFile(filepath.Join(layout, "index.json"), []byte(`{}`), 0o644)
	os.WriteFile(filepath.Join(layout, "blobs", "sha256", "ab"), []byte("blob"), 0o644)
	notLayout := filepath.Join(dir, "plain")
	os.Mkdir(notLayout, 0o755)

	for _, tc := range []struct {
		name       string
		stdin      string
		args       []string
		layers     []string // of the template made
		source     string
		wantStderr string
	}{
		{"registry", "", []string{"docker.io/library/alpine:3.20", "--name", "alpine"}, []string{"sha256:0a1b2c3d4e5f60718293a4b5c6d7e8f9"}, "docker.io/library/alpine:3.20", "0a1b2c3d4e5f  10 B  done\n"},
		{"credentials", "s3cret\n", []string{"ghcr.io/org/app:1", "--name", "app", "--username", "bot", "--password-stdin"}, nil, "ghcr.io/org/app:1", ""},
		{"insecure", "", []string{"localhost:5000/dev", "--name", "dev", "--insecure"}, nil, "http://localhost:5000/dev", ""},
		{"archive file", "", []string{archive, "--name", "file"}, []string{"manifest.json"}, "archive", "manifest.json  2 B  done\n"},
		{"archive on stdin", string(image), []string{"-", "--name", "stdin"}, []string{"manifest.json"}, "archive", ""},
		{"OCI layout", "", []string{layout, "--name", "layout"}, []string{"blobs/", "blobs/sha256/", "blobs/sha256/ab", "index.json", "oci-layout"}, "archive", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, stderr, err := run(tc.stdin, append([]string{"template", "import"}, tc.args...)...)
			if err != nil {
				t.Fatalf("%v; stderr %s", err, stderr)
			}
			name := tc.args[slices.Index(tc.args, "--name")+1]
			if stdout != name+"\n" {
				t.Errorf("stdout %q, want the name", stdout)
			}
			if tc.wantStderr != "" && stderr != tc.wantStderr {
				t.Errorf("stderr %q, want %q", stderr, tc.wantStderr)
			}
			got, _ := tpls.Get(context.Background(), name)
			if got.Source != tc.source || (tc.layers != nil && !cmp.Equal(got.Layers, tc.layers)) {
				t.Errorf("template %+v, want source %s, layers %v", got, tc.source, tc.layers)
			}
		})
	}

	for _, tc := range []struct {
		name  string
		stdin string
		args  []string
		want  string
	}{
		{"no name", "", []string{"alpine"}, `required flag(s) "name" not set`},
		{"bad name", "", []string{"alpine", "--name", "Alpine"}, "malformed template name"},
		{"name taken", "", []string{"alpine", "--name", "host"}, "importing alpine: template host already exists"},
		{"wrong password", "nope\n", []string{"ghcr.io/org/app:1", "--name", "x", "--username", "bot", "--password-stdin"}, "refused the credentials"},
		{"password without user", "pw", []string{"ghcr.io/org/app:1", "--name", "x", "--password-stdin"}, "--password-stdin needs --username"},
		{"empty password", "", []string{"ghcr.io/org/app:1", "--name", "x", "--username", "bot", "--password-stdin"}, "standard input is empty"},
		{"missing file", "", []string{"./nope.tar", "--name", "x"}, "./nope.tar: no such file or directory"},
		{"not a layout", "", []string{notLayout, "--name", "x"}, "not an OCI image layout"},
		{"registry flags on an archive", "", []string{archive, "--name", "x", "--insecure"}, "are for registry references"},
		{"not a tar", "junk junk junk", []string{"-", "--name", "x"}, "not an image archive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := run(tc.stdin, append([]string{"template", "import"}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}

	stdout, _, err := run("", "template", "ls", "-q")
	if want := "alpine\napp\ndev\nfile\nhost\nlayout\nstdin\n"; err != nil || stdout != want {
		t.Errorf("template ls -q: %q, %v; want %q", stdout, err, want)
	}
	stdout, _, err = run("", "template", "ls")
	if err != nil || !strings.HasPrefix(stdout, "NAME ") || !strings.Contains(stdout, "docker.io/library/alpine:3.20") {
		t.Errorf("template ls: %v\n%s", err, stdout)
	}
	stdout, _, err = run("", "template", "ls", "--json")
	var l api.TemplateList
	if err != nil || json.Unmarshal([]byte(stdout), &l) != nil || len(l.Templates) != 7 {
		t.Errorf("template ls --json: %v\n%s", err, stdout)
	}
	stdout, _, err = run("", "template", "inspect", "alpine")
	if err != nil || !strings.Contains(stdout, "Source:") || !strings.Contains(stdout, "Layers (1):") {
		t.Errorf("template inspect: %v\n%s", err, stdout)
	}
	stdout, _, err = run("", "template", "inspect", "--json", "alpine")
	var tpl api.Template
	if err != nil || json.Unmarshal([]byte(stdout), &tpl) != nil || tpl.Name != "alpine" {
		t.Errorf("template inspect --json: %v\n%s", err, stdout)
	}
	if _, _, err := run("", "template", "inspect", "nope"); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("template inspect nope: %v", err)
	}
	// A removed name's versions in use stay, and rm says so.
	tpls.Update("app", func(app *api.Template) error {
		app.Version, app.VersionID, app.Sandboxes = 1, "v0123456789abcdef012", 1
		return nil
	})
	stdout, stderr, err := run("", "template", "rm", "alpine", "host", "nope", "app")
	if err != (exitError{1}) || stdout != "alpine\napp\n  version 1 (v0123456789abcdef012) stays until unused: used by 1 sandbox\n" ||
		!strings.Contains(stderr, "the built-in template cannot be deleted") || !strings.Contains(stderr, "atoll: nope: template nope: not found") {
		t.Errorf("template rm: %v\nstdout %q\nstderr %q", err, stdout, stderr)
	}

	// bootstrap base is a Debian bootstrap with atoll's base Dockerfile
	// over it, named base unless --name says otherwise.
	for _, tc := range []struct {
		args       []string
		want       api.BootstrapTemplateRequest
		wantStderr string
	}{
		{[]string{"base"}, api.BootstrapTemplateRequest{Name: "base", Distro: "debian", Build: "base"}, "Step 1/4: FROM debian\n"},
		{[]string{"base", "--name", "e2b-base", "--suite", "trixie"}, api.BootstrapTemplateRequest{Name: "e2b-base", Distro: "debian", Suite: "trixie", Build: "base"}, ""},
		{[]string{"debian", "--name", "deb"}, api.BootstrapTemplateRequest{Name: "deb", Distro: "debian"}, ""},
		{[]string{"code-interpreter", "--build-arg", "NPM_REGISTRY=http://npm.test/", "--build-arg", "EMPTY="},
			api.BootstrapTemplateRequest{Name: "code-interpreter", Distro: "debian", Build: "code-interpreter",
				BuildArgs: map[string]string{"NPM_REGISTRY": "http://npm.test/", "EMPTY": ""}}, ""},
	} {
		stdout, stderr, err := run("", append([]string{"template", "bootstrap"}, tc.args...)...)
		got := tpls.bootstrapped
		if tc.want.Suite == "" {
			tc.want.Suite = "bookworm"
		}
		tc.want.Mirror, tc.want.Variant = "http://deb.debian.org/debian", "minbase"
		if err != nil || stdout != tc.want.Name+"\n" || !reflect.DeepEqual(got, tc.want) || !strings.Contains(stderr, tc.wantStderr) {
			t.Errorf("template bootstrap %v: %v, stdout %q, stderr %q, request %+v, want %+v", tc.args, err, stdout, stderr, got, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"debian"}, `required flag "name" not set`},
		{[]string{"python"}, `build "python": atoll ships base`},
		{[]string{"../base", "--name", "x"}, `atoll ships base`},
		{[]string{"base", "--name", "Base"}, "malformed template name"},
		{[]string{"debian", "--name", "deb", "--build-arg", "A=b"}, "debian builds no Dockerfile"},
		{[]string{"base", "--build-arg", "=b"}, `--build-arg "=b": want K=V or K`},
	} {
		if _, _, err := run("", append([]string{"template", "bootstrap"}, tc.args...)...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("template bootstrap %v: %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

// TestOpenArchiveReleases checks that an OCI layout's tar writer goroutine
// ends when the import stops reading early.
func TestOpenArchiveReleases(t *testing.T) {
	layout := t.TempDir()
	os.WriteFile(filepath.Join(layout, "oci-layout"), []byte("{}"), 0o644)
	os.WriteFile(filepath.Join(layout, "big"), make([]byte, 4<<20), 0o644)
	r, release, err := openArchive(layout, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadFull(r, make([]byte, 1024))
	done := make(chan struct{})
	go func() { release(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("release did not return")
	}
}

func (s *memTemplates) Bootstrap(ctx context.Context, req api.BootstrapTemplateRequest, events func(api.BuildEvent)) (api.Template, error) {
	events(api.BuildEvent{Type: "log", Data: []byte("I: Base system installed successfully.\n")})
	if req.Build != "" {
		events(api.BuildEvent{Type: "step", Step: 1, Steps: 4, Instruction: "FROM debian"})
	}
	t := api.Template{Name: req.Name, Source: "debootstrap " + req.Suite, Layers: []string{"l"}}
	s.Put(req.Name, t)
	s.mu.Lock()
	s.bootstrapped = req
	s.mu.Unlock()
	return t, nil
}
