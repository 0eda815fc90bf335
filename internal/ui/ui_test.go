package ui

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, h http.Handler, method, path string, hdr ...string) *http.Response {
	t.Helper()
	r := httptest.NewRequest(method, path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Result()
}

// TestServes checks what `atoll serve` answers under /ui: the page, the
// files it references (and the terminal's, loaded later), its security
// headers, revalidation, and that other paths pass to the API.
func TestServes(t *testing.T) {
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	h := Mount(api)

	if resp := get(t, h, "GET", "/ui"); resp.StatusCode != http.StatusMovedPermanently || resp.Header.Get("Location") != "/ui/" {
		t.Errorf("GET /ui: %d to %q, want a redirect to /ui/", resp.StatusCode, resp.Header.Get("Location"))
	}
	resp := get(t, h, "GET", "/ui/")
	page, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), "text/html") || !strings.Contains(string(page), `id="signin-form"`) {
		t.Fatalf("GET /ui/: %d %s\n%s", resp.StatusCode, resp.Header.Get("Content-Type"), page)
	}
	csp := resp.Header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("Content-Security-Policy %q lacks %q", csp, want)
		}
	}
	// Every file the page names, and the terminal's, is served with its type.
	refs := regexp.MustCompile(`(?:src|href)="([a-z][^":]*)"`).FindAllStringSubmatch(string(page), -1)
	paths := []string{"vendor/xterm.js", "vendor/xterm.css", "vendor/addon-fit.js"}
	for _, m := range refs {
		paths = append(paths, m[1])
	}
	types := map[string]string{".js": "text/javascript", ".css": "text/css"}
	for _, p := range paths {
		resp := get(t, h, "GET", "/ui/"+p)
		ext := p[strings.LastIndex(p, "."):]
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), types[ext]) {
			t.Errorf("GET /ui/%s: %d %q", p, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
	// A reload revalidates: the same ETag is a 304 with no body.
	tag := get(t, h, "GET", "/ui/app.js").Header.Get("ETag")
	if tag == "" {
		t.Fatal("no ETag on /ui/app.js")
	}
	if resp := get(t, h, "GET", "/ui/app.js", "If-None-Match", tag); resp.StatusCode != http.StatusNotModified {
		t.Errorf("revalidating app.js: %d, want 304", resp.StatusCode)
	}
	if resp := get(t, h, "GET", "/ui/", "If-None-Match", get(t, h, "GET", "/ui/").Header.Get("ETag")); resp.StatusCode != http.StatusNotModified {
		t.Errorf("revalidating the page: %d, want 304", resp.StatusCode)
	}
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{"POST", "/ui/", http.StatusMethodNotAllowed},
		{"GET", "/ui/nope.js", http.StatusNotFound},
		{"GET", "/ui/../go.mod", http.StatusNotFound},
		{"GET", "/v1/sandboxes", http.StatusTeapot},
		{"GET", "/uix", http.StatusTeapot},
	} {
		if resp := get(t, h, tc.method, tc.path); resp.StatusCode != tc.status {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, resp.StatusCode, tc.status)
		}
	}
}

// TestVendored checks the vendored files against the sums
// scripts/ui-vendor.sh wrote: an edit by hand shows.
func TestVendored(t *testing.T) {
	f, err := files.Open("vendor/SHA256SUMS")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", sc.Text())
		}
		b, err := fs.ReadFile(files, "vendor/"+name)
		if err != nil {
			t.Fatal(err)
		}
		got := sha256.Sum256(b)
		if hex.EncodeToString(got[:]) != sum {
			t.Errorf("vendor/%s differs from what scripts/ui-vendor.sh vendored", name)
		}
		n++
	}
	if n != 3 {
		t.Errorf("SHA256SUMS lists %d files, want 3", n)
	}
}
