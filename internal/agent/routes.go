package agent

import (
	"net/http"
	"strings"
)

// router dispatches the agent's endpoints: a table of "METHOD /path"
// patterns whose {name} segments each match one non-empty segment, which
// the request then carries as its path value (r.PathValue); GET patterns
// answer HEAD too, as with http.ServeMux. No two patterns of the table
// match one request, so the first that matches is the one.
//
// Not http.ServeMux: registering a pattern there records where it was
// registered (runtime.Caller) and checks it against every other, and an
// agent, started afresh for each sandbox, built its mux once per sandbox:
// about 1% of the machine's CPU in a sustained run of creates
// (docs/benchmarks.md, issue #13).
type router struct{ routes []route }

type route struct {
	method string
	segs   []string // of the path after its first "/"; "{name}" is a wildcard
	h      http.Handler
}

func (rt *router) handle(pattern string, h http.Handler) {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok || !strings.HasPrefix(path, "/") {
		panic("agent: bad pattern " + pattern)
	}
	rt.routes = append(rt.routes, route{method: method, segs: strings.Split(path[1:], "/"), h: h})
}

func (rt *router) handleFunc(pattern string, f func(http.ResponseWriter, *http.Request)) {
	rt.handle(pattern, http.HandlerFunc(f))
}

// match returns the handler for r, having set r's path values, or nil.
func (rt *router) match(r *http.Request) http.Handler {
	path := r.URL.Path
	if !strings.HasPrefix(path, "/") {
		return nil
	}
	segs := strings.Split(path[1:], "/")
	method := r.Method
	if method == http.MethodHead {
		method = http.MethodGet
	}
	for _, rte := range rt.routes {
		if rte.method == method && rte.matches(segs) {
			for i, s := range rte.segs {
				if name, ok := wildcard(s); ok {
					r.SetPathValue(name, segs[i])
				}
			}
			return rte.h
		}
	}
	return nil
}

func (rte route) matches(segs []string) bool {
	if len(segs) != len(rte.segs) {
		return false
	}
	for i, s := range rte.segs {
		if _, ok := wildcard(s); ok {
			if segs[i] == "" {
				return false
			}
		} else if s != segs[i] {
			return false
		}
	}
	return true
}

func wildcard(seg string) (string, bool) {
	if len(seg) > 2 && seg[0] == '{' && seg[len(seg)-1] == '}' {
		return seg[1 : len(seg)-1], true
	}
	return "", false
}
