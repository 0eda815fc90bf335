package mcp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strings"
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
func NewHandler(cfg HandlerConfig) http.Handler {
	if cfg.SessionTimeout == 0 {
		cfg.SessionTimeout = 30 * time.Minute
	}
	h := mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server {
		return New(Config{URL: cfg.URL(), Key: bearer(r), Version: cfg.Version})
	}, &mcp.StreamableHTTPOptions{
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
		sum := sha256.Sum256([]byte(key))
		// Checked already; the expiry is the SDK's requirement, and
		// this request's only.
		return &auth.TokenInfo{UserID: hex.EncodeToString(sum[:]), Expiration: time.Now().Add(time.Hour)}, nil
	}
	withUser := auth.RequireBearerToken(verify, nil)(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// atoll takes the key as X-API-Key too; the SDK reads bearers.
		if key := r.Header.Get("X-API-Key"); key != "" && r.Header.Get("Authorization") == "" {
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+key)
		}
		withUser.ServeHTTP(w, r)
	})
}

// bearer is the request's API key.
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return r.Header.Get("X-API-Key")
}
