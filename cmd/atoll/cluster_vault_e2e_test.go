package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/testenv"
	"github.com/atoll-dev/atoll/internal/testenv/netcluster"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// TestClusterVaultMount mounts a vault into a sandbox the scheduler places
// on another node than the one that took the create. A vault is made
// through n1 and a commit pushed to it from a sandbox on n1 (through n1's
// vault git port); a create with the vault through n1, with n1 cordoned,
// runs on n2, and its clone is there at the pushed commit (n2 mounted it:
// the clone goes through the sandbox's agent). A commit pushed from inside
// it (through n2's vault git port, with a token n2 signed) is the vault's
// head as n3 sees it. Stopped and started through other nodes, it gets
// fresh tokens from n2 and pushes again; moved off n2 by a drain, it
// runs on n3, which writes them.
func TestClusterVaultMount(t *testing.T) {
	testenv.RequireCommand(t, "git")
	cl := startCluster(t, netcluster.Config{Cluster: true,
		Args: []string{"--warm-pool", "0", "--prestart", "0", "--node-lease", "3s",
			"--node-capacity", "cpu=4,memory=4Gi,disk=20,sandboxes=8"}})
	ctx := context.Background()
	c1, c3 := cl.Nodes[0].Client(), cl.Nodes[2].Client()
	git := func(c *atoll.Client, id, script string) string {
		t.Helper()
		var out bytes.Buffer
		code, err := c.Exec(ctx, id, api.ExecRequest{User: "user", Cwd: "/home/user/memory/notes",
			Shell: "export GIT_TERMINAL_PROMPT=0; " + script}, &out, &out)
		if err != nil || code != 0 {
			t.Fatalf("in %s: %s: exit %d %v: %s", id, script, code, err, out.String())
		}
		return strings.TrimSpace(out.String())
	}

	if _, err := c1.CreateVault(ctx, api.CreateVaultRequest{Name: "notes", Layout: api.VaultLayoutAgent}); err != nil {
		t.Fatal(err)
	}
	small := api.CreateSandboxRequest{CPU: 0.25, MemoryMiB: 64, DiskGiB: 1, Vaults: []api.VaultMount{{Name: "notes"}}}
	a := onNode1(t, cl, small)[0]
	git(c1, a.ID, "echo 'from n1' > timeline/a.md && git add -A && git commit -qm from-n1 && git push -q 2>&1")
	pushed := git(c1, a.ID, "git rev-parse HEAD")

	// Placed on n2: n1 (which takes the create) and n3 cordoned.
	for _, n := range []string{"n1", "n3"} {
		if err := c1.CordonNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	b, err := c1.CreateSandbox(ctx, small)
	if err != nil {
		t.Fatalf("create with a vault through n1, placed on n2: %v\nnode 2: %s", err, tail(cl.Nodes[1].Log()))
	}
	if b.Node != "n2" || len(b.Vaults) != 1 || b.Vaults[0].Path != "/home/user/memory/notes" {
		t.Fatalf("the sandbox: node %q, vaults %+v; want n2 with notes", b.Node, b.Vaults)
	}
	if got := git(c1, b.ID, "git rev-parse HEAD"); got != pushed {
		t.Errorf("the clone on n2 is at %s, want the pushed %s", got, pushed)
	}
	if got := git(c1, b.ID, "cat timeline/a.md"); got != "from n1" {
		t.Errorf("timeline/a.md in the clone on n2: %q", got)
	}
	if url := git(c1, b.ID, "git config --get remote.origin.url"); !strings.Contains(url, "/git/notes.git") {
		t.Errorf("the clone's remote: %q", url)
	}

	// A push from inside, through n2, seen through n3.
	git(c1, b.ID, "echo 'from n2' > timeline/b.md && git add -A && git commit -qm from-n2 && git push -q 2>&1")
	head := git(c1, b.ID, "git rev-parse HEAD")
	log, err := c3.VaultLog(ctx, "notes", "", 5)
	if err != nil || len(log) == 0 || log[0].ID != head || log[0].Subject != "from-n2" {
		t.Fatalf("the vault's log through n3: %+v %v; want %s (from-n2) first", log, err, head)
	}

	// Stopped through n1 and started through n3: n2 starts it and writes
	// fresh tokens into its clone, which pushes again.
	tok := git(c1, b.ID, "cat .git/atoll-token")
	if _, err := c1.StopSandbox(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if sb, err := c3.StartSandbox(ctx, b.ID); err != nil || sb.Node != "n2" {
		t.Fatalf("start through n3: %+v %v", sb, err)
	}
	if got := git(c1, b.ID, "cat .git/atoll-token"); got == tok {
		t.Errorf("the clone's token is the same after the start")
	}
	git(c1, b.ID, "echo again > timeline/c.md && git add -A && git commit -qm again && git push -q 2>&1")
	if log, err := c1.VaultLog(ctx, "notes", "", 1); err != nil || len(log) != 1 || log[0].Subject != "again" {
		t.Errorf("the vault's log through n1 after the push from the started sandbox: %+v %v", log, err)
	}

	// Running, moved off n2 by a drain: n2 archives it and has n3 start it
	// (n3's start endpoint), which writes fresh tokens into its clone.
	tok = git(c1, b.ID, "cat .git/atoll-token")
	if err := c1.UncordonNode(ctx, "n3"); err != nil {
		t.Fatal(err)
	}
	if err := c1.DrainNode(ctx, "n2"); err != nil {
		t.Fatal(err)
	}
	waitNode(t, c1, "n2", func(n api.Node) bool { return n.Drain != nil && n.Drain.Moved == 1 })
	if sb, err := c1.GetSandbox(ctx, b.ID); err != nil || sb.Node != "n3" || sb.State != api.StateRunning {
		t.Fatalf("after the drain of n2: %s on %s, %v; want running on n3\nnode 3: %s", sb.State, sb.Node, err, tail(cl.Nodes[2].Log()))
	}
	if got := git(c1, b.ID, "cat .git/atoll-token"); got == tok {
		t.Errorf("the clone's token is the same after the move to n3")
	}
	git(c1, b.ID, "git pull -q 2>&1; echo moved > timeline/d.md && git add -A && git commit -qm moved && git push -q 2>&1")
	if log, err := c1.VaultLog(ctx, "notes", "", 1); err != nil || len(log) != 1 || log[0].Subject != "moved" {
		t.Errorf("the vault's log after the push from n3: %+v %v", log, err)
	}
	t.Logf("clone on n2 at %s; push from n2 seen through n3 at %s", pushed[:12], head[:12])
}
