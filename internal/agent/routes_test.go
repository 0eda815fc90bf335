package agent

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestRouter: a request reaches the one pattern that matches it, with its
// wildcards as path values; anything else reaches none.
func TestRouter(t *testing.T) {
	var rt router
	hit := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) { w.Header().Set("X-Route", name) }
	}
	rt.handleFunc("GET /processes", hit("list"))
	rt.handleFunc("GET /processes/{pid}", hit("get"))
	rt.handleFunc("POST /processes/{pid}/stdin", hit("stdin"))
	rt.handleFunc("POST /processes/{pid}/stdin/close", hit("close"))
	rt.handleFunc("DELETE /code/contexts/{ctx}", hit("ctx"))
	for _, c := range []struct{ method, path, route, pid string }{
		{"GET", "/processes", "list", ""},
		{"HEAD", "/processes", "list", ""},
		{"GET", "/processes/42", "get", "42"},
		{"POST", "/processes/7/stdin", "stdin", "7"},
		{"POST", "/processes/7/stdin/close", "close", "7"},
		{"DELETE", "/code/contexts/abc", "ctx", ""},
		{"POST", "/processes", "", ""},         // wrong method
		{"GET", "/processes/", "", ""},         // empty wildcard
		{"GET", "/processes/42/", "", ""},      // trailing slash
		{"GET", "/processes/42/extra", "", ""}, // more segments
		{"GET", "//processes", "", ""},         // not clean
		{"GET", "/process", "", ""},            // no such path
		{"POST", "/processes/7/stdin/open", "", ""},
	} {
		r := httptest.NewRequest(c.method, "http://agent"+c.path, nil)
		h := rt.match(r)
		if c.route == "" {
			if h != nil {
				t.Errorf("%s %s matched a route", c.method, c.path)
			}
			continue
		}
		if h == nil {
			t.Errorf("%s %s matched none, want %s", c.method, c.path, c.route)
			continue
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if got := w.Header().Get("X-Route"); got != c.route {
			t.Errorf("%s %s reached %s, want %s", c.method, c.path, got, c.route)
		}
		if r.PathValue("pid") != c.pid {
			t.Errorf("%s %s: pid %q, want %q", c.method, c.path, r.PathValue("pid"), c.pid)
		}
	}
}
