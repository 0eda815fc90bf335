package server

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// memTemplates is a small in-memory Templates. Registry imports make two
// layers of the reference's name; archive imports make one layer per tar entry.
type memTemplates struct {
	release chan struct{} // lets an import of ref "slow" finish

	mu    sync.Mutex
	tpls  map[string]api.Template
	inUse map[string]bool
}

var created = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func newMemTemplates() *memTemplates {
	return &memTemplates{
		release: make(chan struct{}),
		tpls:    map[string]api.Template{"host": {Name: "host", Source: "builtin", CreatedAt: created}},
		inUse:   map[string]bool{"host": true},
	}
}

func (m *memTemplates) Import(ctx context.Context, req api.ImportTemplateRequest, archive io.Reader, progress func(api.ImportEvent)) (api.Template, error) {
	if (req.Ref == "") == (archive == nil) {
		return api.Template{}, errors.New("want exactly one of ref and archive")
	}
	m.mu.Lock()
	_, exists := m.tpls[req.Name]
	m.mu.Unlock()
	if exists {
		return api.Template{}, fmt.Errorf("template %s exists: %w", req.Name, errdefs.ErrConflict)
	}
	t := api.Template{Name: req.Name, Source: req.Ref, CreatedAt: created}
	switch {
	case archive != nil:
		t.Source = "archive"
		tr := tar.NewReader(archive)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				return api.Template{}, fmt.Errorf("%w: reading archive: %v", errdefs.ErrInvalid, err)
			}
			n, err := io.Copy(io.Discard, tr)
			if err != nil {
				return api.Template{}, fmt.Errorf("%w: reading archive: %v", errdefs.ErrInvalid, err)
			}
			t.Layers = append(t.Layers, h.Name)
			t.Size += n
			progress(api.ImportEvent{Layer: h.Name, Bytes: n, Total: n, LayersDone: len(t.Layers)})
		}
	case req.Ref == "registry.example/explode":
		progress(api.ImportEvent{Layer: "sha256:aa", Bytes: 1})
		return api.Template{}, errors.New("writing /var/lib/atoll/layers/aa: input/output error")
	case req.Ref == "registry.example/missing":
		return api.Template{}, fmt.Errorf("image registry.example/missing: %w", errdefs.ErrNotFound)
	default:
		for i, l := range []string{"sha256:aa", "sha256:bb"} {
			// A wrong Type: the server must send it as progress all the same.
			progress(api.ImportEvent{Type: "done", Layer: l, Bytes: 5, Total: 10, LayersDone: i, Layers: 2})
			if req.Ref == "slow" && i == 0 {
				select {
				case <-m.release:
				case <-ctx.Done():
					return api.Template{}, ctx.Err()
				}
			}
			progress(api.ImportEvent{Layer: l, Bytes: 10, Total: 10, LayersDone: i + 1, Layers: 2})
			t.Layers = append(t.Layers, l)
			t.Size += 10
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tpls[t.Name] = t
	return t, nil
}

func (m *memTemplates) List(ctx context.Context) ([]api.Template, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []api.Template
	for _, t := range m.tpls {
		out = append(out, t)
	}
	return out, nil
}

func (m *memTemplates) Get(ctx context.Context, name string) (api.Template, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.tpls[name]
	if !ok {
		return api.Template{}, fmt.Errorf("template %s: %w", name, errdefs.ErrNotFound)
	}
	return t, nil
}

func (m *memTemplates) Delete(ctx context.Context, name string) (api.TemplateRemoved, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.tpls[name]; !ok {
		return api.TemplateRemoved{}, fmt.Errorf("template %s: %w", name, errdefs.ErrNotFound)
	}
	if m.inUse[name] {
		return api.TemplateRemoved{}, fmt.Errorf("template %s is the built-in one: %w", name, errdefs.ErrConflict)
	}
	delete(m.tpls, name)
	return api.TemplateRemoved{Name: name}, nil
}

// Build reads the build context and builds one step per line of the
// Dockerfile. The first step is reported as soon as the Dockerfile has been
// read, before the rest of the context; RUN steps log their command, and
// "RUN false" fails. The template's Env lists the build args.
func (m *memTemplates) Build(ctx context.Context, name, dockerfile string, buildArgs map[string]string, buildContext io.Reader, events func(api.BuildEvent)) (api.Template, error) {
	m.mu.Lock()
	_, exists := m.tpls[name]
	m.mu.Unlock()
	if exists {
		return api.Template{}, fmt.Errorf("template %s exists: %w", name, errdefs.ErrConflict)
	}
	var lines []string
	tr := tar.NewReader(buildContext)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return api.Template{}, fmt.Errorf("%w: reading build context: %v", errdefs.ErrInvalid, err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return api.Template{}, fmt.Errorf("%w: reading build context: %v", errdefs.ErrInvalid, err)
		}
		if h.Name == dockerfile {
			lines = strings.Split(strings.TrimSpace(string(b)), "\n")
			events(api.BuildEvent{Type: "step", Step: 1, Steps: len(lines), Instruction: lines[0], Cached: true})
		}
	}
	if lines == nil {
		return api.Template{}, fmt.Errorf("%w: no %s in the build context", errdefs.ErrInvalid, dockerfile)
	}
	for i, l := range lines[1:] {
		// A wrong Type: the server must send it as a step all the same.
		events(api.BuildEvent{Type: "done", Step: i + 2, Steps: len(lines), Instruction: l})
		if cmd, ok := strings.CutPrefix(l, "RUN "); ok {
			events(api.BuildEvent{Type: "log", Step: i + 2, Data: []byte(cmd + "\n")})
			if cmd == "false" {
				return api.Template{}, fmt.Errorf("%w: step %d: %s: exit status 1", errdefs.ErrInvalid, i+2, l)
			}
		}
	}
	t := api.Template{Name: name, Source: "build", CreatedAt: created}
	for k, v := range buildArgs {
		t.Env = append(t.Env, k+"="+v)
	}
	slices.Sort(t.Env)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tpls[name] = t
	return t, nil
}

// importEvents decodes an NDJSON import stream and checks that it ends in
// exactly one done or error event.
func importEvents(t *testing.T, resp *http.Response, body []byte) []api.ImportEvent {
	t.Helper()
	return streamEvents(t, resp, body, func(ev api.ImportEvent) string { return ev.Type }, "progress events")
}

// streamEvents decodes an NDJSON stream of Es and checks that it ends in
// exactly one done or error event (typeOf), after what comes before.
func streamEvents[E any](t *testing.T, resp *http.Response, body []byte, typeOf func(E) string, before string) []E {
	t.Helper()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("status %d, Content-Type %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	var evs []E
	for line := range bytes.Lines(body) {
		evs = append(evs, decode[E](t, line))
	}
	for i, ev := range evs {
		last := i == len(evs)-1
		if final := typeOf(ev) == "done" || typeOf(ev) == "error"; final != last {
			t.Errorf("event %d of %d is %q: want %s, then one done or error", i+1, len(evs), typeOf(ev), before)
		}
	}
	if len(evs) == 0 {
		t.Fatal("empty stream")
	}
	return evs
}

func tarOf(t *testing.T, files ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		tw.WriteHeader(&tar.Header{Name: f, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(f))})
		tw.Write([]byte(f))
	}
	tw.Close()
	return buf.Bytes()
}

func TestTemplateLifecycle(t *testing.T) {
	f := newFixture(t)
	resp, body := f.do("POST", "/v1/templates/import", api.ImportTemplateRequest{Name: "py", Ref: "docker.io/library/python:3.12-slim"},
		"Content-Type", "application/json")
	evs := importEvents(t, resp, body)
	want := api.Template{Name: "py", Source: "docker.io/library/python:3.12-slim", Layers: []string{"sha256:aa", "sha256:bb"}, Size: 20, CreatedAt: created}
	if diff := cmp.Diff(api.ImportEvent{Type: "done", Template: &want}, evs[len(evs)-1]); diff != "" {
		t.Errorf("last event (-want +got):\n%s", diff)
	}
	if len(evs) != 5 {
		t.Errorf("%d events, want 4 progress and done", len(evs))
	}
	for _, ev := range evs[:len(evs)-1] {
		if ev.Type != "progress" || ev.Layers != 2 || ev.Layer == "" {
			t.Errorf("progress event %+v", ev)
		}
	}

	resp, body = f.do("POST", "/v1/templates/import?name=img.tar", tarOf(t, "blobs/sha256/1", "index.json"), "Content-Type", "application/x-tar")
	evs = importEvents(t, resp, body)
	if got := evs[len(evs)-1]; got.Type != "done" || got.Template == nil || got.Template.Name != "img.tar" || len(got.Template.Layers) != 2 {
		t.Errorf("archive import ended with %+v", got)
	}

	resp, body = f.do("GET", "/v1/templates/py", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("get: %d %s", resp.StatusCode, body)
	}
	if diff := cmp.Diff(want, decode[api.Template](t, body)); diff != "" {
		t.Errorf("get (-want +got):\n%s", diff)
	}
	// The builtin template has no layers: [] on the wire, never null.
	resp, body = f.do("GET", "/v1/templates/host", nil)
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"layers":[]`)) {
		t.Errorf("get host: %d %s", resp.StatusCode, body)
	}
	resp, body = f.do("GET", "/v1/templates", nil)
	if resp.StatusCode != 200 || len(decode[api.TemplateList](t, body).Templates) != 3 {
		t.Fatalf("list: %d %s", resp.StatusCode, body)
	}

	resp, body = f.do("DELETE", "/v1/templates/py", nil)
	if resp.StatusCode != http.StatusOK || string(body) != `{"name":"py","held":[]}`+"\n" {
		t.Fatalf("delete: %d %s", resp.StatusCode, body)
	}
	resp, body = f.do("GET", "/v1/templates/py", nil)
	wantError(t, resp, body, http.StatusNotFound, "not_found")
}

func TestTemplateBadInput(t *testing.T) {
	f := newFixture(t)
	long := strings.Repeat("a", 64)
	big := `{"name":"x","ref":"` + strings.Repeat("a", 2<<20) + `"}`
	for _, tc := range []struct {
		name         string
		method, path string
		body         any
		headers      []string
		status       int
		code         string
	}{
		{"upper-case name", "GET", "/v1/templates/Python", nil, nil, 400, "invalid"},
		{"name too long", "GET", "/v1/templates/" + long, nil, nil, 400, "invalid"},
		{"name starting with a dot", "DELETE", "/v1/templates/.hidden", nil, nil, 400, "invalid"},
		{"name with a colon", "GET", "/v1/templates/python:3.12", nil, nil, 400, "invalid"},
		{"versioned name outside tag", "GET", "/v1/templates/py@1", nil, nil, 400, "invalid"},
		{"tag of a malformed version", "POST", "/v1/templates/py@x%2Fy/tag", `{"tag":"t"}`, nil, 400, "invalid"},
		{"tag of an empty version", "POST", "/v1/templates/py@/tag", `{"tag":"t"}`, nil, 400, "invalid"},
		{"tag of a long version", "POST", "/v1/templates/py@" + strings.Repeat("1", 21) + "/tag", `{"tag":"t"}`, nil, 400, "invalid"},
		{"tag of a bad name with a version", "POST", "/v1/templates/Py@1/tag", `{"tag":"t"}`, nil, 400, "invalid"},
		{"escaped slash in name", "GET", "/v1/templates/a%2Fb", nil, nil, 400, "invalid"},
		{"dot-dot name", "DELETE", "/v1/templates/..%2F..%2Fetc", nil, nil, 400, "invalid"},
		{"unknown template", "GET", "/v1/templates/nope", nil, nil, 404, "not_found"},
		{"delete unknown template", "DELETE", "/v1/templates/nope", nil, nil, 404, "not_found"},
		{"delete template in use", "DELETE", "/v1/templates/host", nil, nil, 409, "conflict"},
		{"no key", "GET", "/v1/templates", nil, []string{"X-API-Key", ""}, 401, "unauthorized"},
		{"no key import", "POST", "/v1/templates/import?name=x", "", []string{"X-API-Key", "", "Content-Type", "application/x-tar"}, 401, "unauthorized"},
		{"wrong method", "PUT", "/v1/templates/host", nil, nil, 405, "invalid"},

		{"no content type", "POST", "/v1/templates/import", `{"name":"x","ref":"a"}`, nil, 415, "invalid"},
		{"text content type", "POST", "/v1/templates/import", `{"name":"x","ref":"a"}`, []string{"Content-Type", "text/plain"}, 415, "invalid"},
		{"gzip content type", "POST", "/v1/templates/import?name=x", "", []string{"Content-Type", "application/gzip"}, 415, "invalid"},
		{"malformed JSON", "POST", "/v1/templates/import", `{"name":`, []string{"Content-Type", "application/json"}, 400, "invalid"},
		{"empty JSON body", "POST", "/v1/templates/import", ``, []string{"Content-Type", "application/json"}, 400, "invalid"},
		{"unknown field", "POST", "/v1/templates/import", `{"name":"x","ref":"a","tag":"latest"}`, []string{"Content-Type", "application/json"}, 400, "invalid"},
		{"trailing data", "POST", "/v1/templates/import", `{"name":"x","ref":"a"} {}`, []string{"Content-Type", "application/json"}, 400, "invalid"},
		{"bad name in JSON", "POST", "/v1/templates/import", `{"name":"X Y","ref":"a"}`, []string{"Content-Type", "application/json"}, 400, "invalid"},
		{"no name in JSON", "POST", "/v1/templates/import", `{"ref":"a"}`, []string{"Content-Type", "application/json"}, 400, "invalid"},
		{"no ref", "POST", "/v1/templates/import", `{"name":"x"}`, []string{"Content-Type", "application/json"}, 400, "invalid"},
		{"ref with spaces", "POST", "/v1/templates/import", `{"name":"x","ref":"a b"}`, []string{"Content-Type", "application/json"}, 400, "invalid"},
		{"ref with newline", "POST", "/v1/templates/import", `{"name":"x","ref":"a\nb"}`, []string{"Content-Type", "application/json"}, 400, "invalid"},
		{"password without username", "POST", "/v1/templates/import", `{"name":"x","ref":"a","password":"p"}`, []string{"Content-Type", "application/json"}, 400, "invalid"},
		{"2 MiB JSON", "POST", "/v1/templates/import", big, []string{"Content-Type", "application/json"}, 413, "too_large"},
		{"2 MiB chunked JSON", "POST", "/v1/templates/import", io.MultiReader(strings.NewReader(big)), []string{"Content-Type", "application/json"}, 413, "too_large"},
		{"archive without name", "POST", "/v1/templates/import", tarOf(t, "a"), []string{"Content-Type", "application/x-tar"}, 400, "invalid"},
		{"archive with bad name", "POST", "/v1/templates/import?name=../x", tarOf(t, "a"), []string{"Content-Type", "application/x-tar"}, 400, "invalid"},
		{"archive with long name", "POST", "/v1/templates/import?name=" + long, tarOf(t, "a"), []string{"Content-Type", "application/x-tar"}, 400, "invalid"},

		{"bootstrap of an unknown distro", "POST", "/v1/templates/bootstrap", `{"name":"x","distro":"alpine"}`, []string{"Content-Type", "application/json"}, 400, "invalid"},
		{"bootstrap of an unknown build", "POST", "/v1/templates/bootstrap", `{"name":"x","distro":"debian","build":"python"}`, []string{"Content-Type", "application/json"}, 400, "invalid"},
		{"bootstrap of a build outside templates", "POST", "/v1/templates/bootstrap", `{"name":"x","distro":"debian","build":"../base"}`, []string{"Content-Type", "application/json"}, 400, "invalid"},
		{"bootstrap of a build path", "POST", "/v1/templates/bootstrap", `{"name":"x","distro":"debian","build":"base/Dockerfile"}`, []string{"Content-Type", "application/json"}, 400, "invalid"},
		{"bootstrap of the current directory", "POST", "/v1/templates/bootstrap", `{"name":"x","distro":"debian","build":"."}`, []string{"Content-Type", "application/json"}, 400, "invalid"},
		{"bootstrap build args without a build", "POST", "/v1/templates/bootstrap", `{"name":"x","distro":"debian","build_args":{"A":"b"}}`, []string{"Content-Type", "application/json"}, 400, "invalid"},
		{"bootstrap build arg without a name", "POST", "/v1/templates/bootstrap", `{"name":"x","distro":"debian","build":"base","build_args":{"":"b"}}`, []string{"Content-Type", "application/json"}, 400, "invalid"},
		{"bootstrap build arg with a NUL", "POST", "/v1/templates/bootstrap", `{"name":"x","distro":"debian","build":"base","build_args":{"A":"b\u0000c"}}`, []string{"Content-Type", "application/json"}, 400, "invalid"},
		{"bootstrap of 65 build args", "POST", "/v1/templates/bootstrap", `{"name":"x","distro":"debian","build":"base","build_args":{"A0":"v","A1":"v","A2":"v","A3":"v","A4":"v","A5":"v","A6":"v","A7":"v","A8":"v","A9":"v","A10":"v","A11":"v","A12":"v","A13":"v","A14":"v","A15":"v","A16":"v","A17":"v","A18":"v","A19":"v","A20":"v","A21":"v","A22":"v","A23":"v","A24":"v","A25":"v","A26":"v","A27":"v","A28":"v","A29":"v","A30":"v","A31":"v","A32":"v","A33":"v","A34":"v","A35":"v","A36":"v","A37":"v","A38":"v","A39":"v","A40":"v","A41":"v","A42":"v","A43":"v","A44":"v","A45":"v","A46":"v","A47":"v","A48":"v","A49":"v","A50":"v","A51":"v","A52":"v","A53":"v","A54":"v","A55":"v","A56":"v","A57":"v","A58":"v","A59":"v","A60":"v","A61":"v","A62":"v","A63":"v","A64":"v"}}`, []string{"Content-Type", "application/json"}, 400, "invalid"},
		{"bootstrap build args not strings", "POST", "/v1/templates/bootstrap", `{"name":"x","distro":"debian","build":"base","build_args":{"A":1}}`, []string{"Content-Type", "application/json"}, 400, "invalid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := f.with(t).do(tc.method, tc.path, tc.body, tc.headers...)
			wantError(t, resp, body, tc.status, tc.code)
		})
	}
}

// TestTemplateImportErrors checks the error events of imports that fail after
// the stream has started.
func TestTemplateImportErrors(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		name    string
		path    string
		body    any
		ctype   string
		code    string
		message string
	}{
		{"name taken", "/v1/templates/import", api.ImportTemplateRequest{Name: "host", Ref: "a"}, "application/json", "conflict", "template host exists: conflict"},
		{"unknown image", "/v1/templates/import", api.ImportTemplateRequest{Name: "m", Ref: "registry.example/missing"}, "application/json", "not_found", "image registry.example/missing: not found"},
		{"internal", "/v1/templates/import", api.ImportTemplateRequest{Name: "e", Ref: "registry.example/explode"}, "application/json", "internal", "internal error"},
		{"not a tar", "/v1/templates/import?name=junk", strings.Repeat("junk", 300), "application/x-tar", "invalid", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := f.with(t).do("POST", tc.path, tc.body, "Content-Type", tc.ctype)
			evs := importEvents(t, resp, body)
			last := evs[len(evs)-1]
			if last.Type != "error" || last.Code != tc.code || last.Message == "" || (tc.message != "" && last.Message != tc.message) {
				t.Errorf("last event %+v, want error %s %q", last, tc.code, tc.message)
			}
			if strings.Contains(last.Message, "/var/lib") {
				t.Errorf("message %q shows server internals", last.Message)
			}
		})
	}
}

// TestTemplateImportStreams reads the first progress events of an import while
// the import is still running: they must not wait in a buffer.
func TestTemplateImportStreams(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	j, _ := json.Marshal(api.ImportTemplateRequest{Name: "slow", Ref: "slow"})
	req, _ := http.NewRequestWithContext(ctx, "POST", f.url+"/v1/templates/import", bytes.NewReader(j))
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() {
		t.Fatalf("no event before the import finished: %v", sc.Err())
	}
	if ev := decode[api.ImportEvent](t, sc.Bytes()); ev.Type != "progress" || ev.Layer != "sha256:aa" || ev.Bytes != 5 {
		t.Errorf("first event %+v", ev)
	}
	close(f.tpls.release)
	var last api.ImportEvent
	for sc.Scan() {
		last = decode[api.ImportEvent](t, sc.Bytes())
	}
	if last.Type != "done" {
		t.Errorf("last event %+v, want done", last)
	}
}

// TestTemplateImportArchiveDuplex uploads an archive whose second half is only
// sent after the progress event of its first half has arrived: progress must
// stream while the upload is still going on.
func TestTemplateImportArchiveDuplex(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 1<<20)
	evs, err := duplexEvents[api.ImportEvent](t, newFixture(t), "/v1/templates/import?name=duplex",
		tarEntry{"layer1", big}, tarEntry{"layer2", []byte("y")})
	if len(evs) != 3 || evs[0].Layer != "layer1" || evs[0].Bytes != 1<<20 || evs[2].Type != "done" || len(evs[2].Template.Layers) != 2 {
		t.Fatalf("events %+v (%v)", evs, err)
	}
}

// tarEntry is a file of a tar stream a test sends.
type tarEntry struct {
	name string
	data []byte
}

// duplexEvents posts to path a tar stream of first and second, second
// sent only once the first event of the answer has arrived (so the answer
// must stream while the upload goes on), and returns the events, with the
// stream's read error.
func duplexEvents[E any](t *testing.T, f *fixture, path string, first, second tarEntry) ([]E, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	req, _ := http.NewRequestWithContext(ctx, "POST", f.url+path, pr)
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/x-tar")

	firstSeen := make(chan struct{})
	go func() {
		tw := tar.NewWriter(pw)
		tw.WriteHeader(&tar.Header{Name: first.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(first.data))})
		tw.Write(first.data)
		tw.Flush()
		select {
		case <-firstSeen:
		case <-ctx.Done():
			pw.CloseWithError(ctx.Err())
			return
		}
		tw.WriteHeader(&tar.Header{Name: second.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(second.data))})
		tw.Write(second.data)
		tw.Close()
		pw.Close()
	}()

	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var evs []E
	for sc.Scan() {
		ev := decode[E](t, sc.Bytes())
		if len(evs) == 0 {
			close(firstSeen)
		}
		evs = append(evs, ev)
	}
	return evs, sc.Err()
}

func TestTemplatesUnavailable(t *testing.T) {
	s, err := New(Config{Sandboxes: &memSandboxes{}, Auth: keyAuth(testKey), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	f := &fixture{t: t, s: s, url: ts.URL}
	for _, rt := range []struct{ method, path string }{
		{"GET", "/v1/templates"},
		{"GET", "/v1/templates/host"},
		{"DELETE", "/v1/templates/host"},
		{"POST", "/v1/templates/import"},
		{"POST", "/v1/templates/build?name=x"},
	} {
		resp, body := f.do(rt.method, rt.path, `{"name":"x","ref":"a"}`, "Content-Type", "application/json")
		wantError(t, resp, body, http.StatusServiceUnavailable, "unavailable")
	}
}

// buildEvents decodes an NDJSON build stream and checks that it ends in
// exactly one done or error event.
func buildEvents(t *testing.T, resp *http.Response, body []byte) []api.BuildEvent {
	t.Helper()
	return streamEvents(t, resp, body, func(ev api.BuildEvent) string { return ev.Type }, "step and log events")
}

// contextOf is a build context of name/content pairs.
func contextOf(t *testing.T, files ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i+1 < len(files); i += 2 {
		tw.WriteHeader(&tar.Header{Name: files[i], Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(files[i+1]))})
		tw.Write([]byte(files[i+1]))
	}
	tw.Close()
	return buf.Bytes()
}

func TestTemplateBuild(t *testing.T) {
	f := newFixture(t)
	ctx := contextOf(t, "app.py", "print(1)", "build/Dockerfile.dev", "FROM python\nRUN pip install x\nCOPY app.py /app/")
	resp, body := f.do("POST", "/v1/templates/build?name=app&dockerfile=build/Dockerfile.dev&build_arg=V=1&build_arg=EMPTY=&build_arg=EQ=a=b&build_arg=V=2",
		ctx, "Content-Type", "application/x-tar")
	if !resp.Close {
		t.Error("connection kept open after a streamed upload, want Connection: close")
	}
	evs := buildEvents(t, resp, body)
	want := []api.BuildEvent{
		{Type: "step", Step: 1, Steps: 3, Instruction: "FROM python", Cached: true},
		{Type: "step", Step: 2, Steps: 3, Instruction: "RUN pip install x"},
		{Type: "log", Step: 2, Data: []byte("pip install x\n")},
		{Type: "step", Step: 3, Steps: 3, Instruction: "COPY app.py /app/"},
		{Type: "done", Template: &api.Template{Name: "app", Source: "build", Layers: []string{}, Env: []string{"EMPTY=", "EQ=a=b", "V=2"}, CreatedAt: created}},
	}
	if diff := cmp.Diff(want, evs); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	// The default Dockerfile.
	resp, body = f.do("POST", "/v1/templates/build?name=default", contextOf(t, "Dockerfile", "FROM alpine"), "Content-Type", "application/x-tar")
	if evs := buildEvents(t, resp, body); evs[len(evs)-1].Type != "done" {
		t.Errorf("default Dockerfile: %+v", evs)
	}
}

func TestTemplateBuildBadInput(t *testing.T) {
	f := newFixture(t)
	ctx := contextOf(t, "Dockerfile", "FROM alpine")
	tooMany := "/v1/templates/build?name=x" + strings.Repeat("&build_arg=A=1", maxBuildArgs+1)
	for _, tc := range []struct {
		name    string
		path    string
		headers []string
		status  int
		code    string
	}{
		{"no key", "/v1/templates/build?name=x", []string{"X-API-Key", ""}, 401, "unauthorized"},
		{"no content type", "/v1/templates/build?name=x", []string{"Content-Type", ""}, 415, "invalid"},
		{"JSON content type", "/v1/templates/build?name=x", []string{"Content-Type", "application/json"}, 415, "invalid"},
		{"gzip content type", "/v1/templates/build?name=x", []string{"Content-Type", "application/gzip"}, 415, "invalid"},
		{"no name", "/v1/templates/build", nil, 400, "invalid"},
		{"bad name", "/v1/templates/build?name=../x", nil, 400, "invalid"},
		{"upper-case name", "/v1/templates/build?name=App", nil, 400, "invalid"},
		{"long name", "/v1/templates/build?name=" + strings.Repeat("a", 64), nil, 400, "invalid"},
		{"absolute dockerfile", "/v1/templates/build?name=x&dockerfile=/etc/passwd", nil, 400, "invalid"},
		{"dockerfile above the context", "/v1/templates/build?name=x&dockerfile=../Dockerfile", nil, 400, "invalid"},
		{"dockerfile is ..", "/v1/templates/build?name=x&dockerfile=..", nil, 400, "invalid"},
		{"dockerfile through ..", "/v1/templates/build?name=x&dockerfile=a/../../Dockerfile", nil, 400, "invalid"},
		{"unclean dockerfile", "/v1/templates/build?name=x&dockerfile=./Dockerfile", nil, 400, "invalid"},
		{"dockerfile with a trailing slash", "/v1/templates/build?name=x&dockerfile=build/", nil, 400, "invalid"},
		{"dockerfile is the context", "/v1/templates/build?name=x&dockerfile=.", nil, 400, "invalid"},
		{"dockerfile with NUL", "/v1/templates/build?name=x&dockerfile=Docker%00file", nil, 400, "invalid"},
		{"long dockerfile", "/v1/templates/build?name=x&dockerfile=" + strings.Repeat("a", maxDockerfilePath+1), nil, 400, "invalid"},
		{"build arg without =", "/v1/templates/build?name=x&build_arg=V", nil, 400, "invalid"},
		{"build arg without name", "/v1/templates/build?name=x&build_arg==1", nil, 400, "invalid"},
		{"build arg with NUL in name", "/v1/templates/build?name=x&build_arg=A%00B=1", nil, 400, "invalid"},
		{"build arg with NUL in value", "/v1/templates/build?name=x&build_arg=A=1%00", nil, 400, "invalid"},
		{"too many build args", tooMany, nil, 400, "invalid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			headers := append([]string{"Content-Type", "application/x-tar"}, tc.headers...)
			resp, body := f.with(t).do("POST", tc.path, ctx, headers...)
			wantError(t, resp, body, tc.status, tc.code)
		})
	}
	// The limits themselves are allowed.
	ok := "/v1/templates/build?name=limits&dockerfile=" + strings.Repeat("a", maxDockerfilePath) + strings.Repeat("&build_arg=A=1", maxBuildArgs)
	resp, body := f.do("POST", ok, contextOf(t, strings.Repeat("a", maxDockerfilePath), "FROM alpine"), "Content-Type", "application/x-tar")
	if evs := buildEvents(t, resp, body); evs[len(evs)-1].Type != "done" {
		t.Errorf("build at the limits: %+v", evs[len(evs)-1])
	}
}

// TestTemplateBuildErrors checks the error events of builds that fail after
// the stream has started.
func TestTemplateBuildErrors(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		name    string
		path    string
		body    []byte
		code    string
		message string
	}{
		{"name taken", "/v1/templates/build?name=host", contextOf(t, "Dockerfile", "FROM alpine"), "conflict", "template host exists: conflict"},
		{"no Dockerfile", "/v1/templates/build?name=x", contextOf(t, "app.py", "x"), "invalid", "invalid argument: no Dockerfile in the build context"},
		{"failing step", "/v1/templates/build?name=y", contextOf(t, "Dockerfile", "FROM alpine\nRUN false\nRUN true"), "invalid", "invalid argument: step 2: RUN false: exit status 1"},
		{"not a tar", "/v1/templates/build?name=z", bytes.Repeat([]byte("junk"), 300), "invalid", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := f.with(t).do("POST", tc.path, tc.body, "Content-Type", "application/x-tar")
			evs := buildEvents(t, resp, body)
			last := evs[len(evs)-1]
			if last.Type != "error" || last.Code != tc.code || last.Message == "" || (tc.message != "" && last.Message != tc.message) {
				t.Errorf("last event %+v, want error %s %q", last, tc.code, tc.message)
			}
		})
	}
}

// TestTemplateBuildDuplex uploads a build context whose second half is only
// sent after the first step event has arrived: events must stream while the
// upload is still going on.
func TestTemplateBuildDuplex(t *testing.T) {
	evs, err := duplexEvents[api.BuildEvent](t, newFixture(t), "/v1/templates/build?name=duplex",
		tarEntry{"Dockerfile", []byte("FROM alpine\nRUN make")}, tarEntry{"data", bytes.Repeat([]byte("x"), 1<<20)})
	if len(evs) != 4 || evs[0].Type != "step" || evs[0].Instruction != "FROM alpine" || evs[3].Type != "done" {
		t.Fatalf("events %+v (%v)", evs, err)
	}
}

func (m *memTemplates) Tag(ctx context.Context, name, tag string) (api.Template, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.tpls[name]
	if !ok {
		return api.Template{}, fmt.Errorf("template %s: %w", name, errdefs.ErrNotFound)
	}
	t.Name = tag
	m.tpls[tag] = t
	return t, nil
}

func (m *memTemplates) Bootstrap(ctx context.Context, req api.BootstrapTemplateRequest, events func(api.BuildEvent)) (api.Template, error) {
	if req.Distro != "debian" {
		return api.Template{}, fmt.Errorf("%w: distro must be debian", errdefs.ErrInvalid)
	}
	events(api.BuildEvent{Type: "log", Data: []byte("I: Retrieving InRelease\n")})
	t := api.Template{Name: req.Name, Source: "debootstrap " + req.Suite, Layers: []string{"l"}, CreatedAt: created}
	m.mu.Lock()
	m.tpls[req.Name] = t
	m.mu.Unlock()
	return t, nil
}
