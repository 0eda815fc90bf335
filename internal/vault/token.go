package vault

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// A Token is a sandbox's credential for one vault: what a vault mounted
// into a sandbox (docs/vault.md, "In a sandbox") pushes and fetches with,
// in place of an API key, which never enters the sandbox. It is signed
// (HMAC-SHA256 with a key the server keeps, shared by a cluster's nodes),
// so no store is read to check it; what it names is then checked against
// the sandbox's current state, which is what revokes it at once.
type Token struct {
	Vault    string    `json:"v"` // the vault's ID: a vault made again under its name is another
	Name     string    `json:"n"` // the vault's name, for the URL it is good for
	Tenant   string    `json:"t"`
	Sandbox  string    `json:"s"`
	ReadOnly bool      `json:"ro,omitempty"`
	Expires  time.Time `json:"e"`
}

// TokenPrefix begins every token, so that the git endpoint tells one
// from an API key.
const TokenPrefix = "atv1."

// DefaultTokenTTL is how long a minted token is good for.
const DefaultTokenTTL = 10 * time.Minute

// maxToken bounds what ParseToken reads.
const maxToken = 2048

// Sign returns t signed with key.
func (t Token) Sign(key []byte) string {
	b, _ := json.Marshal(t)
	body := base64.RawURLEncoding.EncodeToString(b)
	return TokenPrefix + body + "." + base64.RawURLEncoding.EncodeToString(tokenMAC(key, body))
}

func tokenMAC(key []byte, body string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(TokenPrefix + body))
	return m.Sum(nil)
}

// IsToken reports whether s has a token's shape (not whether it is good).
func IsToken(s string) bool { return strings.HasPrefix(s, TokenPrefix) }

// ParseToken checks s's signature with key and its expiry against now, and
// returns what it says. Any fault is errdefs.ErrUnauthorized, with a
// message that says which without echoing the token.
func ParseToken(key []byte, s string, now time.Time) (Token, error) {
	var t Token
	bad := func(why string) (Token, error) {
		return Token{}, fmt.Errorf("%w: vault token %s", errdefs.ErrUnauthorized, why)
	}
	if len(s) > maxToken {
		return bad("too long")
	}
	rest, ok := strings.CutPrefix(s, TokenPrefix)
	if !ok {
		return bad("malformed")
	}
	body, sig, ok := strings.Cut(rest, ".")
	if !ok {
		return bad("malformed")
	}
	mac, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(mac, tokenMAC(key, body)) {
		return bad("not signed by this server")
	}
	b, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil || json.Unmarshal(b, &t) != nil || t.Vault == "" || t.Sandbox == "" || t.Tenant == "" {
		return bad("malformed")
	}
	if !now.Before(t.Expires) {
		return bad("expired")
	}
	return t, nil
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
