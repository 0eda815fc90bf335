package vault_test

import (
	"crypto/rand"
	"testing"

	"github.com/atoll-dev/atoll/api"
)

// A push larger than git's postBuffer comes chunked, without a length.
func TestChunkedPush(t *testing.T) {
	e := newEnv(t)
	ctx := ctxOf("acme")
	e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"})
	a := e.clone("acme-key", "notes")
	big := make([]byte, 4<<20)
	rand.Read(big)
	head := commitFile(t, a, "big.bin", string(big))
	mustGit(t, a, "push", "-q", "origin", "HEAD:main")
	if v, _ := e.svc.Get(ctx, "notes"); v.Head != head {
		t.Errorf("after a chunked push the head is %s, want %s", v.Head, head)
	}
}
