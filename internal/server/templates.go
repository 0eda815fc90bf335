package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path"
	"regexp"
	"strings"
	"sync"
	"unicode"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/templates"
)

// Templates is the template store the API serves. Errors carry errdefs kinds
// and their messages are shown to clients, as for Sandboxes.
type Templates interface {
	// Import imports an image. Exactly one of req.Ref and archive is set
	// (archive: a `docker save` or OCI archive tar stream uploaded by the
	// client). progress may be called many times before Import returns.
	Import(ctx context.Context, req api.ImportTemplateRequest, archive io.Reader, progress func(api.ImportEvent)) (api.Template, error)
	// Build builds template name from the Dockerfile at dockerfile (a path
	// inside the build context, default "Dockerfile") with build args,
	// reading the build context as a tar stream. events may be called many
	// times (step and log events) before Build returns.
	Build(ctx context.Context, name, dockerfile string, buildArgs map[string]string, buildContext io.Reader, events func(api.BuildEvent)) (api.Template, error)
	List(ctx context.Context) ([]api.Template, error)
	Get(ctx context.Context, name string) (api.Template, error)
	// Delete removes the name name; its versions stay while in use.
	Delete(ctx context.Context, name string) (api.TemplateRemoved, error)
	// Tag gives template name the second name tag.
	Tag(ctx context.Context, name, tag string) (api.Template, error)
	// Bootstrap makes a base template with debootstrap; events carries its log.
	Bootstrap(ctx context.Context, req api.BootstrapTemplateRequest, events func(api.BuildEvent)) (api.Template, error)
}

// templateNamePattern is the shape of template names: 1-63 characters, lower
// case, safe as a file name and in a URL path segment.
var templateNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

const templateNameRule = "want 1-63 characters of [a-z0-9._-], starting with a letter or digit"

// maxRefLen bounds an image reference; registries allow far less.
const maxRefLen = 1024

// Limits of a build's parameters. Their bodies are bounded by the template
// store, their query strings by the header limit; these keep the parameters
// themselves sane.
const (
	maxDockerfilePath = 4096
	maxBuildArgs      = 64
)

func validTemplateName(name string) error {
	if !templateNamePattern.MatchString(name) {
		return fmt.Errorf("%w: malformed template name %q: %s", errdefs.ErrInvalid, truncate(name), templateNameRule)
	}
	return nil
}

// templateStore returns the configured Templates, or answers 503 and returns nil.
func (s *Server) templateStore(w http.ResponseWriter) Templates {
	if s.cfg.Templates == nil {
		writeJSONError(w, http.StatusServiceUnavailable, "unavailable", "templates are not available on this server")
	}
	return s.cfg.Templates
}

// templateName returns the {name} of r, or writes 400 and returns false.
func templateName(w http.ResponseWriter, r *http.Request) (string, bool) {
	name := r.PathValue("name")
	if err := validTemplateName(name); err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid", err.Error())
		return "", false
	}
	return name, true
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	ts := s.templateStore(w)
	if ts == nil {
		return
	}
	l, err := ts.List(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := api.TemplateList{Templates: make([]api.Template, 0, len(l))}
	for _, t := range l {
		out.Templates = append(out.Templates, normalizeTemplate(t))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	if ts, name, ok := s.namedTemplate(w, r); ok {
		t, err := ts.Get(r.Context(), name)
		s.respond(w, r, http.StatusOK, normalizeTemplate(t), err)
	}
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	ts, name, ok := s.namedTemplate(w, r)
	if !ok {
		return
	}
	out, err := ts.Delete(r.Context(), name)
	if out.Held == nil {
		out.Held = []api.TemplateVersion{}
	}
	s.respond(w, r, http.StatusOK, out, err)
}

// namedTemplate returns the configured Templates and the {name} of r, or
// answers 503 or 400 and returns false.
func (s *Server) namedTemplate(w http.ResponseWriter, r *http.Request) (Templates, string, bool) {
	ts := s.templateStore(w)
	if ts == nil {
		return nil, "", false
	}
	name, ok := templateName(w, r)
	return ts, name, ok
}

func (s *Server) bootstrapTemplate(w http.ResponseWriter, r *http.Request) {
	ts := s.templateStore(w)
	if ts == nil {
		return
	}
	req, ok := decodeBody(s, w, r, false, func(req *api.BootstrapTemplateRequest) error { return validTemplateName(req.Name) })
	if !ok {
		return
	}
	// What the request names is checked before the stream starts, so that
	// it is a 400 rather than an error event.
	if req.Distro != "debian" {
		writeJSONError(w, http.StatusBadRequest, "invalid", `distro must be "debian"`)
		return
	}
	if _, ok := templates.Context(req.Build); req.Build != "" && !ok {
		writeJSONError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("build %q: atoll ships %s", truncate(req.Build), strings.Join(templates.Names(), ", ")))
		return
	}
	if err := checkBootstrapArgs(req); err != nil {
		s.writeError(w, r, err)
		return
	}
	st := startStream[api.BuildEvent](w)
	t, err := ts.Bootstrap(r.Context(), req, func(ev api.BuildEvent) {
		// Log lines, and the steps of a Dockerfile built over the
		// system (req.Build); the stream's end is finishBuild's.
		if ev.Type != "step" {
			ev.Type = "log"
		}
		ev.Template, ev.Code, ev.Message = nil, "", ""
		st.event(ev)
	})
	s.finishBuild(st, r, t, err)
}

// templateVersionPattern is the shape of the VERSION of NAME@VERSION: a
// number or a version ID; the template store says whether it exists.
var templateVersionPattern = regexp.MustCompile(`^[a-z0-9]{1,20}$`)

func (s *Server) tagTemplate(w http.ResponseWriter, r *http.Request) {
	ts := s.templateStore(w)
	if ts == nil {
		return
	}
	// {name} is NAME or NAME@VERSION: a tag may keep an older version.
	name := r.PathValue("name")
	base, ver, versioned := strings.Cut(name, "@")
	if err := validTemplateName(base); err != nil {
		s.writeError(w, r, err)
		return
	}
	if versioned && !templateVersionPattern.MatchString(ver) {
		writeJSONError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("malformed template version %q: want a number or a version ID", truncate(ver)))
		return
	}
	req, ok := decodeBody(s, w, r, false, func(req *api.TagTemplateRequest) error { return validTemplateName(req.Tag) })
	if !ok {
		return
	}
	t, err := ts.Tag(r.Context(), name, req.Tag)
	s.respond(w, r, http.StatusOK, normalizeTemplate(t), err)
}

// normalizeTemplate makes t's always-present arrays [] rather than null.
func normalizeTemplate(t api.Template) api.Template {
	if t.Layers == nil {
		t.Layers = []string{}
	}
	return t
}

// importTemplate takes either a JSON ImportTemplateRequest (an image in a
// registry) or a tar archive body named by ?name=, and answers with an NDJSON
// stream of ImportEvents. Problems found before the import starts are plain
// JSON errors; once it has started the status is 200 and the outcome is the
// stream's last event, "done" or "error".
func (s *Server) importTemplate(w http.ResponseWriter, r *http.Request) {
	ts := s.templateStore(w)
	if ts == nil {
		return
	}
	var (
		req     api.ImportTemplateRequest
		archive io.Reader
	)
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch ct {
	case "application/json":
		var ok bool
		if req, ok = decodeBody(s, w, r, false, func(req *api.ImportTemplateRequest) error { return validateImport(*req) }); !ok {
			return
		}
	case "application/x-tar":
		req.Name = r.URL.Query().Get("name")
		if req.Name == "" {
			s.writeError(w, r, fmt.Errorf("%w: missing ?name= for the template of an uploaded archive", errdefs.ErrInvalid))
			return
		}
		if err := validTemplateName(req.Name); err != nil {
			s.writeError(w, r, err)
			return
		}
		archive = r.Body
		s.streamWhileUploading(w)
	default:
		writeJSONError(w, http.StatusUnsupportedMediaType, "invalid",
			fmt.Sprintf("unsupported Content-Type %q: want application/json (an image reference) or application/x-tar (an image archive)", truncate(ct)))
		return
	}

	st := startStream[api.ImportEvent](w)
	progress := func(ev api.ImportEvent) {
		ev.Type = "progress"
		ev.Template, ev.Code, ev.Message = nil, "", ""
		st.event(ev)
	}
	t, err := ts.Import(r.Context(), req, archive, progress)
	finish(s, st, r, t, err, func(typ, code, msg string, t *api.Template) api.ImportEvent {
		return api.ImportEvent{Type: typ, Code: code, Message: msg, Template: t}
	})
}

// streamWhileUploading readies w for a stream answered while the request body
// is still being uploaded, which HTTP/1 allows only in full duplex. A store
// that fails leaves the rest of the upload unread; net/http then cannot reuse
// the connection safely in full duplex mode (it panics reading the next
// request), so the connection ends with the response.
func (s *Server) streamWhileUploading(w http.ResponseWriter) {
	if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
		s.log.Warn("enabling full duplex", "err", err)
	}
	w.Header().Set("Connection", "close")
}

// eventStream writes the NDJSON events of one import or build. The store may
// report events from several goroutines; nothing is written once the
// operation has returned, so the final event is the last line.
type eventStream[E any] struct {
	rc  *http.ResponseController
	enc *json.Encoder

	mu     sync.Mutex
	closed bool
	broken bool // a write failed: the client is gone
}

// startStream answers 200 with an NDJSON stream of E.
func startStream[E any](w http.ResponseWriter) *eventStream[E] {
	st := &eventStream[E]{rc: http.NewResponseController(w), enc: json.NewEncoder(w)}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	st.rc.Flush()
	return st
}

// event writes an intermediate event, unless the stream is finished.
func (st *eventStream[E]) event(ev E) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return
	}
	st.write(ev)
}

// finish writes the final event.
func (st *eventStream[E]) finish(ev E) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.closed = true
	st.write(ev)
}

func (st *eventStream[E]) write(ev E) {
	if st.broken {
		return
	}
	if err := st.enc.Encode(ev); err != nil {
		st.broken = true
		return
	}
	if err := st.rc.Flush(); err != nil {
		st.broken = true
	}
}

func validateImport(req api.ImportTemplateRequest) error {
	if err := validTemplateName(req.Name); err != nil {
		return err
	}
	switch {
	case req.Ref == "":
		return fmt.Errorf("%w: missing ref: the image reference to import, e.g. docker.io/library/alpine:3.20", errdefs.ErrInvalid)
	case len(req.Ref) > maxRefLen:
		return fmt.Errorf("%w: ref is longer than %d bytes", errdefs.ErrInvalid, maxRefLen)
	case strings.IndexFunc(req.Ref, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return fmt.Errorf("%w: malformed ref %q: it contains spaces or control characters", errdefs.ErrInvalid, truncate(req.Ref))
	case req.Password != "" && req.Username == "":
		return fmt.Errorf("%w: password without username", errdefs.ErrInvalid)
	}
	return nil
}

// buildTemplate builds a template from a Dockerfile in the build context the
// body carries as a tar stream, and answers with an NDJSON stream of
// BuildEvents. As for an import, problems found before the build starts are
// plain JSON errors; after that the outcome is the stream's last event.
func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request) {
	ts := s.templateStore(w)
	if ts == nil {
		return
	}
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/x-tar" {
		writeJSONError(w, http.StatusUnsupportedMediaType, "invalid",
			fmt.Sprintf("unsupported Content-Type %q: want application/x-tar (the build context)", truncate(ct)))
		return
	}
	q := r.URL.Query()
	name := q.Get("name")
	if name == "" {
		s.writeError(w, r, fmt.Errorf("%w: missing ?name= for the template to build", errdefs.ErrInvalid))
		return
	}
	if err := validTemplateName(name); err != nil {
		s.writeError(w, r, err)
		return
	}
	dockerfile, err := dockerfilePath(q.Get("dockerfile"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	args, err := buildArgs(q["build_arg"])
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.streamWhileUploading(w)

	st := startStream[api.BuildEvent](w)
	events := func(ev api.BuildEvent) {
		// Only the final event may be done or error.
		if ev.Type != "step" && ev.Type != "log" {
			ev.Type = "step"
			if len(ev.Data) > 0 {
				ev.Type = "log"
			}
		}
		ev.Template, ev.Code, ev.Message = nil, "", ""
		st.event(ev)
	}
	t, err := ts.Build(r.Context(), name, dockerfile, args, r.Body, events)
	s.finishBuild(st, r, t, err)
}

// finishBuild ends a build or bootstrap stream with its one final event.
func (s *Server) finishBuild(st *eventStream[api.BuildEvent], r *http.Request, t api.Template, err error) {
	finish(s, st, r, t, err, func(typ, code, msg string, t *api.Template) api.BuildEvent {
		return api.BuildEvent{Type: typ, Code: code, Message: msg, Template: t}
	})
}

// finish ends an import's or a build's stream with its one final event,
// which ev makes: "done" with t, or "error" saying err.
func finish[E any](s *Server, st *eventStream[E], r *http.Request, t api.Template, err error, ev func(typ, code, msg string, t *api.Template) E) {
	if err != nil {
		_, body := s.errorBody(r, err)
		st.finish(ev("error", body.Code, body.Message, nil))
		return
	}
	t = normalizeTemplate(t)
	st.finish(ev("done", "", "", &t))
}

// dockerfilePath checks ?dockerfile=, a slash-separated path inside the build
// context, and returns it or its default.
func dockerfilePath(p string) (string, error) {
	switch {
	case p == "":
		return "Dockerfile", nil
	case len(p) > maxDockerfilePath:
		return "", fmt.Errorf("%w: dockerfile path is longer than %d bytes", errdefs.ErrInvalid, maxDockerfilePath)
	case strings.ContainsRune(p, 0):
		return "", fmt.Errorf("%w: dockerfile path contains a NUL byte", errdefs.ErrInvalid)
	case path.IsAbs(p):
		return "", fmt.Errorf("%w: dockerfile path %q is absolute: want a path relative to the build context", errdefs.ErrInvalid, truncate(p))
	case p != path.Clean(p) || p == ".":
		return "", fmt.Errorf("%w: dockerfile path %q is not clean: want e.g. %q", errdefs.ErrInvalid, truncate(p), path.Clean(p))
	case p == ".." || strings.HasPrefix(p, "../"):
		return "", fmt.Errorf("%w: dockerfile path %q leaves the build context", errdefs.ErrInvalid, truncate(p))
	}
	return p, nil
}

// checkBootstrapArgs holds a bootstrap's build args to what a build's
// build_arg parameters may be.
func checkBootstrapArgs(req api.BootstrapTemplateRequest) error {
	if len(req.BuildArgs) > 0 && req.Build == "" {
		return fmt.Errorf("%w: build_args need a build (they set its Dockerfile's ARGs)", errdefs.ErrInvalid)
	}
	kvs := make([]string, 0, len(req.BuildArgs))
	for k, v := range req.BuildArgs {
		kvs = append(kvs, k+"="+v)
	}
	_, err := buildArgs(kvs)
	return err
}

// buildArgs parses the ?build_arg=K=V parameters. A repeated K takes its last
// value, as with docker build.
func buildArgs(kvs []string) (map[string]string, error) {
	if len(kvs) > maxBuildArgs {
		return nil, fmt.Errorf("%w: %d build args: at most %d", errdefs.ErrInvalid, len(kvs), maxBuildArgs)
	}
	args := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		switch {
		case !ok:
			return nil, fmt.Errorf("%w: malformed build arg %q: want K=V", errdefs.ErrInvalid, truncate(kv))
		case k == "":
			return nil, fmt.Errorf("%w: malformed build arg %q: empty name", errdefs.ErrInvalid, truncate(kv))
		case strings.ContainsRune(kv, 0):
			return nil, fmt.Errorf("%w: build arg %q contains a NUL byte", errdefs.ErrInvalid, truncate(k))
		}
		args[k] = v
	}
	return args, nil
}
