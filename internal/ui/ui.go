// Package ui is atoll's web dashboard: static HTML, CSS and JavaScript,
// embedded in the binary and served by `atoll serve` under /ui. It has no
// server side of its own: the page signs in with an API key and calls the
// public /v1 API like any other client (docs/dashboard.md). Its one
// third-party part, xterm.js, is vendored by scripts/ui-vendor.sh.
package ui

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"strings"
)

// Prefix is where the dashboard is served.
const Prefix = "/ui/"

//go:embed static
var static embed.FS

// files is the dashboard's tree, index.html at its root.
var files, _ = fs.Sub(static, "static")

// etags are the files' ETags (a hash of their bytes) by path under
// Prefix: with them a reload revalidates instead of downloading again.
var etags = func() map[string]string {
	m := map[string]string{}
	fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(files, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		name := p
		if name == "index.html" {
			name = ""
		}
		m[Prefix+name] = `"` + hex.EncodeToString(sum[:16]) + `"`
		return nil
	})
	return m
}()

// headers are set on every answer. The page loads only its own files and
// talks only to its own origin (the API and the terminal's websocket); no
// other site may frame it. style-src allows inline styles because xterm.js
// sizes its rows with them.
var headers = map[string]string{
	"Content-Security-Policy": "default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data: blob:; " +
		"style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
	"X-Content-Type-Options": "nosniff",
	"Referrer-Policy":        "no-referrer",
	// The files change only with the binary; a revalidation costs a
	// round trip, not a download.
	"Cache-Control": "no-cache",
}

// Handler serves the dashboard: /ui redirects to /ui/, and /ui/... are the
// embedded files (GET and HEAD only).
func Handler() http.Handler {
	fsrv := http.StripPrefix(strings.TrimSuffix(Prefix, "/"), http.FileServerFS(files))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if r.URL.Path == strings.TrimSuffix(Prefix, "/") {
			http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
			return
		}
		for k, v := range headers {
			w.Header().Set(k, v)
		}
		if tag, ok := etags[r.URL.Path]; ok {
			w.Header().Set("ETag", tag) // ServeContent answers If-None-Match with it
		}
		fsrv.ServeHTTP(w, r)
	})
}

// Mount returns next with the dashboard in front of it: requests for /ui
// and under it are the dashboard's, everything else next's.
func Mount(next http.Handler) http.Handler {
	ui := Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == strings.TrimSuffix(Prefix, "/") || strings.HasPrefix(r.URL.Path, Prefix) {
			ui.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}
