package vault_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/testenv"
	"github.com/atoll-dev/atoll/internal/vault"
)

// layerVault makes vault notes of tenant acme in e with one commit of a
// few files, and returns the spec of a mount of its head at mnt.
func layerVault(t *testing.T, e *env, mnt string) vault.LayerSpec {
	t.Helper()
	ctx := ctxOf("acme")
	if _, err := e.svc.Create(ctx, api.CreateVaultRequest{Name: "notes"}); err != nil {
		t.Fatal(err)
	}
	a := e.clone("acme-key", "notes")
	for name, body := range map[string]string{"a.md": "# A\n", "dir/b.md": "b\n", "z.md": "z\n"} {
		os.MkdirAll(filepath.Join(a, filepath.Dir(name)), 0o755)
		os.WriteFile(filepath.Join(a, name), []byte(body), 0o644)
	}
	mustGit(t, a, "add", "-A")
	mustGit(t, a, "commit", "-qm", "one")
	mustGit(t, a, "push", "-q", "origin", "HEAD:main")
	id, c, err := e.svc.Head(ctx, "notes")
	if err != nil || c == "" {
		t.Fatal(id, c, err)
	}
	return vault.LayerSpec{Vault: id, Tenant: "acme", Name: "notes", Commit: c, Path: mnt, UID: 1000, GID: 1000,
		Dirs: vault.TemplateDirs(nil, mnt, 1000, 1000)}
}

// TestLayerSweepSafe checks that what stops a sweep halfway, or a build
// that takes long, never leaves a layer with files missing at its key,
// nor a mark saying a layer not synced is, and that the sweep removes
// neither a build under way nor a layer just made by a long build.
func TestLayerSweepSafe(t *testing.T) {
	testenv.RequireRoot(t) // files of uid 1000, a mount in a layer
	e := newEnv(t)
	ctx := ctxOf("acme")
	const mnt = "/home/user/memory/notes"
	spec := layerVault(t, e, mnt)
	files := map[string]string{"a.md": "# A\n", "dir/b.md": "b\n", "z.md": "z\n"}
	layersOf := func() string {
		t.Helper()
		dirs, err := e.svc.LayersOf(ctx, []vault.LayerSpec{spec})
		if err != nil {
			t.Fatal(err)
		}
		return dirs[0]
	}
	l := layersOf()
	checkClone(t, l, mnt, spec.Commit, files)

	// A sweep that fails halfway through the layer (here a mount in it,
	// which cannot be removed): the layer's key is whole or gone.
	if err := syscall.Mount("tmpfs", filepath.Join(l, mnt, "dir"), "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	unmount := func() {
		f, _ := os.Open("/proc/self/mounts")
		defer f.Close()
		var ps []string
		for sc := bufio.NewScanner(f); sc.Scan(); {
			if p := strings.Fields(sc.Text()); len(p) > 1 && strings.HasPrefix(p[1], vault.LayersDir(e.svc)) {
				ps = append(ps, p[1])
			}
		}
		for _, p := range ps {
			syscall.Unmount(p, syscall.MNT_DETACH)
		}
	}
	t.Cleanup(unmount)
	vault.AgeLayers(e.svc, 2*time.Minute)
	e.svc.SweepLayers(ctx, map[string]bool{})
	unmount()
	if l2 := layersOf(); l2 != l {
		t.Fatalf("the layer is at %s, was at %s", l2, l)
	}
	checkClone(t, l, mnt, spec.Commit, files)

	// A kill between a sweep's removal of a layer and of its mark: the
	// layer made again has no mark until it is synced.
	tmp := t.TempDir()
	dir := filepath.Join(t.TempDir(), "layer")
	os.WriteFile(dir+".synced", nil, 0o600)
	if err := vault.FinishLayer(vault.LayerSpec{Path: "/notes"}, tmp, dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir + ".synced"); err == nil {
		t.Error("a new layer has the mark of the one swept before it")
	}

	// A build under way is left, however old its directory; what a
	// build of an earlier run left goes.
	building, done, err := vault.TempLayer(e.svc)
	if err != nil {
		t.Fatal(err)
	}
	left := filepath.Join(vault.LayersDir(e.svc), ".tmp-earlier")
	os.MkdirAll(filepath.Join(left, "x"), 0o700)
	vault.AgeLayers(e.svc, 2*time.Minute)
	e.svc.SweepLayers(ctx, map[string]bool{})
	if _, err := os.Stat(building); err != nil {
		t.Errorf("the sweep removed a build under way: %v", err)
	}
	if _, err := os.Stat(left); err == nil {
		t.Error("the sweep left what a build of an earlier run left")
	}
	done()
	if _, err := os.Stat(building); err == nil {
		t.Error("a build's directory is left once it is done")
	}

	// A layer whose build took over a minute is kept a minute once made.
	spec.Path = "/home/user/other"
	spec.Dirs = vault.TemplateDirs(nil, spec.Path, 1000, 1000)
	vault.SetLayerMade(e.svc, func(context.Context, string) { vault.AgeLayers(e.svc, 2*time.Minute) })
	l = layersOf()
	vault.SetLayerMade(e.svc, nil)
	e.svc.SweepLayers(ctx, map[string]bool{})
	if _, err := os.Stat(l); err != nil {
		t.Errorf("the sweep removed a layer just made: %v", err)
	}
}

// TestLayerMountsForgotten checks that the last layers of a mount are
// kept (from the sweep) only while the mount is one of the few of its
// vault remembered, and not once the vault is deleted.
func TestLayerMountsForgotten(t *testing.T) {
	testenv.RequireRoot(t) // files of uid 1000
	e := newEnv(t)
	ctx := ctxOf("acme")
	spec := layerVault(t, e, "/home/user/m0")
	for i := range 6 {
		spec.Path = "/home/user/m" + strconv.Itoa(i)
		spec.Dirs = vault.TemplateDirs(nil, spec.Path, 1000, 1000)
		stack(t, e.svc, spec, 1)
	}
	if n := vault.LastLayers(e.svc); n != 4 {
		t.Errorf("the last layers of %d mounts are kept, want 4", n)
	}
	vault.AgeLayers(e.svc, 2*time.Minute)
	if n := e.svc.SweepLayers(ctx, map[string]bool{}); n != 2 {
		t.Errorf("the sweep removed %d layers, want the 2 of the mounts forgotten", n)
	}
	if err := e.svc.Delete(ctx, "notes", true); err != nil {
		t.Fatal(err)
	}
	if n := vault.LastLayers(e.svc); n != 0 {
		t.Errorf("the last layers of %d mounts of a deleted vault are kept", n)
	}
	// A sandbox over a layer of it, the layer gone: a clear refusal.
	os.RemoveAll(vault.LayersDir(e.svc))
	_, err := e.svc.LayersOf(ctx, []vault.LayerSpec{spec})
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(fmt.Sprint(err), "vault notes was removed") {
		t.Errorf("the layer of a deleted vault: %v", err)
	}
}

// TestLayerCallerGone checks that a layer's build shared by several
// callers is not stopped by the first one's giving up (its request
// cancelled): it runs under the service's context.
func TestLayerCallerGone(t *testing.T) {
	testenv.RequireRoot(t) // files of uid 1000
	e := newEnv(t)
	const mnt = "/home/user/memory/notes"
	spec := layerVault(t, e, mnt)
	cctx, cancel := context.WithCancel(ctxOf("acme"))
	workErr := make(chan error, 1)
	vault.SetLayerMade(e.svc, func(ctx context.Context, _ string) {
		cancel() // the first caller gives up while the layer is made
		workErr <- ctx.Err()
	})
	e.svc.Stack(cctx, spec)
	if err := <-workErr; err != nil {
		t.Errorf("the shared build's context ended with its first caller's: %v", err)
	}
	vault.SetLayerMade(e.svc, nil)
	l := stack(t, e.svc, spec, 1)[0]
	checkClone(t, l, mnt, spec.Commit, map[string]string{"a.md": "# A\n", "dir/b.md": "b\n", "z.md": "z\n"})
}
