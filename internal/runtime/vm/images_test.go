package vm

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/internal/testenv"
)

func TestDiskLayers(t *testing.T) {
	l := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprint("l", i))
		}
		return out
	}
	for _, tc := range []struct {
		layers, disks int
		want          string
	}{
		{1, 21, "[[l0]]"},
		{3, 3, "[[l0] [l1] [l2]]"},
		{4, 3, "[[l0] [l1] [l2 l3]]"},
		{5, 1, "[[l0 l1 l2 l3 l4]]"},
		{2, 0, "[[l0 l1]]"},
	} {
		if got := fmt.Sprint(diskLayers(l(tc.layers), tc.disks)); got != tc.want {
			t.Errorf("%d layers on %d disks: %s, want %s", tc.layers, tc.disks, got, tc.want)
		}
	}
}

func TestModuleOrder(t *testing.T) {
	// Debian's 6.1.0-57: virtio.ko needs virtio_ring.ko, which older
	// packages built the other way round.
	dep := []byte(`kernel/drivers/virtio/virtio.ko: kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/virtio/virtio_mmio.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/fs/ext4/ext4.ko.xz: kernel/lib/crc16.ko.xz kernel/fs/mbcache.ko.xz kernel/fs/jbd2/jbd2.ko.xz
kernel/fs/jbd2/jbd2.ko.xz:
kernel/fs/mbcache.ko.xz:
kernel/lib/crc16.ko.xz:
kernel/arch/x86/crypto/crc32c-intel.ko:
kernel/fs/overlayfs/overlay.ko:
`)
	got := fmt.Sprint(moduleOrder(dep, []string{"virtio_mmio", "ext4", "crc32c_intel", "overlay", "erofs"}))
	want := "[kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_mmio.ko " +
		"kernel/lib/crc16.ko.xz kernel/fs/mbcache.ko.xz kernel/fs/jbd2/jbd2.ko.xz kernel/fs/ext4/ext4.ko.xz " +
		"kernel/arch/x86/crypto/crc32c-intel.ko kernel/fs/overlayfs/overlay.ko]"
	if got != want {
		t.Errorf("order\n got %s\nwant %s", got, want)
	}
}

// TestHostModuleOrder checks the order for every kernel this host has:
// each module comes after everything its modules.dep line names.
func TestHostModuleOrder(t *testing.T) {
	deps, _ := filepath.Glob("/lib/modules/*/modules.dep")
	if len(deps) == 0 {
		testenv.Skip(t, "no kernel modules on this host (linux-image-amd64)")
	}
	for _, p := range deps {
		dep, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		lines := map[string][]string{}
		for _, l := range strings.Split(string(dep), "\n") {
			if m, rest, ok := strings.Cut(l, ":"); ok {
				lines[m] = strings.Fields(rest)
			}
		}
		loaded := map[string]bool{}
		order := moduleOrder(dep, guestModules)
		for _, m := range order {
			for _, d := range lines[m] {
				if !loaded[d] {
					t.Errorf("%s: %s loads before %s, which it needs", p, m, d)
				}
			}
			loaded[m] = true
		}
		t.Logf("%s: %d modules", p, len(order))
	}
}

func TestConsoleError(t *testing.T) {
	// A real guest's console, booted with virtio.ko ahead of virtio_ring.ko.
	got := consoleError("testdata/console-panic.txt")
	want := "atoll-agent vm-init: loading virtio.ko: no such file or directory; " +
		"Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000100"
	if got != want {
		t.Errorf("consoleError:\n got %q\nwant %q", got, want)
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "console.log")
	os.WriteFile(p, []byte("[    0.1] booting\n[    0.2] something odd\n"), 0o600)
	if got := consoleError(p); got != "[    0.2] something odd" {
		t.Errorf("no panic: %q", got)
	}
}
