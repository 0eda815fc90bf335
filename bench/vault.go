package main

import (
	"bytes"
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

// vaultBench measures the push of a 1-file commit to a memory vault with
// the stock git client, from the start of `git push` to its exit: the push
// acknowledged, hence durable (its pack in the archive directory, its refs
// in SQLite); beside the same commits pushed to a bare repository on the
// same disk over file://, the floor.
func vaultBench(r *report, work string, n int) {
	srv := startServer(work, "vault", 0, 0)
	defer srv.stop()
	c := atoll.New(srv.url, srv.key)
	_, err := c.CreateVault(context.Background(), api.CreateVaultRequest{Name: "bench", Layout: api.VaultLayoutAgent})
	check(err)
	dir := filepath.Join(work, "vault-clone")
	url := strings.Replace(c.VaultGitURL("bench"), "://", "://x:"+srv.key+"@", 1)
	git := func(args ...string) {
		cmd := exec.Command("git", args...)
		cmd.Dir = work
		if _, err := os.Stat(dir); err == nil {
			cmd.Dir = dir
		}
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0",
			"GIT_AUTHOR_NAME=bench", "GIT_AUTHOR_EMAIL=bench@example.com", "GIT_COMMITTER_NAME=bench", "GIT_COMMITTER_EMAIL=bench@example.com")
		if out, err := cmd.CombinedOutput(); err != nil {
			fatal("git %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	git("clone", "-q", url, dir)
	floor := filepath.Join(work, "vault-floor.git")
	git("init", "-q", "--bare", floor)
	var pushes, floors []time.Duration
	for i := 0; i < n; i++ {
		check(os.WriteFile(filepath.Join(dir, fmt.Sprintf("note%d.md", i)), []byte(fmt.Sprintf("# note %d\n", i)), 0o644))
		git("add", "-A")
		git("commit", "-q", "-m", fmt.Sprintf("note %d", i))
		t0 := time.Now()
		git("push", "-q", floor, "HEAD:main")
		floors = append(floors, time.Since(t0))
		t0 = time.Now()
		git("push", "-q", "origin", "HEAD:main")
		pushes = append(pushes, time.Since(t0))
	}
	srv.logFile.Sync()
	logged, _ := os.ReadFile(srv.log)
	r.note(fmt.Sprintf("vault pushes taken in-process by the server: %d of %d", bytes.Count(logged, []byte("in_process=true")), n))
	r.add("vault push of a 1-file commit, acknowledged (git over HTTP)", "sequential", pushes)
	r.add("the same pushes to a bare repository over file:// (floor)", "sequential", floors)
}
