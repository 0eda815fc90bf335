package envd

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/filemeta"
)

// fileEntry is an item of envd's upload answer.
type fileEntry struct {
	Path     string            `json:"path"`
	Name     string            `json:"name"`
	Type     string            `json:"type"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// metadataHeader prefixes the request headers that carry an upload's file
// metadata, X-Metadata-<key>: <value>, one set for every file uploaded.
const metadataHeader = "X-Metadata-"

// uploadMetadata reads an upload's metadata headers. Keys are lower case
// whatever the client sent, as envd's are: HTTP/2 and proxies lower-case
// header names anyway.
func uploadMetadata(h http.Header) (map[string]string, error) {
	var m map[string]string
	for name, vs := range h {
		if len(name) < len(metadataHeader) || !strings.EqualFold(name[:len(metadataHeader)], metadataHeader) || len(vs) == 0 {
			continue
		}
		key := name[len(metadataHeader):]
		if len(vs) > 1 {
			return nil, fmt.Errorf("invalid metadata: header %s given %d times", name, len(vs))
		}
		if m == nil {
			m = map[string]string{}
		}
		m[strings.ToLower(key)] = vs[0]
	}
	if err := filemeta.Validate(m); err != nil {
		return nil, fmt.Errorf("invalid metadata: %w", err)
	}
	return m, nil
}

// fileCall prepares a /files request: the signature, the user and the path.
func (s *Server) fileCall(w http.ResponseWriter, r *http.Request, operation string) (*call, string, bool) {
	c := callFrom(r.Context())
	if err := checkSignature(r, c.sb, operation); err != nil {
		writeError(w, http.StatusUnauthorized, err.Error())
		return nil, "", false
	}
	q := r.URL.Query()
	if u := q.Get("username"); u != "" {
		c.user = u
	}
	if _, err := c.home(r.Context()); err != nil {
		writeError(w, http.StatusUnauthorized, "error looking up user '"+c.user+"': unknown user")
		return nil, "", false
	}
	return c, q.Get("path"), true
}

// resolveHTTP resolves p for an HTTP answer.
func (c *call) resolveHTTP(ctx context.Context, w http.ResponseWriter, p string) (string, bool) {
	abs, err := c.resolve(ctx, p)
	if err != nil {
		status := http.StatusBadRequest
		var ce *connect.Error
		if errors.As(err, &ce) && ce.Code() == connect.CodeUnauthenticated {
			status = http.StatusUnauthorized
		}
		writeError(w, status, message(err))
		return "", false
	}
	return abs, true
}

func (s *Server) download(w http.ResponseWriter, r *http.Request) {
	c, p, ok := s.fileCall(w, r, "read")
	if !ok {
		return
	}
	if p == "" {
		writeError(w, http.StatusBadRequest, "path is required")
		return
	}
	abs, ok := c.resolveHTTP(r.Context(), w, p)
	if !ok {
		return
	}
	body, size, err := c.sb.Agent.OpenFile(r.Context(), abs)
	if err != nil {
		if isNotFound(err) {
			writeError(w, http.StatusNotFound, "path '"+abs+"' does not exist")
			return
		}
		writeError(w, httpStatus(err), message(err))
		return
	}
	defer body.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(abs)}))
	if size >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	w.WriteHeader(http.StatusOK)
	io.Copy(w, body)
}

func (s *Server) upload(w http.ResponseWriter, r *http.Request) {
	c, p, ok := s.fileCall(w, r, "write")
	if !ok {
		return
	}
	body := r.Body
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			writeError(w, http.StatusBadRequest, "error decompressing request body: "+err.Error())
			return
		}
		defer zr.Close()
		body = zr
	default:
		writeError(w, http.StatusBadRequest, "unsupported Content-Encoding "+strconv.Quote(enc))
		return
	}
	meta, err := uploadMetadata(r.Header)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	mediaType, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var entries []fileEntry
	switch {
	case mediaType == "application/octet-stream":
		if p == "" {
			writeError(w, http.StatusBadRequest, "path query parameter is required for raw body upload")
			return
		}
		e, status, err := c.writeFile(r.Context(), p, body, meta)
		if err != nil {
			writeError(w, status, message(err))
			return
		}
		entries = append(entries, e)
	case strings.HasPrefix(mediaType, "multipart/") && params["boundary"] != "":
		mr := multipart.NewReader(body, params["boundary"])
		seen := map[string]bool{}
		for {
			part, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				writeError(w, http.StatusBadRequest, "error reading form: "+err.Error())
				return
			}
			if part.FormName() != "file" {
				part.Close()
				continue
			}
			dest := p
			if dest == "" {
				// The file name with its directories, which Part.FileName drops.
				_, dp, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				dest = dp["filename"]
			}
			if dest == "" {
				part.Close()
				writeError(w, http.StatusBadRequest, "a file part has no path")
				return
			}
			abs, err := c.resolve(r.Context(), dest)
			if err == nil && seen[abs] {
				err = invalid("you cannot upload multiple files to the same path '%s' in one upload request", abs)
			}
			if err != nil {
				part.Close()
				writeError(w, http.StatusBadRequest, message(err))
				return
			}
			seen[abs] = true
			e, status, err := c.writeFile(r.Context(), abs, part, meta)
			part.Close()
			if err != nil {
				writeError(w, status, message(err))
				return
			}
			entries = append(entries, e)
		}
	default:
		writeError(w, http.StatusBadRequest, "unsupported content type "+strconv.Quote(r.Header.Get("Content-Type"))+", expected multipart/form-data or application/octet-stream")
		return
	}
	if entries == nil {
		entries = []fileEntry{}
	}
	writeJSON(w, entries)
}

// writeFile writes one uploaded file, owned by the request's user when
// new, with metadata meta and no other: an overwrite drops what was there.
func (c *call) writeFile(ctx context.Context, p string, body io.Reader, meta map[string]string) (fileEntry, int, error) {
	abs, err := c.resolve(ctx, p)
	if err != nil {
		return fileEntry{}, http.StatusBadRequest, err
	}
	fi, err := c.sb.Agent.Write(ctx, abs, body, agent.WriteOptions{User: c.user, Metadata: meta})
	if err != nil {
		return fileEntry{}, httpStatus(err), err
	}
	return fileEntry{Path: fi.Path, Name: fi.Name, Type: "file", Metadata: fi.Metadata}, 0, nil
}

func writeJSON(w http.ResponseWriter, v any) { surface.JSON(w, http.StatusOK, v) }
