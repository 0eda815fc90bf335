package mcp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// HandlerConfig configures the streamable HTTP handler.
type HandlerConfig struct {
	// URL returns the URL of the atoll server the sessions' tools call:
	// the server's own listener (known only once it listens).
	URL func() string
	// Version is reported to clients as the server's version.
	Version string
	// Logger gets the transport's log; nil logs nothing.
	Logger *slog.Logger
	// SessionTimeout closes a session idle this long (default 30 minutes).
	SessionTimeout time.Duration
}

// NewHandler serves MCP over streamable HTTP. It must sit behind the
// server's authentication (the /v1/mcp route): each session acts with the
// API key of the request that opened it, so its tools see that key's
// tenant only, and a request of the session with another key is refused
// (the SDK compares the key's hash, set here as the token's user).
func NewHandler(cfg HandlerConfig) *Handler {
	if cfg.SessionTimeout == 0 {
		cfg.SessionTimeout = 30 * time.Minute
	}
	servers := &serverCache{cfg: cfg, m: map[string]*mcp.Server{}}
	h := mcp.NewStreamableHTTPHandler(servers.get, &mcp.StreamableHTTPOptions{
		Logger:         cfg.Logger,
		SessionTimeout: cfg.SessionTimeout,
		// The SDK refuses requests to a loopback address whose Host is
		// not loopback, against DNS rebinding of unauthenticated local
		// servers. Every request here carries an API key a rebinding
		// page cannot have, and a reverse proxy on the same machine
		// sends its public Host.
		DisableLocalhostProtection: true,
	})
	verify := func(_ context.Context, key string, _ *http.Request) (*auth.TokenInfo, error) {
		// Checked already; the expiry is the SDK's requirement, and
		// this request's only.
		return &auth.TokenInfo{UserID: keyHash(key), Expiration: time.Now().Add(time.Hour)}, nil
	}
	life, end := context.WithCancel(context.Background())
	return &Handler{next: auth.RequireBearerToken(verify, nil)(h), life: life, end: end}
}

// Handler is the streamable HTTP handler of NewHandler.
type Handler struct {
	next http.Handler
	// life ends at Close, and with it every request.
	life context.Context
	end  context.CancelFunc
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(h.life, cancel)
	defer stop()
	r = r.WithContext(ctx)
	// atoll takes the key as X-API-Key too; the SDK reads bearers.
	if key := r.Header.Get("X-API-Key"); key != "" && r.Header.Get("Authorization") == "" {
		r = r.Clone(ctx)
		r.Header.Set("Authorization", "Bearer "+key)
	}
	h.next.ServeHTTP(w, r)
}

// Close ends the requests under way, among them each session's stream of
// server messages (a GET that stays open for as long as the session): an
// http.Server's Shutdown waits for them. Sessions live in the process:
// after a restart a client opens a new one (its old ID is 404).
func (h *Handler) Close() { h.end() }

// bearer is the request's API key.
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return r.Header.Get("X-API-Key")
}

func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// serverCache holds an MCP server per API key. The SDK asks for the
// server of every request (for its protocol versions), not only of a
// session's first, and making one (its tools' schemas) takes
// milliseconds. A server outlives its cache entry for as long as its
// sessions do.
type serverCache struct {
	cfg HandlerConfig
	mu  sync.Mutex
	m   map[string]*mcp.Server // by keyHash
}

// maxServers bounds the cache: past it, it starts again empty.
const maxServers = 1024

func (c *serverCache) get(r *http.Request) *mcp.Server {
	key := bearer(r)
	h := keyHash(key)
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.m[h]; ok {
		return s
	}
	if len(c.m) >= maxServers {
		clear(c.m)
	}
	s := New(Config{URL: c.cfg.URL(), Key: key, Version: c.cfg.Version})
	c.m[h] = s
	return s
}
