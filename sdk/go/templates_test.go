package atoll_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/testenv"
	"github.com/atoll-dev/atoll/internal/testenv/memstore"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// templates holds templates in memory. A registry import makes one layer per
// character of the ref's last path element; an archive import one per tar entry.
type templates struct {
	memstore.Templates
	inUse map[string]bool // read only
}

func newTemplates() *templates {
	return &templates{memstore.NewTemplates(api.Template{Name: "host", Source: "builtin"}), map[string]bool{"host": true}}
}

func (s *templates) Import(ctx context.Context, req api.ImportTemplateRequest, archive io.Reader, progress func(api.ImportEvent)) (api.Template, error) {
	if s.Has(req.Name) {
		return api.Template{}, fmt.Errorf("template %s already exists: %w", req.Name, errdefs.ErrConflict)
	}
	t := api.Template{Name: req.Name, Source: req.Ref}
	if archive != nil {
		t.Source = "archive"
		if err := memstore.ImportArchive(&t, archive, progress); err != nil {
			return api.Template{}, err
		}
	} else {
		if req.Username != "" && req.Password != "secret" {
			return api.Template{}, fmt.Errorf("%w: registry refused the credentials", errdefs.ErrUnauthorized)
		}
		for i := range 3 {
			l := fmt.Sprintf("sha256:%02d", i)
			progress(api.ImportEvent{Layer: l, Bytes: 100, Total: 100, LayersDone: i + 1, Layers: 3})
			t.Layers = append(t.Layers, l)
			t.Size += 100
		}
	}
	s.Put(t.Name, t)
	return t, nil
}

// Build makes one step per line of the Dockerfile, and fails a step whose
// line is "RUN false". The template's Env lists the build args; its Layers the
// context's files.
func (s *templates) Build(ctx context.Context, name, dockerfile string, buildArgs map[string]string, buildContext io.Reader, events func(api.BuildEvent)) (api.Template, error) {
	if s.Has(name) {
		return api.Template{}, fmt.Errorf("template %s already exists: %w", name, errdefs.ErrConflict)
	}
	t := api.Template{Name: name, Source: "build"}
	lines, err := memstore.BuildContext(&t, buildContext, dockerfile)
	if err != nil {
		return api.Template{}, err
	}
	for i, l := range lines {
		events(api.BuildEvent{Type: "step", Step: i + 1, Steps: len(lines), Instruction: l})
		if cmd, ok := strings.CutPrefix(l, "RUN "); ok {
			events(api.BuildEvent{Type: "log", Step: i + 1, Data: []byte(cmd + "\n")})
			if cmd == "false" {
				return api.Template{}, fmt.Errorf("%w: step %d: %s: exit status 1", errdefs.ErrInvalid, i+1, l)
			}
		}
	}
	for k, v := range buildArgs {
		t.Env = append(t.Env, k+"="+v)
	}
	slices.Sort(t.Env)
	s.Put(t.Name, t)
	return t, nil
}

func (s *templates) Delete(ctx context.Context, name string) (api.TemplateRemoved, error) {
	_, err := s.Table.Delete(name, func(api.Template) error {
		if s.inUse[name] {
			return fmt.Errorf("template %s is in use: %w", name, errdefs.ErrConflict)
		}
		return nil
	})
	if err != nil {
		return api.TemplateRemoved{}, err
	}
	return api.TemplateRemoved{Name: name, Held: []api.TemplateVersion{{ID: "v0123456789abcdef012", Number: 1, Layers: []string{}, Sandboxes: 1}}}, nil
}

func TestTemplates(t *testing.T) {
	c, _ := newClient(t, key)
	ctx := context.Background()

	var evs []api.ImportEvent
	tpl, err := c.ImportTemplate(ctx, api.ImportTemplateRequest{Name: "alpine", Ref: "docker.io/library/alpine:3.20"},
		func(ev api.ImportEvent) { evs = append(evs, ev) })
	if err != nil {
		t.Fatal(err)
	}
	want := api.Template{Name: "alpine", Source: "docker.io/library/alpine:3.20", Layers: []string{"sha256:00", "sha256:01", "sha256:02"}, Size: 300}
	if diff := cmp.Diff(want, tpl); diff != "" {
		t.Errorf("ImportTemplate (-want +got):\n%s", diff)
	}
	if len(evs) != 3 || evs[2].Type != "progress" || evs[2].LayersDone != 3 {
		t.Errorf("progress events %+v", evs)
	}

	// No progress callback: events are read and dropped.
	tpl, err = c.ImportTemplateArchive(ctx, "saved", io.MultiReader(testenv.Tar("blobs/sha256/x", "hello")), nil)
	if err != nil || tpl.Source != "archive" || tpl.Size != 5 {
		t.Fatalf("ImportTemplateArchive = %+v, %v", tpl, err)
	}

	got, err := c.GetTemplate(ctx, "alpine")
	if err != nil || got.Name != "alpine" {
		t.Fatalf("GetTemplate = %+v, %v", got, err)
	}
	l, err := c.ListTemplates(ctx)
	if err != nil || len(l) != 3 {
		t.Fatalf("ListTemplates = %+v, %v", l, err)
	}
	if rm, err := c.DeleteTemplate(ctx, "alpine"); err != nil || rm.Name != "alpine" || len(rm.Held) != 1 || rm.Held[0].Sandboxes != 1 {
		t.Fatalf("DeleteTemplate = %+v, %v", rm, err)
	}
	if _, err := c.GetTemplate(ctx, "alpine"); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("GetTemplate of deleted: %v, want ErrNotFound", err)
	}
	if _, err := c.DeleteTemplate(ctx, "host"); !errors.Is(err, atoll.ErrConflict) {
		t.Errorf("DeleteTemplate of a template in use: %v, want ErrConflict", err)
	}
	if _, err := c.GetTemplate(ctx, "../sandboxes"); !errors.Is(err, atoll.ErrInvalid) {
		t.Errorf("GetTemplate of a malformed name: %v, want ErrInvalid", err)
	}
}

func TestImportTemplateErrors(t *testing.T) {
	c, _ := newClient(t, key)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		run    func() error
		kind   error
		status int
		code   string
	}{
		{"error event: name taken", func() error {
			_, err := c.ImportTemplate(ctx, api.ImportTemplateRequest{Name: "host", Ref: "alpine"}, nil)
			return err
		}, atoll.ErrConflict, 409, "conflict"},
		{"error event: registry credentials", func() error {
			_, err := c.ImportTemplate(ctx, api.ImportTemplateRequest{Name: "p", Ref: "private/x", Username: "u", Password: "wrong"}, nil)
			return err
		}, atoll.ErrUnauthorized, 401, "unauthorized"},
		{"error event: archive", func() error {
			_, err := c.ImportTemplateArchive(ctx, "junk", strings.NewReader(strings.Repeat("junk", 1000)), nil)
			return err
		}, atoll.ErrInvalid, 400, "invalid"},
		// The import fails early in a large upload, which the server leaves unread.
		{"error event: large archive", func() error {
			_, err := c.ImportTemplateArchive(ctx, "junk2", io.MultiReader(strings.NewReader(strings.Repeat("junk", 1000)), bytes.NewReader(make([]byte, 8<<20))), nil)
			return err
		}, atoll.ErrInvalid, 400, "invalid"},
		{"4xx: bad name", func() error {
			_, err := c.ImportTemplate(ctx, api.ImportTemplateRequest{Name: "Alpine", Ref: "alpine"}, nil)
			return err
		}, atoll.ErrInvalid, 400, "invalid"},
		// The server answers before reading the upload; the client must
		// still see that answer, not a broken pipe.
		{"4xx: bad name for a large archive", func() error {
			_, err := c.ImportTemplateArchive(ctx, "Bad Name", io.MultiReader(bytes.NewReader(make([]byte, 8<<20))), nil)
			return err
		}, atoll.ErrInvalid, 400, "invalid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			var e *atoll.Error
			if !errors.As(err, &e) || !errors.Is(err, tc.kind) || e.StatusCode != tc.status || e.Code != tc.code || e.Message == "" {
				t.Errorf("error %#v (%v), want *Error %d %s", err, err, tc.status, tc.code)
			}
		})
	}
}

func TestBuildTemplate(t *testing.T) {
	c, _ := newClient(t, key)
	ctx := context.Background()
	var evs []api.BuildEvent
	tpl, err := c.BuildTemplate(ctx, "app",
		atoll.BuildOptions{Dockerfile: "ci/Dockerfile", BuildArgs: map[string]string{"V": "1", "EQ": "a=b", "EMPTY": ""}},
		testenv.Tar("ci/Dockerfile", "FROM alpine\nRUN make", "main.c", "int main;"),
		func(ev api.BuildEvent) { evs = append(evs, ev) })
	if err != nil {
		t.Fatal(err)
	}
	want := api.Template{Name: "app", Source: "build", Layers: []string{"ci/Dockerfile", "main.c"}, Env: []string{"EMPTY=", "EQ=a=b", "V=1"}}
	if diff := cmp.Diff(want, tpl); diff != "" {
		t.Errorf("BuildTemplate (-want +got):\n%s", diff)
	}
	wantEvs := []api.BuildEvent{
		{Type: "step", Step: 1, Steps: 2, Instruction: "FROM alpine"},
		{Type: "step", Step: 2, Steps: 2, Instruction: "RUN make"},
		{Type: "log", Step: 2, Data: []byte("make\n")},
	}
	if diff := cmp.Diff(wantEvs, evs); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	// Default Dockerfile, no callback.
	if _, err := c.BuildTemplate(ctx, "plain", atoll.BuildOptions{}, testenv.Tar("Dockerfile", "FROM alpine"), nil); err != nil {
		t.Fatal(err)
	}
}

func TestBuildTemplateErrors(t *testing.T) {
	c, _ := newClient(t, key)
	ctx := context.Background()
	df := func() io.Reader { return testenv.Tar("Dockerfile", "FROM alpine") }
	for _, tc := range []struct {
		name    string
		tpl     string
		opts    atoll.BuildOptions
		context io.Reader
		kind    error
		status  int
		code    string
	}{
		{"error event: name taken", "host", atoll.BuildOptions{}, df(), atoll.ErrConflict, 409, "conflict"},
		{"error event: failing step", "f", atoll.BuildOptions{}, testenv.Tar("Dockerfile", "FROM alpine\nRUN false"), atoll.ErrInvalid, 400, "invalid"},
		{"error event: no Dockerfile", "n", atoll.BuildOptions{Dockerfile: "x/Dockerfile"}, df(), atoll.ErrInvalid, 400, "invalid"},
		{"4xx: bad name", "App", atoll.BuildOptions{}, df(), atoll.ErrInvalid, 400, "invalid"},
		{"4xx: Dockerfile outside the context", "o", atoll.BuildOptions{Dockerfile: "../Dockerfile"}, df(), atoll.ErrInvalid, 400, "invalid"},
		{"4xx: empty build arg name", "e", atoll.BuildOptions{BuildArgs: map[string]string{"": "1"}}, df(), atoll.ErrInvalid, 400, "invalid"},
		// The server answers before reading the upload; the client must
		// still see that answer, not a broken pipe.
		{"4xx: bad name for a large context", "Bad Name", atoll.BuildOptions{}, io.MultiReader(bytes.NewReader(make([]byte, 8<<20))), atoll.ErrInvalid, 400, "invalid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.BuildTemplate(ctx, tc.tpl, tc.opts, tc.context, nil)
			var e *atoll.Error
			if !errors.As(err, &e) || !errors.Is(err, tc.kind) || e.StatusCode != tc.status || e.Code != tc.code || e.Message == "" {
				t.Errorf("error %#v (%v), want *Error %d %s", err, err, tc.status, tc.code)
			}
		})
	}
}

// TestBuildTemplateTruncated checks a stream that ends without a final event.
func TestBuildTemplateTruncated(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"type":"step","step":1,"steps":2,"instruction":"FROM alpine"}`+"\n")
	}))
	defer ts.Close()
	c := atoll.New(ts.URL, key)
	called := 0
	_, err := c.BuildTemplate(context.Background(), "x", atoll.BuildOptions{}, strings.NewReader(""), func(api.BuildEvent) { called++ })
	if err == nil || called != 1 {
		t.Errorf("BuildTemplate of a truncated stream: %v after %d events", err, called)
	}
}

// TestImportTemplateTruncated checks a stream that ends without a final event.
func TestImportTemplateTruncated(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"type":"progress","layer":"sha256:00","bytes":1}`+"\n")
	}))
	defer ts.Close()
	c := atoll.New(ts.URL, key)
	called := 0
	_, err := c.ImportTemplate(context.Background(), api.ImportTemplateRequest{Name: "x", Ref: "x"}, func(api.ImportEvent) { called++ })
	if err == nil || called != 1 {
		t.Errorf("ImportTemplate of a truncated stream: %v after %d progress events", err, called)
	}
}

func (s *templates) Bootstrap(ctx context.Context, req api.BootstrapTemplateRequest, events func(api.BuildEvent)) (api.Template, error) {
	events(api.BuildEvent{Type: "log", Data: []byte("I: Base system installed successfully.\n")})
	t := api.Template{Name: req.Name, Source: "debootstrap " + req.Suite, Layers: []string{"l"}}
	s.Put(req.Name, t)
	return t, nil
}
