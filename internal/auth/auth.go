// Package auth checks API keys and issues them. A key is "atoll_" and 48
// hex digits of randomness; the store keeps only its SHA-256 hash, with its
// name and its tenant (package tenant), and a key's ID is the start of its
// hash. Keys of the default tenant are admin keys: they issue and revoke
// keys.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// Keys checks and issues the API keys kept in a store.
type Keys struct {
	st store.Store
	// mu guards known, the keys found valid, by hash.
	mu    sync.Mutex
	known map[string]store.Key
}

// New returns the Keys of st.
func New(st store.Store) *Keys { return &Keys{st: st, known: map[string]store.Key{}} }

// Hash is the stored form of key.
func Hash(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

// NewKey returns a fresh random key.
func NewKey() string {
	b := make([]byte, 24)
	rand.Read(b)
	return "atoll_" + hex.EncodeToString(b)
}

// Authenticate returns the tenant of key; errdefs.ErrUnauthorized if it is
// not a key of this server.
func (k *Keys) Authenticate(ctx context.Context, key string) (string, error) {
	key = strings.TrimSpace(key)
	if key == "" || len(key) > 256 {
		return "", fmt.Errorf("%w: missing or malformed API key", errdefs.ErrUnauthorized)
	}
	h := Hash(key)
	k.mu.Lock()
	sk, ok := k.known[h]
	k.mu.Unlock()
	if ok {
		return sk.Tenant, nil
	}
	sk, err := k.st.LookupKey(ctx, h)
	if errors.Is(err, errdefs.ErrNotFound) {
		return "", fmt.Errorf("%w: invalid API key", errdefs.ErrUnauthorized)
	}
	if err != nil {
		return "", err
	}
	k.mu.Lock()
	k.known[h] = sk
	k.mu.Unlock()
	return sk.Tenant, nil
}

// EnsureFirst makes the first key, the default tenant's, if the store has
// no key, and returns it; "" if there were keys already.
func (k *Keys) EnsureFirst(ctx context.Context, save func(key string) error) (string, error) {
	n, err := k.st.KeyCount(ctx)
	if err != nil || n > 0 {
		return "", err
	}
	key := NewKey()
	if err := save(key); err != nil {
		return "", err
	}
	if err := k.st.AddKey(ctx, Hash(key), "admin", tenant.Default); err != nil {
		return "", err
	}
	return key, nil
}

// validName is a key's name: 1 to 63 of [A-Za-z0-9._-].
func validName(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	return strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == ""
}

// Create issues a key named req.Name for tenant req.Tenant, or else for a
// new tenant named after the key, in lower case: one that owns nothing yet,
// so that a name used twice does not join two teams (errdefs.ErrConflict;
// name the tenant to add a key to it). The answer is the only place the
// key itself is ever shown.
func (k *Keys) Create(ctx context.Context, req api.CreateKeyRequest) (api.APIKey, error) {
	if !validName(req.Name) {
		return api.APIKey{}, fmt.Errorf("%w: key name %q: want 1 to 63 of [A-Za-z0-9._-]", errdefs.ErrInvalid, truncate(req.Name))
	}
	t := req.Tenant
	if t == "" {
		t = strings.ToLower(req.Name)
	}
	if !tenant.Valid(t) {
		return api.APIKey{}, fmt.Errorf("%w: tenant %q: want 1 to 63 of [a-z0-9-], starting with a letter or digit", errdefs.ErrInvalid, truncate(t))
	}
	if req.Tenant == "" {
		used, err := k.st.TenantInUse(ctx, t)
		if err != nil {
			return api.APIKey{}, err
		}
		if used {
			return api.APIKey{}, fmt.Errorf("%w: tenant %s exists; name it as the tenant to add a key to it", errdefs.ErrConflict, t)
		}
	}
	key := NewKey()
	h := Hash(key)
	if err := k.st.AddKey(ctx, h, req.Name, t); err != nil {
		return api.APIKey{}, err
	}
	sk, err := k.st.LookupKey(ctx, h)
	if err != nil {
		return api.APIKey{}, err
	}
	out := apiKey(sk)
	out.Key = key
	return out, nil
}

// List returns every key (never the keys themselves).
func (k *Keys) List(ctx context.Context) ([]api.APIKey, error) {
	sks, err := k.st.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	out := []api.APIKey{}
	for _, sk := range sks {
		out = append(out, apiKey(sk))
	}
	return out, nil
}

// Delete revokes the key with ID id at once; the last admin key cannot be
// revoked (errdefs.ErrConflict).
func (k *Keys) Delete(ctx context.Context, id string) error {
	if len(id) != 20 || strings.Trim(id, "0123456789abcdef") != "" {
		return fmt.Errorf("%w: malformed key ID %q: want 20 hex digits", errdefs.ErrInvalid, truncate(id))
	}
	if err := k.st.DeleteKey(ctx, id); err != nil {
		return err
	}
	k.mu.Lock()
	for h := range k.known {
		if store.KeyID(h) == id {
			delete(k.known, h)
		}
	}
	k.mu.Unlock()
	return nil
}

func apiKey(sk store.Key) api.APIKey {
	return api.APIKey{ID: sk.ID, Name: sk.Name, Tenant: sk.Tenant, Admin: tenant.IsAdmin(sk.Tenant), CreatedAt: sk.CreatedAt}
}

func truncate(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}
