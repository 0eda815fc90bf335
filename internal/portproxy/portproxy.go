// Package portproxy serves sandboxes' ports on the host: an HTTP reverse
// proxy that sends http://{port}-{id}.{domain} (or a request carrying the
// Atoll-Sandbox-Id and Atoll-Sandbox-Port headers) to that port of the
// sandbox's address on the bridge, websockets and streams included. Ports
// of a sandbox that is not public open only with its access token or a
// signed URL that has not expired; both are HMACs under the server's port
// key.
package portproxy

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/httpkit"
)

// Headers and parameters of the proxy's protocol. None of them reaches the
// sandbox.
const (
	HeaderSandboxID   = "Atoll-Sandbox-Id"
	HeaderSandboxPort = "Atoll-Sandbox-Port"
	HeaderToken       = "Atoll-Access-Token"
	ParamExpires      = "atoll_expires"
	ParamSig          = "atoll_sig"
	// cookieName carries a signed URL's grant to the pages and assets a
	// browser loads after it: "{expires}.{sig}", for that host only.
	cookieName = "atoll_access"
)

// Sandboxes is what the proxy needs of the sandbox service.
type Sandboxes interface {
	// PortTarget returns the IPv4 address of running sandbox id and
	// whether its ports are public, and counts the request as activity.
	// Errors carry errdefs kinds.
	PortTarget(ctx context.Context, id string) (addr netip.Addr, public bool, err error)
	// Touch counts activity of sandbox id.
	Touch(id string)
}

// Config configures a Proxy.
type Config struct {
	Sandboxes Sandboxes
	// Key signs access tokens and URLs; at least 32 bytes (see LoadKey).
	Key []byte
	// Domain is the domain under which ports are served; default
	// "localhost", whose names resolve to loopback in browsers and curl.
	Domain string
	// URLPort is the port URLs name; 0 names none (port 80).
	URLPort int
	Logger  *slog.Logger
}

// Proxy is the port proxy, an http.Handler.
type Proxy struct {
	cfg Config
	rp  *httputil.ReverseProxy
}

// touchEvery is how often a request still open counts as activity.
const touchEvery = 30 * time.Second

// New returns a Proxy.
func New(cfg Config) (*Proxy, error) {
	if cfg.Sandboxes == nil {
		return nil, errors.New("portproxy: no sandboxes")
	}
	if len(cfg.Key) < 32 {
		return nil, errors.New("portproxy: the key must have at least 32 bytes")
	}
	if cfg.Domain == "" {
		cfg.Domain = "localhost"
	}
	cfg.Domain = strings.ToLower(strings.Trim(cfg.Domain, "."))
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{cfg: cfg}
	tr := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // a sandbox's server may think for as long as it likes
		ExpectContinueTimeout: time.Second,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:       p.rewrite,
		Transport:     tr,
		FlushInterval: -1,
		BufferPool:    bufferPool{},
		ErrorHandler:  p.proxyError,
		ErrorLog:      slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelDebug),
	}
	return p, nil
}

// bufferPool gives the proxy's copies 256 KiB buffers rather than
// ReverseProxy's 32 KiB: fewer system calls for a large download.
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

func (bufferPool) Get() []byte  { return *buffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { buffers.Put(&b) }

// target is a request's destination, kept in its context for rewrite.
type target struct {
	id   string
	port int
	addr netip.Addr
	fail FailFunc
}

type targetKey struct{}

// ServeHTTP routes a request to a sandbox's port.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, port, byHost, err := p.route(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", err.Error())
		return
	}
	p.serve(w, r, id, port, func(public bool) bool {
		if public {
			return true
		}
		ok, cookie := p.authorized(r, id, port, byHost)
		if !ok {
			writeError(w, http.StatusUnauthorized, "unauthorized",
				"this sandbox's ports need its access token (header "+HeaderToken+") or a signed URL that has not expired")
			return false
		}
		if cookie != nil {
			http.SetCookie(w, cookie)
		}
		return true
	}, writeFailure)
}

// Failure is why the proxy did not deliver a request: atoll's status,
// error code and message for it, and whether the sandbox is gone (unknown
// or not running) rather than its port silent.
type Failure struct {
	Status        int
	Code, Message string
	SandboxGone   bool
}

// FailFunc answers a request the proxy did not deliver.
type FailFunc func(w http.ResponseWriter, f Failure)

// writeFailure is atoll's answer: its JSON error.
func writeFailure(w http.ResponseWriter, f Failure) { writeError(w, f.Status, f.Code, f.Message) }

// ServePort serves r to port of sandbox id for a caller that routed it and
// checked its access itself: the E2B-compatible API, whose SDKs address
// ports with headers and tokens of their own, and expect its words when
// the port cannot be reached (fail; nil answers as the proxy does).
func (p *Proxy) ServePort(w http.ResponseWriter, r *http.Request, id string, port int, fail FailFunc) {
	if !api.ValidSandboxID(id) || port < 1 || port > 65535 {
		writeError(w, http.StatusBadRequest, "invalid", fmt.Sprintf("malformed sandbox ID %q or port %d", truncate(id, 64), port))
		return
	}
	if fail == nil {
		fail = writeFailure
	}
	p.serve(w, r, id, port, func(bool) bool { return true }, fail)
}

// serve proxies r to port of sandbox id if allow, told whether the
// sandbox's ports are public, says so (having answered r if not); fail
// answers what cannot be delivered.
func (p *Proxy) serve(w http.ResponseWriter, r *http.Request, id string, port int, allow func(public bool) bool, fail FailFunc) {
	addr, public, err := p.cfg.Sandboxes.PortTarget(r.Context(), id)
	if err != nil {
		fail(w, p.lookupFailure(id, err))
		return
	}
	if !allow(public) {
		return
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(touchEvery)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				p.cfg.Sandboxes.Touch(id)
			}
		}
	}()
	defer func() {
		close(done)
		wg.Wait()
		p.cfg.Sandboxes.Touch(id)
	}()
	// HTTP/1 answers otherwise stop the request body from being read once
	// they begin: a sandbox's server that answers before it has read the
	// whole body (a stream both ways) would wait for the rest forever.
	http.NewResponseController(w).EnableFullDuplex()
	ctx := context.WithValue(r.Context(), targetKey{}, target{id: id, port: port, addr: addr, fail: fail})
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

// route finds which sandbox port r is for: by its Host,
// {port}-{id}.{domain}, or else by its headers. byHost tells which.
func (p *Proxy) route(r *http.Request) (id string, port int, byHost bool, err error) {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if label, ok := strings.CutSuffix(host, "."+p.cfg.Domain); ok {
		ps, id, ok := strings.Cut(label, "-")
		if !ok || strings.Contains(label, ".") {
			return "", 0, false, fmt.Errorf("malformed host %q: want {port}-{sandbox id}.%s", truncate(host, 80), p.cfg.Domain)
		}
		port, err := ParsePort(ps)
		if err != nil {
			return "", 0, false, err
		}
		if !api.ValidSandboxID(id) {
			return "", 0, false, fmt.Errorf("malformed sandbox ID %q", truncate(id, 64))
		}
		return id, port, true, nil
	}
	id, ps := r.Header.Get(HeaderSandboxID), r.Header.Get(HeaderSandboxPort)
	if id == "" && ps == "" {
		return "", 0, false, fmt.Errorf("not a sandbox port: use http://{port}-{sandbox id}.%s/ or the %s and %s headers", p.cfg.Domain, HeaderSandboxID, HeaderSandboxPort)
	}
	if ps == "" {
		return "", 0, false, fmt.Errorf("missing %s header", HeaderSandboxPort)
	}
	port, err = ParsePort(ps)
	if err != nil {
		return "", 0, false, err
	}
	if !api.ValidSandboxID(id) {
		return "", 0, false, fmt.Errorf("malformed sandbox ID %q in %s", truncate(id, 64), HeaderSandboxID)
	}
	return id, port, false, nil
}

// ParsePort parses a TCP port, 1 to 65535, in plain decimal.
func ParsePort(s string) (int, error) {
	bad := fmt.Errorf("malformed port %q: want 1 to 65535", truncate(s, 16))
	if s == "" || len(s) > 5 || s[0] == '0' {
		return 0, bad
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, bad
		}
	}
	n, _ := strconv.Atoi(s)
	if n > 65535 {
		return 0, bad
	}
	return n, nil
}

// authorized tells whether r may open port of sandbox id: with its token,
// a signed URL (then it returns a cookie to set, for a request by host, so
// that what a browser loads next opens too), or such a cookie.
func (p *Proxy) authorized(r *http.Request, id string, port int, byHost bool) (bool, *http.Cookie) {
	if tok := r.Header.Get(HeaderToken); tok != "" {
		return hmac.Equal([]byte(tok), []byte(p.Token(id))), nil
	}
	q := r.URL.Query()
	if q.Has(ParamSig) || q.Has(ParamExpires) {
		exp, ok := p.verify(id, port, q.Get(ParamExpires), q.Get(ParamSig))
		if !ok {
			return false, nil
		}
		if !byHost {
			return true, nil
		}
		return true, &http.Cookie{
			Name: cookieName, Value: q.Get(ParamExpires) + "." + q.Get(ParamSig),
			Path: "/", Expires: exp, HttpOnly: true, SameSite: http.SameSiteLaxMode,
		}
	}
	if c, err := r.Cookie(cookieName); err == nil && byHost {
		exp, sig, _ := strings.Cut(c.Value, ".")
		_, ok := p.verify(id, port, exp, sig)
		return ok, nil
	}
	return false, nil
}

// verify checks a signature over id, port and expiry, and the expiry.
func (p *Proxy) verify(id string, port int, expires, sig string) (time.Time, bool) {
	exp, err := strconv.ParseInt(expires, 10, 64)
	if err != nil || exp <= 0 {
		return time.Time{}, false
	}
	t := time.Unix(exp, 0)
	if !time.Now().Before(t) {
		return t, false
	}
	return t, hmac.Equal([]byte(sig), []byte(p.sign(id, port, exp)))
}

func (p *Proxy) mac(parts ...string) string {
	m := hmac.New(sha256.New, p.cfg.Key)
	m.Write([]byte(strings.Join(parts, "\x00")))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func (p *Proxy) sign(id string, port int, expires int64) string {
	return p.mac("atoll-port-url", id, strconv.Itoa(port), strconv.FormatInt(expires, 10))
}

// Token is the access token of every port of sandbox id.
func (p *Proxy) Token(id string) string { return "atp_" + p.mac("atoll-port-token", id) }

// URL is where port of sandbox id is served; with ttl > 0 it carries a
// signed URL valid for ttl, and for a sandbox that is not public its
// token.
func (p *Proxy) URL(id string, port int, public bool, ttl time.Duration) api.PortURL {
	host := strconv.Itoa(port) + "-" + id + "." + p.cfg.Domain
	if p.cfg.URLPort != 0 && p.cfg.URLPort != 80 {
		host = net.JoinHostPort(host, strconv.Itoa(p.cfg.URLPort))
	}
	u := api.PortURL{Port: port, URL: "http://" + host + "/", Public: public}
	if !public {
		u.Token = p.Token(id)
	}
	if ttl > 0 {
		exp := time.Now().Add(ttl).Truncate(time.Second)
		q := url.Values{ParamExpires: {strconv.FormatInt(exp.Unix(), 10)}, ParamSig: {p.sign(id, port, exp.Unix())}}
		u.SignedURL = u.URL + "?" + q.Encode()
		exp = exp.UTC()
		u.ExpiresAt = &exp
	}
	return u
}

// rewrite sends the request to its target and strips what belongs to the
// proxy: its headers, its parameters and its cookie.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	t := pr.In.Context().Value(targetKey{}).(target)
	pr.SetURL(&url.URL{Scheme: "http", Host: net.JoinHostPort(t.addr.String(), strconv.Itoa(t.port))})
	pr.Out.Host = pr.In.Host
	pr.SetXForwarded()
	h := pr.Out.Header
	h.Del(HeaderToken)
	h.Del(HeaderSandboxID)
	h.Del(HeaderSandboxPort)
	if q := pr.Out.URL.Query(); q.Has(ParamSig) || q.Has(ParamExpires) {
		q.Del(ParamSig)
		q.Del(ParamExpires)
		pr.Out.URL.RawQuery = q.Encode()
	}
	if cs := pr.Out.Cookies(); len(cs) > 0 {
		h.Del("Cookie")
		for _, c := range cs {
			if c.Name != cookieName {
				pr.Out.AddCookie(c)
			}
		}
	}
}

// lookupFailure is why PortTarget failed. The proxy answers nothing with
// 500: an error of no kind is the sandbox service failing, 503.
func (p *Proxy) lookupFailure(id string, err error) Failure {
	switch {
	case errors.Is(err, errdefs.ErrInvalid):
		return Failure{Status: http.StatusBadRequest, Code: "invalid", Message: err.Error()}
	case errors.Is(err, errdefs.ErrNotFound):
		return Failure{Status: http.StatusNotFound, Code: "not_found", Message: "no sandbox " + id, SandboxGone: true}
	case errors.Is(err, errdefs.ErrUnavailable), errors.Is(err, errdefs.ErrConflict):
		return Failure{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: err.Error(), SandboxGone: true}
	}
	p.cfg.Logger.Error("looking up sandbox for the port proxy", "sandbox", id, "err", err)
	return Failure{Status: http.StatusServiceUnavailable, Code: "unavailable", Message: "the sandbox cannot be reached now"}
}

// proxyError answers a request the sandbox did not answer.
func (p *Proxy) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	t, _ := r.Context().Value(targetKey{}).(target)
	if r.Context().Err() != nil {
		return // the client went away
	}
	f := Failure{Status: http.StatusBadGateway, Code: "unavailable", Message: fmt.Sprintf("nothing answers on port %d of sandbox %s", t.port, t.id)}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		f.Status, f.Message = http.StatusGatewayTimeout, fmt.Sprintf("port %d of sandbox %s did not answer in time", t.port, t.id)
	} else if !isDialError(err) {
		f.Message = fmt.Sprintf("port %d of sandbox %s did not answer with HTTP", t.port, t.id)
	}
	p.cfg.Logger.Debug("port proxy", "sandbox", t.id, "port", t.port, "err", err)
	if t.fail == nil {
		t.fail = writeFailure
	}
	t.fail(w, f)
}

func isDialError(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}

// writeError answers in atoll's shape, never cached: the next request may
// find the sandbox or port there.
func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Cache-Control", "no-store")
	httpkit.Atoll.Error(w, status, code, msg)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// LoadKey reads the port key at path, making a random one (readable by
// root only) if there is none.
func LoadKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		key, err := hex.DecodeString(strings.TrimSpace(string(b)))
		if err != nil || len(key) < 32 {
			return nil, fmt.Errorf("port key %s is malformed: want 64 hex digits", path)
		}
		return key, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	key := make([]byte, 32)
	rand.Read(key)
	f, err := os.CreateTemp(filepath.Dir(path), ".port-key-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(f.Name())
	if _, err := f.WriteString(hex.EncodeToString(key) + "\n"); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	if err := os.Link(f.Name(), path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return LoadKey(path) // made by another process meanwhile
		}
		return nil, err
	}
	return key, nil
}
