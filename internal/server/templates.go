package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"unicode"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Templates is the template store the API serves. Errors carry errdefs kinds
// and their messages are shown to clients, as for Sandboxes.
type Templates interface {
	// Import imports an image. Exactly one of req.Ref and archive is set
	// (archive: a `docker save` or OCI archive tar stream uploaded by the
	// client). progress may be called many times before Import returns.
	Import(ctx context.Context, req api.ImportTemplateRequest, archive io.Reader, progress func(api.ImportEvent)) (api.Template, error)
	List(ctx context.Context) ([]api.Template, error)
	Get(ctx context.Context, name string) (api.Template, error)
	Delete(ctx context.Context, name string) error // errdefs.ErrConflict while sandboxes use it
}

// templateNamePattern is the shape of template names: 1-63 characters, lower
// case, safe as a file name and in a URL path segment.
var templateNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

const templateNameRule = "want 1-63 characters of [a-z0-9._-], starting with a letter or digit"

// maxRefLen bounds an image reference; registries allow far less.
const maxRefLen = 1024

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
	ts := s.templateStore(w)
	if ts == nil {
		return
	}
	name, ok := templateName(w, r)
	if !ok {
		return
	}
	t, err := ts.Get(r.Context(), name)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, normalizeTemplate(t))
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	ts := s.templateStore(w)
	if ts == nil {
		return
	}
	name, ok := templateName(w, r)
	if !ok {
		return
	}
	if err := ts.Delete(r.Context(), name); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
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
		if err := decodeJSON(w, r, &req, false); err != nil {
			s.writeError(w, r, err)
			return
		}
		if err := validateImport(req); err != nil {
			s.writeError(w, r, err)
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
		// Progress is streamed while the archive is still being uploaded,
		// which HTTP/1 allows only in full duplex. An import that fails leaves
		// the rest of the upload unread; net/http then cannot reuse the
		// connection safely in full duplex mode (it panics reading the next
		// request), so this connection ends with the response.
		if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
			s.log.Warn("enabling full duplex", "err", err)
		}
		w.Header().Set("Connection", "close")
	default:
		writeJSONError(w, http.StatusUnsupportedMediaType, "invalid",
			fmt.Sprintf("unsupported Content-Type %q: want application/json (an image reference) or application/x-tar (an image archive)", truncate(ct)))
		return
	}

	st := &importStream{w: w, rc: http.NewResponseController(w), enc: json.NewEncoder(w)}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	st.rc.Flush()

	t, err := ts.Import(r.Context(), req, archive, st.progress)
	if err != nil {
		_, body := s.errorBody(r, err)
		st.finish(api.ImportEvent{Type: "error", Code: body.Code, Message: body.Message})
		return
	}
	t = normalizeTemplate(t)
	st.finish(api.ImportEvent{Type: "done", Template: &t})
}

// importStream writes the events of one import. The store may report progress
// from several goroutines; nothing is written once the import has returned.
type importStream struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	enc *json.Encoder

	mu     sync.Mutex
	closed bool
	broken bool // a write failed: the client is gone
}

func (st *importStream) progress(ev api.ImportEvent) {
	ev.Type = "progress"
	ev.Template, ev.Code, ev.Message = nil, "", ""
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return
	}
	st.write(ev)
}

func (st *importStream) finish(ev api.ImportEvent) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.closed = true
	st.write(ev)
}

func (st *importStream) write(ev api.ImportEvent) {
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
