package control

import (
	"crypto/rand"
	"fmt"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

const (
	idLen      = api.SandboxIDLen
	idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
)

// newID returns a random sandbox ID: 20 characters of [a-z0-9], usable as a
// DNS label (ports are served at {port}-{id}.{domain}).
func newID() string {
	b := make([]byte, idLen)
	rand.Read(b)
	for i := range b {
		b[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	// The first character is a letter so IDs never look like numbers.
	b[0] = idAlphabet[int(b[0])%26]
	return string(b)
}

func checkID(id string) error {
	if !api.ValidSandboxID(id) {
		return fmt.Errorf("%w: malformed sandbox ID %q", errdefs.ErrInvalid, truncate(id, 64))
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
