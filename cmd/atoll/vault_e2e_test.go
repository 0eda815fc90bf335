package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/testenv"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// vaultGit runs the stock git client in dir.
func vaultGit(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=agent", "GIT_AUTHOR_EMAIL=agent@example.com", "GIT_COMMITTER_NAME=agent", "GIT_COMMITTER_EMAIL=agent@example.com")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func mustVaultGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := vaultGit(t, dir, args...)
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(out)
}

// vaultURL is vault name's git URL on d with key as the password.
func vaultURL(d *daemon, key, name string) string {
	return strings.Replace(d.url, "://", "://x:"+key+"@", 1) + "/git/" + name + ".git"
}

// TestVaultE2E drives a memory vault of a real `atoll serve` with the stock
// git client and the CLI: clone, push, clone elsewhere, another tenant's
// key, a restart, kill -9 in the middle of pushes.
func TestVaultE2E(t *testing.T) {
	testenv.RequireCommand(t, "git")
	d, _, c := startRooted(t)
	ctx := context.Background()
	if out, code := d.cli("vault", "create", "notes", "--layout", "agent"); code != 0 || !strings.HasSuffix(strings.TrimSpace(out), "/git/notes.git") {
		t.Fatalf("vault create: %d %s", code, out)
	}
	a := filepath.Join(testenv.Dir(t), "a")
	if out, err := vaultGit(t, testenv.Dir(t), "clone", "-q", vaultURL(d, d.key, "notes"), a); err != nil {
		req, _ := http.NewRequest("GET", d.url+"/git/notes.git/info/refs?service=git-upload-pack", nil)
		req.SetBasicAuth("x", d.key)
		resp, herr := http.DefaultClient.Do(req)
		var body []byte
		if herr == nil {
			body, _ = io.ReadAll(resp.Body)
		}
		t.Fatalf("clone: %v\n%s\n%v %q", err, out, herr, body)
	}
	if _, err := os.Stat(filepath.Join(a, "entities", "README.md")); err != nil {
		t.Fatalf("the agent layout is not in the clone: %v", err)
	}
	os.MkdirAll(filepath.Join(a, "timeline", "2026", "12"), 0o755)
	os.WriteFile(filepath.Join(a, "timeline", "2026", "12", "02.md"), []byte("# Wed\nmet [[Ada]]\n"), 0o644)
	mustVaultGit(t, a, "add", "-A")
	mustVaultGit(t, a, "commit", "-q", "-m", "today")
	mustVaultGit(t, a, "push", "-q")

	b := filepath.Join(testenv.Dir(t), "b")
	mustVaultGit(t, testenv.Dir(t), "clone", "-q", vaultURL(d, d.key, "notes"), b)
	if got, _ := os.ReadFile(filepath.Join(b, "timeline", "2026", "12", "02.md")); !strings.Contains(string(got), "[[Ada]]") {
		t.Errorf("the second clone reads %q", got)
	}
	if out, code := d.cli("vault", "show", "notes", "timeline/2026/12/02.md"); code != 0 || !strings.Contains(out, "[[Ada]]") {
		t.Errorf("vault show: %d %s", code, out)
	}
	if out, code := d.cli("vault", "show", "notes", "timeline/2026/12/02.md@HEAD~1"); code == 0 {
		t.Errorf("vault show at a commit before the file: %d %s, want an error", code, out)
	}
	if out, code := d.cli("vault", "log", "notes"); code != 0 || !strings.Contains(out, "today") || !strings.Contains(out, "Seed the agent layout") {
		t.Errorf("vault log: %d %s", code, out)
	}

	// Another tenant: the vault is not there for it.
	k, err := c.CreateKey(ctx, api.CreateKeyRequest{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.clientWith(k.Key).GetVault(ctx, "notes"); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("another tenant's GetVault: %v, want not found", err)
	}
	if out, err := vaultGit(t, testenv.Dir(t), "clone", vaultURL(d, k.Key, "notes"), "o"); err == nil || !strings.Contains(out, "not found") {
		t.Errorf("another tenant's clone: %v %s", err, out)
	}
	if out, err := vaultGit(t, testenv.Dir(t), "clone", vaultURL(d, "atoll_wrong", "notes"), "w"); err == nil || !strings.Contains(out, "Authentication failed") {
		t.Errorf("a wrong key's clone: %v %s", err, out)
	}
	if _, err := c.CreateVault(ctx, api.CreateVaultRequest{Name: "../etc"}); !errors.Is(err, atoll.ErrInvalid) {
		t.Errorf("a vault named ../etc: %v, want invalid", err)
	}

	// kill -9 while pushes are under way, at several moments: what a push
	// acknowledged is there after the restart, and the branch is one of
	// the commits pushed (no half-updated ref).
	// Large pushes (4 MiB, mostly transfer) and small ones (1 KiB, mostly
	// the server's work: the hook, the object store, the store).
	for i, kill := range []struct {
		size  int
		delay time.Duration
	}{{4 << 20, 5 * time.Millisecond}, {4 << 20, 150 * time.Millisecond}, {4 << 20, 300 * time.Millisecond},
		{1 << 10, 30 * time.Millisecond}, {1 << 10, 50 * time.Millisecond}, {1 << 10, 70 * time.Millisecond}, {1 << 10, 90 * time.Millisecond}, {1 << 10, 120 * time.Millisecond}} {
		delay := kill.delay
		before := mustVaultGit(t, a, "rev-parse", "HEAD")
		big := make([]byte, kill.size)
		rand.Read(big)
		os.WriteFile(filepath.Join(a, fmt.Sprintf("blob%d.bin", i)), big, 0o644)
		mustVaultGit(t, a, "add", "-A")
		mustVaultGit(t, a, "commit", "-q", "-m", fmt.Sprintf("push %d", i))
		pushed := mustVaultGit(t, a, "rev-parse", "HEAD")
		push := exec.Command("git", "push", "-q", "origin", "HEAD:main")
		push.Dir = a
		push.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0")
		if err := push.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(delay)
		d.kill()
		acked := push.Wait() == nil
		d.start()
		mustVaultGit(t, a, "remote", "set-url", "origin", vaultURL(d, d.key, "notes"))
		v, err := d.client().GetVault(ctx, "notes")
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case acked && v.Head != pushed:
			t.Errorf("kill after %v: the push was acknowledged, yet main is %s, not %s", delay, v.Head, pushed)
		case v.Head != pushed && v.Head != before:
			t.Errorf("kill after %v: main is %s, neither the old %s nor the pushed %s", delay, v.Head, before, pushed)
		}
		t.Logf("kill %d bytes after %v: acknowledged %v, stored %v", kill.size, delay, acked, v.Head == pushed)
		// Whatever happened, a fresh clone is whole, and pushing again
		// works (a push that was stored is a no-op).
		fresh := filepath.Join(testenv.Dir(t), fmt.Sprintf("fresh%d", i))
		mustVaultGit(t, testenv.Dir(t), "clone", "-q", vaultURL(d, d.key, "notes"), fresh)
		mustVaultGit(t, fresh, "fsck", "--strict")
		mustVaultGit(t, a, "push", "-q", "origin", "HEAD:main")
	}

	// The restarts kept the vault; rm removes it.
	if out, code := d.cli("vault", "ls"); code != 0 || !strings.Contains(out, "notes") {
		t.Errorf("vault ls after restarts: %d %s", code, out)
	}
	if out, code := d.cli("vault", "rm", "notes"); code != 0 {
		t.Errorf("vault rm: %d %s", code, out)
	}
	if _, err := d.client().GetVault(ctx, "notes"); err == nil {
		t.Error("the vault is there after rm")
	}
}
