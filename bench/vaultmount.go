package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// vaultMountBench measures what mounting a memory vault adds to a create:
// creates with --vault of a vault of files files, interleaved with creates
// without, on one server (networking off: the clone is made from the
// server's side either way).
func vaultMountBench(r *report, work string, n, files int) {
	srv := startServer(work, "vaultmount", 0, 0)
	defer srv.stop()
	c := atoll.New(srv.url, srv.key)
	ctx := context.Background()
	_, err := c.CreateVault(ctx, api.CreateVaultRequest{Name: "big"})
	check(err)
	dir := filepath.Join(work, "vaultmount-seed")
	check(os.MkdirAll(filepath.Join(dir, "notes"), 0o755))
	git := func(args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0",
			"GIT_AUTHOR_NAME=bench", "GIT_AUTHOR_EMAIL=bench@example.com", "GIT_COMMITTER_NAME=bench", "GIT_COMMITTER_EMAIL=bench@example.com")
		if out, err := cmd.CombinedOutput(); err != nil {
			fatal("git %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for i := range files {
		check(os.WriteFile(filepath.Join(dir, "notes", fmt.Sprintf("n%d.md", i)), []byte(fmt.Sprintf("# note %d\nsome text, [[n%d]]\n", i, i+1)), 0o644))
	}
	git("init", "-q", "-b", "main")
	git("add", "-A")
	git("commit", "-q", "-m", "seed")
	git("push", "-q", strings.Replace(c.VaultGitURL("big"), "://", "://x:"+srv.key+"@", 1), "main")
	var with, without []time.Duration
	for i := range 2*n + 2 {
		var req api.CreateSandboxRequest
		if i%2 == 1 {
			req.Vaults = []api.VaultMount{{Name: "big"}}
		}
		t0 := time.Now()
		sb, err := c.CreateSandbox(ctx, req)
		check(err)
		dt := time.Since(t0)
		check(c.DeleteSandbox(ctx, sb.ID))
		switch {
		case i < 2: // warm-up
		case i%2 == 1:
			with = append(with, dt)
		default:
			without = append(without, dt)
		}
	}
	// The first create at each new commit: a push of one file, then a
	// create, whose mount's layer is made while it runs.
	var fresh []time.Duration
	url := strings.Replace(c.VaultGitURL("big"), "://", "://x:"+srv.key+"@", 1)
	for i := range max(n/3, 3) {
		check(os.WriteFile(filepath.Join(dir, "notes", fmt.Sprintf("new%d.md", i)), []byte("a new note\n"), 0o644))
		git("add", "-A")
		git("commit", "-q", "-m", "one more")
		git("push", "-q", url, "main")
		t0 := time.Now()
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Vaults: []api.VaultMount{{Name: "big"}}})
		check(err)
		fresh = append(fresh, time.Since(t0))
		check(c.DeleteSandbox(ctx, sb.ID))
	}
	r.add("create, no vault (interleaved with the next)", "sequential", without)
	r.add(fmt.Sprintf("create --vault of a %d-file vault, at a commit mounted before", files), "sequential", with)
	r.add(fmt.Sprintf("create --vault of a %d-file vault, first at its commit (right after a push)", files), "sequential", fresh)
}
