package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/network"
	"github.com/atoll-dev/atoll/internal/testenv"
	"github.com/atoll-dev/atoll/internal/vault"
)

// TestVaultMountE2E mounts memory vaults into real sandboxes with
// networking, and drives them with the stock git client inside: two
// sandboxes share a vault, one of them under deny-all; a read-only mount
// cannot push; tokens of deleted and stopped sandboxes, expired ones and
// ones for another vault are refused; a fork has its own clone and token;
// a mounted vault is not removed unless forced. It measures what a mount
// adds to a create.
func TestVaultMountE2E(t *testing.T) {
	testenv.RequireCommand(t, "git")
	testenv.RequireRoot(t)
	if err := network.Probe(); err != nil {
		testenv.Skip(t, err.Error())
	}
	w := newNetWorld(t)
	data := testenv.Dir(t)
	linkVMCache(t, data) // the vm runtime's images, made once for all tests
	// Tokens good for 6 s, renewed every 2 s: the renewal is tested.
	d := startDaemonWith(t, &daemon{t: t, bin: atollBinary(t), data: data, netns: w.host,
		env: []string{"ATOLL_VAULT_TOKEN_TTL=6s"}, args: []string{"--network", "on", "--network-bridge", w.id,
			"--dns-upstream", wInet4, "--warm-pool", "0", "--prestart", "0", "--network-pool", "0"}})
	c := d.client()
	ctx := context.Background()
	create := func(req api.CreateSandboxRequest) api.Sandbox {
		t.Helper()
		sb, err := c.CreateSandbox(ctx, req)
		if err != nil {
			t.Fatalf("create: %v\n%s", err, d.out.String())
		}
		return sb
	}
	// git runs a script as the sandbox's user in the clone of notes.
	git := func(id, script string) (string, bool) {
		t.Helper()
		var out strings.Builder
		code, err := c.Exec(ctx, id, api.ExecRequest{User: "user", Cwd: "/home/user/memory/notes",
			Shell: "export GIT_TERMINAL_PROMPT=0; " + script}, &out, &out)
		if err != nil {
			t.Fatalf("exec %q: %v", script, err)
		}
		return out.String(), code == 0
	}
	mustGit := func(id, script string) string {
		t.Helper()
		out, ok := git(id, script)
		if !ok {
			t.Fatalf("in %s: %s: %s\n%s", id, script, out, d.out.String())
		}
		return strings.TrimSpace(out)
	}
	// gitStatus is the status of a fetch's first request to vault name
	// with password pw, from the daemon's namespace.
	gitStatus := func(name, pw string) int {
		t.Helper()
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: w.dial}}
		req, _ := http.NewRequest("GET", d.url+"/git/"+name+".git/info/refs?service=git-upload-pack", nil)
		req.SetBasicAuth("sandbox", pw)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	token := func(id string) string {
		t.Helper()
		return mustGit(id, "cat .git/atoll-token")
	}

	for _, name := range []string{"notes", "other"} {
		if _, err := c.CreateVault(ctx, api.CreateVaultRequest{Name: name, Layout: api.VaultLayoutAgent}); err != nil {
			t.Fatal(err)
		}
	}
	a := create(api.CreateSandboxRequest{Vaults: []api.VaultMount{{Name: "notes"}}})
	b := create(api.CreateSandboxRequest{Vaults: []api.VaultMount{{Name: "notes"}},
		Network: &api.NetworkPolicy{Egress: "deny-all"}})
	if len(a.Vaults) != 1 || a.Vaults[0].Path != "/home/user/memory/notes" {
		t.Fatalf("a's vaults: %+v", a.Vaults)
	}
	if got, err := c.GetSandbox(ctx, a.ID); err != nil || !slices.Equal(got.Vaults, a.Vaults) {
		t.Fatalf("the vaults are not recorded: %+v, %v", got.Vaults, err)
	}

	t.Run("no key in the sandbox", func(t *testing.T) {
		out := mustGit(a.ID, "git config --get remote.origin.url; ls -ld . | cut -d' ' -f3; env; grep -r "+d.key+" /home/user 2>/dev/null | wc -l")
		if strings.Contains(out, d.key) || !strings.Contains(out, "/git/notes.git") || !strings.Contains(out, "user") {
			t.Errorf("the clone: %s", out)
		}
		if tok := token(a.ID); !vault.IsToken(tok) {
			t.Errorf("the token file holds %q", tok)
		}
	})

	t.Run("two sandboxes share a vault, deny-all too", func(t *testing.T) {
		mustGit(a.ID, "echo 'met [[Ada]]' > timeline/a.md && git add -A && git commit -qm from-a && git push -q 2>&1")
		mustGit(b.ID, "git pull -q 2>&1")
		if got := mustGit(b.ID, "cat timeline/a.md"); got != "met [[Ada]]" {
			t.Errorf("b reads %q", got)
		}
		mustGit(b.ID, "echo from b > timeline/b.md && git add -A && git commit -qm from-b && git push -q 2>&1")
		mustGit(a.ID, "git pull -q 2>&1")
		if got := mustGit(a.ID, "cat timeline/b.md"); got != "from b" {
			t.Errorf("a reads %q", got)
		}
		// The rest of the host is still refused to the deny-all sandbox:
		// the gateway's git port serves /git/ only.
		gw := strings.TrimPrefix(mustGit(b.ID, "git config --get remote.origin.url"), "http://")
		gw = gw[:strings.Index(gw, "/")]
		if out, ok := git(b.ID, "curl -s -o /dev/null -w '%{http_code}' --max-time 5 http://"+gw+"/v1/sandboxes"); !ok || out != "404" {
			t.Errorf("the API through the git port: %q %v", out, ok)
		}
	})

	t.Run("tokens are renewed", func(t *testing.T) {
		first := parseClaims(t, token(a.ID))
		time.Sleep(7 * time.Second) // past the first token's expiry
		now := parseClaims(t, token(a.ID))
		if !now.Expires.After(first.Expires) || !now.Expires.After(time.Now()) {
			t.Errorf("the token was not renewed: %v then %v", first.Expires, now.Expires)
		}
		mustGit(a.ID, "git pull -q 2>&1 && echo renewed > renewed.md && git add -A && git commit -qm renewed && git push -q 2>&1")
	})

	t.Run("read-only cannot push", func(t *testing.T) {
		ro := create(api.CreateSandboxRequest{Vaults: []api.VaultMount{{Name: "notes", ReadOnly: true}}})
		mustGit(ro.ID, "git pull -q 2>&1")
		out, ok := git(ro.ID, "echo x > ro.md && git add -A && git commit -qm ro && git push 2>&1")
		if ok || !strings.Contains(out, "403") && !strings.Contains(out, "read-only") {
			t.Errorf("a read-only push: %v %s", ok, out)
		}
		c.DeleteSandbox(ctx, ro.ID)
	})

	t.Run("tokens", func(t *testing.T) {
		tokA := token(a.ID)
		if got := gitStatus("notes", tokA); got != 200 {
			t.Fatalf("a's token: %d", got)
		}
		// A token names its vault: not good for another of the tenant's.
		if got := gitStatus("other", tokA); got != 401 {
			t.Errorf("a's token for another vault: %d", got)
		}
		o := create(api.CreateSandboxRequest{Vaults: []api.VaultMount{{Name: "other", Path: "/home/user/memory/notes"}}})
		tokO := token(o.ID)
		if got := gitStatus("notes", tokO); got != 401 {
			t.Errorf("the token of a sandbox that mounts other, on notes: %d", got)
		}
		// Expired: the same claims signed with the server's key, an
		// expiry in the past.
		hexKey, err := os.ReadFile(filepath.Join(data, "vault-token-key"))
		if err != nil {
			t.Fatal(err)
		}
		key, _ := hex.DecodeString(strings.TrimSpace(string(hexKey)))
		claims := parseClaims(t, tokA)
		claims.Expires = time.Now().Add(-time.Second)
		if got := gitStatus("notes", claims.Sign(key)); got != 401 {
			t.Errorf("an expired token: %d", got)
		}
		claims.Expires = time.Now().Add(time.Hour)
		if got := gitStatus("notes", claims.Sign(key)); got != 200 {
			t.Errorf("the positive control, re-signed: %d", got)
		}
		// Forged: another key.
		if got := gitStatus("notes", claims.Sign([]byte("not the server's key, not at all"))); got != 401 {
			t.Errorf("a forged token: %d", got)
		}
		// Stopped, then deleted: refused at once.
		if _, err := c.StopSandbox(ctx, o.ID); err != nil {
			t.Fatal(err)
		}
		if got := gitStatus("other", tokO); got != 401 {
			t.Errorf("a stopped sandbox's token: %d", got)
		}
		// Started again, it has a fresh token at once.
		if _, err := c.StartSandbox(ctx, o.ID); err != nil {
			t.Fatal(err)
		}
		if tk := parseClaims(t, token(o.ID)); !tk.Expires.After(parseClaims(t, tokO).Expires) {
			t.Errorf("a started sandbox's token was not renewed")
		}
		if _, err := c.StopSandbox(ctx, o.ID); err != nil {
			t.Fatal(err)
		}
		if err := c.DeleteSandbox(ctx, o.ID); err != nil {
			t.Fatal(err)
		}
		if got := gitStatus("other", tokO); got != 401 {
			t.Errorf("a deleted sandbox's token: %d", got)
		}
	})

	t.Run("fork has its own clone and token", func(t *testing.T) {
		head := mustGit(a.ID, "git rev-parse HEAD")
		kids, err := c.ForkSandbox(ctx, a.ID, api.ForkRequest{})
		if err != nil {
			t.Fatal(err)
		}
		k := kids[0]
		if got := mustGit(k.ID, "git rev-parse HEAD"); got != head {
			t.Errorf("the fork's clone is at %s, not %s", got, head)
		}
		if tk := parseClaims(t, token(k.ID)); tk.Sandbox != k.ID {
			t.Errorf("the fork's token is %s's", tk.Sandbox)
		}
		mustGit(k.ID, "echo fork > fork.md && git add -A && git commit -qm fork && git push -q 2>&1")
		mustGit(a.ID, "git pull -q 2>&1 && test -f fork.md")
		c.DeleteSandbox(ctx, k.ID)
	})

	t.Run("a link in the vault is a link in a new clone", func(t *testing.T) {
		mustGit(a.ID, "git pull -q 2>&1; ln -s /etc/passwd passwd && ln -s ../../../.. up && git add -A && git commit -qm links && git push -q 2>&1")
		n := create(api.CreateSandboxRequest{Vaults: []api.VaultMount{{Name: "notes"}}})
		if got := mustGit(n.ID, "readlink passwd; readlink up; git status --porcelain"); got != "/etc/passwd\n../../../.." {
			t.Errorf("the new clone: %q", got)
		}
		c.DeleteSandbox(ctx, n.ID)
	})

	t.Run("a mount is a layer of its commit, written through", func(t *testing.T) {
		// A create does not wait for a layer: the clone is unpacked while
		// one is made (for each push, after it) for the next.
		layered := func() api.Sandbox {
			t.Helper()
			for range 50 {
				sb := create(api.CreateSandboxRequest{Vaults: []api.VaultMount{{Name: "notes"}}})
				if sb.Vaults[0].Commit != "" {
					return sb
				}
				c.DeleteSandbox(ctx, sb.ID)
				time.Sleep(100 * time.Millisecond)
			}
			t.Fatal("no create had its vault's layer")
			return api.Sandbox{}
		}
		// x mounts the head as it is; a push later, y mounts the new one.
		x := layered()
		defer c.DeleteSandbox(ctx, x.ID)
		before := mustGit(x.ID, "git rev-parse HEAD")
		if len(x.Vaults) != 1 || x.Vaults[0].Commit != before {
			t.Fatalf("x's mount: %+v, its clone at %s", x.Vaults, before)
		}
		if got, err := c.GetSandbox(ctx, x.ID); err != nil || !slices.Equal(got.Vaults, x.Vaults) {
			t.Errorf("x's mount as recorded: %+v, %v", got.Vaults, err)
		}
		// The files are the commit's, the clone whole and clean, and the
		// agent's own: it changes one of the layer's, adds one, commits
		// and pushes.
		if got := mustGit(x.ID, "git status --porcelain; git fsck --full 2>&1; stat -c %U index.md .git/index .git/objects/pack; git ls-files | wc -l"); got != "user\nuser\nuser\n"+mustGit(x.ID, "find . -path ./.git -prune -o ! -type d -print | wc -l") {
			t.Errorf("x's clone: %q", got)
		}
		mustGit(x.ID, "echo changed >> index.md && echo new > timeline/x.md && git add -A && git commit -qm from-x && git push -q 2>&1")
		after := mustGit(x.ID, "git rev-parse HEAD")
		y := layered()
		defer c.DeleteSandbox(ctx, y.ID)
		if y.Vaults[0].Commit != after || mustGit(y.ID, "git rev-parse HEAD") != after {
			t.Errorf("y's mount: %+v, not at %s", y.Vaults, after)
		}
		if got := mustGit(y.ID, "cat timeline/x.md; tail -1 index.md; git status --porcelain"); got != "new\nchanged" {
			t.Errorf("y's clone: %q", got)
		}
		// z, made at the same commit as y, sees y's layer, not y's changes.
		mustGit(y.ID, "echo y-only > y.md && rm timeline/x.md")
		z := layered()
		defer c.DeleteSandbox(ctx, z.ID)
		if got := mustGit(z.ID, "cat timeline/x.md; test -e y.md || echo no-y; git status --porcelain"); got != "new\nno-y" {
			t.Errorf("z's clone: %q", got)
		}
		// A stop and start, a snapshot's new sandbox: the clone as left.
		if _, err := c.StopSandbox(ctx, y.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := c.StartSandbox(ctx, y.ID); err != nil {
			t.Fatal(err)
		}
		want := "D timeline/x.md\n?? y.md" // sorted, " D" first; trimmed
		if got := mustGit(y.ID, "git status --porcelain | sort"); got != want {
			t.Errorf("y after a stop and start: %q", got)
		}
		kids, err := c.ForkSandbox(ctx, y.ID, api.ForkRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if got := mustGit(kids[0].ID, "git status --porcelain | sort"); got != want {
			t.Errorf("y's fork: %q", got)
		}
		c.DeleteSandbox(ctx, kids[0].ID)
		snap, err := c.CreateSnapshot(ctx, y.ID, api.CreateSnapshotRequest{})
		if err != nil {
			t.Fatal(err)
		}
		s := create(api.CreateSandboxRequest{Snapshot: snap.ID})
		defer c.DeleteSandbox(ctx, s.ID)
		if got := mustGit(s.ID, "git status --porcelain | sort; git rev-parse HEAD; git fsck 2>&1"); got != want+"\n"+after {
			t.Errorf("the snapshot's sandbox: %q", got)
		}
		mustGit(y.ID, "git add -A && git commit -qm from-y && git pull -q --rebase 2>&1 && git push -q 2>&1")
		mustGit(x.ID, "git pull -q 2>&1 && cat y.md && test ! -e timeline/x.md")

		// An archive of z, started again after every layer of the node
		// is gone: its layer is made again from the vault, under its
		// files as it left them.
		mustGit(z.ID, "echo z-only > z.md")
		if _, err := c.StopSandbox(ctx, z.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ArchiveSandbox(ctx, z.ID); err != nil {
			t.Fatal(err)
		}
		layers, _ := filepath.Glob(filepath.Join(data, "vaults", "layers", "*"))
		if len(layers) == 0 {
			t.Fatal("no vault layers on disk")
		}
		for _, l := range layers {
			os.RemoveAll(l)
		}
		if _, err := c.StartSandbox(ctx, z.ID); err != nil {
			t.Fatalf("start of the archived z: %v\n%s", err, d.out.String())
		}
		if got := mustGit(z.ID, "git status --porcelain; git rev-parse HEAD; cat timeline/x.md"); got != "?? z.md\n"+after+"\nnew" {
			t.Errorf("z after its archive: %q", got)
		}
	})

	t.Run("other runtimes stack the layer too", func(t *testing.T) {
		rts, err := c.Runtimes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, rt := range rts {
			if rt.Name == "ns" {
				continue
			}
			t.Run(rt.Name, func(t *testing.T) {
				if !rt.Available {
					testenv.Skip(t, "runtime "+rt.Name+" is not available here")
				}
				var sb api.Sandbox
				for range 50 {
					sb = create(api.CreateSandboxRequest{Runtime: rt.Name, MemoryMiB: 512, Vaults: []api.VaultMount{{Name: "notes"}}})
					if sb.Vaults[0].Commit != "" {
						break
					}
					c.DeleteSandbox(ctx, sb.ID)
					time.Sleep(100 * time.Millisecond)
				}
				defer c.DeleteSandbox(ctx, sb.ID)
				if sb.Vaults[0].Commit == "" {
					t.Fatal("no create had its vault's layer")
				}
				// timeline/x.md, removed by a commit since the layers'
				// first, is a whiteout in a layer of changes.
				if got := mustGit(sb.ID, "git status --porcelain; git rev-parse HEAD; stat -c %U index.md; ls timeline/x.md 2>&1 | grep -c 'No such'"); got != sb.Vaults[0].Commit+"\nuser\n1" {
					t.Errorf("the clone in %s: %q", rt.Name, got)
				}
				mustGit(sb.ID, "echo "+rt.Name+" > "+rt.Name+".md && git add -A && git commit -qm "+rt.Name+" && git pull -q --rebase 2>&1 && git push -q 2>&1")
			})
		}
	})

	t.Run("rm refused while mounted", func(t *testing.T) {
		if err := c.DeleteVault(ctx, "notes", false); !errors.Is(err, errdefs.ErrConflict) && !strings.Contains(fmt.Sprint(err), "mounted") {
			t.Errorf("rm of a mounted vault: %v", err)
		}
	})

	t.Run("bad mounts", func(t *testing.T) {
		for _, ms := range [][]api.VaultMount{
			{{Name: "nope"}},
			{{Name: "../notes"}},
			{{Name: "notes", Path: "/home/user/../../etc"}},
			{{Name: "notes"}, {Name: "notes"}},
		} {
			if _, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Vaults: ms}); err == nil {
				t.Errorf("create with %+v worked", ms)
			}
		}
	})

	t.Run("measure", func(t *testing.T) {
		if _, err := c.CreateVault(ctx, api.CreateVaultRequest{Name: "big"}); err != nil {
			t.Fatal(err)
		}
		seed := create(api.CreateSandboxRequest{Vaults: []api.VaultMount{{Name: "big", Path: "/home/user/memory/notes"}}})
		mustGit(seed.ID, `mkdir -p notes && for i in $(seq 1000); do printf '# note %d\nsome text of note %d, [[note-%d]]\n' $i $i $((i+1)) > notes/n$i.md; done && git add -A && git commit -qm seed && git push -q 2>&1`)
		c.DeleteSandbox(ctx, seed.ID)
		// Interleaved, so that the machine's load falls on all alike.
		kinds := []string{"", "small", "big"}
		times := map[string][]time.Duration{}
		if _, err := c.CreateVault(ctx, api.CreateVaultRequest{Name: "small", Layout: api.VaultLayoutAgent}); err != nil {
			t.Fatal(err)
		}
		for i := range 24 {
			kind := kinds[i%3]
			req := api.CreateSandboxRequest{}
			if kind != "" {
				req.Vaults = []api.VaultMount{{Name: kind}}
			}
			t0 := time.Now()
			sb := create(req)
			dt := time.Since(t0)
			if i >= 3 { // the first round warms up
				times[kind] = append(times[kind], dt)
			}
			if kind == "big" {
				if out, code := sh(t, c, sb.ID, "ls /home/user/memory/big/notes | wc -l"); code != 0 || strings.TrimSpace(out) != "1000" {
					t.Errorf("the clone holds %q files", out)
				}
			}
			c.DeleteSandbox(ctx, sb.ID)
		}
		// The floor of the sandbox's side: the same 1,000 files as a tar
		// through the files API, into a sandbox already made.
		var files bytes.Buffer
		tw := tar.NewWriter(&files)
		for i := range 1000 {
			body := fmt.Sprintf("# note %d\nsome text of note %d, [[note-%d]]\n", i, i, i+1)
			tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("notes/n%d.md", i), Mode: 0o644, Size: int64(len(body)), Uid: 1000, Gid: 1000})
			io.WriteString(tw, body)
		}
		tw.Close()
		for i := range 7 {
			sb := create(api.CreateSandboxRequest{})
			t0 := time.Now()
			if err := c.UploadTar(ctx, sb.ID, "/home/user/memory/big", bytes.NewReader(files.Bytes())); err != nil {
				t.Fatal(err)
			}
			times["tar"] = append(times["tar"], time.Since(t0))
			if i == 0 {
				out, _ := sh(t, c, sb.ID, "mkdir /tmp/f && cd /tmp/f && s=$(date +%s%N); for i in $(seq 1000); do echo x > f$i; done; echo $(( ($(date +%s%N) - s) / 1000000 ))ms")
				t.Logf("1,000 files made by a shell's redirections in the sandbox: %s", strings.TrimSpace(out))
			}
			c.DeleteSandbox(ctx, sb.ID)
		}
		med := func(k string) time.Duration { ds := times[k]; slices.Sort(ds); return ds[len(ds)/2] }
		t.Logf("the same 1,000 files uploaded as a tar through the files API: %v", med("tar"))
		t.Logf("create of a networked sandbox, median of %d: without a vault %v; with the agent layout (6 files) %v (+%v); with a 1,000-file vault %v (+%v)",
			len(times[""]), med(""), med("small"), med("small")-med(""), med("big"), med("big")-med(""))
	})
}

// parseClaims reads a token's claims without checking it.
func parseClaims(t *testing.T, tok string) vault.Token {
	t.Helper()
	body, _, _ := strings.Cut(strings.TrimPrefix(tok, vault.TokenPrefix), ".")
	b, err := base64.RawURLEncoding.DecodeString(body)
	var claims vault.Token
	if err == nil {
		err = json.Unmarshal(b, &claims)
	}
	if err != nil {
		t.Fatalf("token %q: %v", tok, err)
	}
	return claims
}

// TestVaultMountNoNetworkE2E mounts a vault into a sandbox of a server
// without networking: the clone is made from the host's side, so it is
// there; reaching the server to push is not possible from the sandbox's
// loopback-only namespace.
func TestVaultMountNoNetworkE2E(t *testing.T) {
	testenv.RequireCommand(t, "git")
	d, _, c := startRooted(t)
	ctx := context.Background()
	if _, err := c.CreateVault(ctx, api.CreateVaultRequest{Name: "notes", Layout: api.VaultLayoutAgent}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateVault(ctx, api.CreateVaultRequest{Name: "empty"}); err != nil {
		t.Fatal(err)
	}
	// The CLI's syntax: NAME[:ro][=PATH].
	out, code := d.cli("create", "--vault", "notes:ro=/srv/notes", "--vault", "empty")
	if code != 0 {
		t.Fatalf("create --vault: %s", out)
	}
	id := strings.TrimSpace(out)
	sb, err := c.GetSandbox(ctx, id)
	if err != nil || len(sb.Vaults) != 2 || sb.Vaults[0] != (api.VaultMount{Name: "notes", ReadOnly: true, Path: "/srv/notes"}) ||
		sb.Vaults[1].Path != "/home/user/memory/empty" {
		t.Fatalf("recorded: %+v, %v", sb.Vaults, err)
	}
	var buf strings.Builder
	code, err = c.Exec(ctx, id, api.ExecRequest{User: "user", Cwd: "/srv/notes",
		Shell: "git log --oneline | wc -l; test -f index.md && echo index; git status --porcelain; git -C /home/user/memory/empty status --short --branch; git remote get-url origin"}, &buf, &buf)
	if err != nil || code != 0 {
		t.Fatalf("git in the sandbox: %d %v %s", code, err, buf.String())
	}
	if got := buf.String(); !strings.HasPrefix(got, "1\nindex\n## No commits yet on main") || !strings.Contains(got, d.url+"/git/notes.git") {
		t.Errorf("the clones: %q", got)
	}
	// The vault cannot be removed while mounted, but can be forced.
	if out, code := d.cli("vault", "rm", "empty"); code == 0 {
		t.Errorf("vault rm of a mounted vault: %s", out)
	}
	if out, code := d.cli("vault", "rm", "--force", "empty"); code != 0 {
		t.Errorf("vault rm --force: %s", out)
	}
}
