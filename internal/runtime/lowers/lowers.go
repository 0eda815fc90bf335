// Package lowers gives a sandbox's overlay root a lower layer with inode
// numbers of its own.
//
// The layer store keeps each template layer and each writable layer in a
// btrfs subvolume of one file system, each subvolume with inode numbers of
// its own, and the kernel's overlay passes them on unchanged when every layer
// is on one file system: a file a sandbox makes can show the same device and
// inode number as a template file, or two template files can. Tools take
// such files for hard links of one (tar, rsync -H, cp -a), and gVisor's
// sentry serves one's contents for the other. So a template's layers are
// merged into one read-only erofs image, mounted once per node and shared by
// every sandbox of the template; with the lower layer on a file system of
// its own, the overlay's xino (mount option xino=on) makes every inode
// number distinct.
package lowers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/runtime/host"
)

// ErrNoErofs is New's error when mkfs.erofs is not installed.
var ErrNoErofs = errors.New("mkfs.erofs is not installed (erofs-utils)")

// Images builds and mounts the merged images of templates' layers under a
// directory of their own.
type Images struct {
	dir string
	log *slog.Logger
	mu  sync.Mutex
}

// New keeps images and their mounts in dir.
func New(dir string, log *slog.Logger) (*Images, error) {
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoErofs, err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	im := &Images{dir: dir, log: log}
	im.prune()
	return im, nil
}

// prune removes the images of layers that are gone (a template deleted or
// rebuilt), unmounting them lazily: a sandbox still running over one keeps
// it until it stops.
func (im *Images) prune() {
	lists, _ := filepath.Glob(filepath.Join(im.dir, "*.layers"))
	for _, l := range lists {
		b, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		gone := false
		for _, layer := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if _, err := os.Stat(layer); err != nil {
				gone = true
			}
		}
		if !gone {
			continue
		}
		base := strings.TrimSuffix(l, ".layers")
		_ = unix.Unmount(base, unix.MNT_DETACH)
		_ = os.Remove(base)
		_ = os.Remove(base + ".erofs")
		_ = os.Remove(l)
		im.log.Info("template image pruned", "image", base+".erofs")
	}
}

// Options are the overlay mount options that go with a lower layer Mount
// returned.
const Options = "xino=on"

// Mount returns the directory where the erofs image of layers (top first)
// is mounted, building and mounting it if no sandbox did before.
func (im *Images) Mount(ctx context.Context, layers []string) (string, error) {
	key, err := layersKey(layers)
	if err != nil {
		return "", err
	}
	dir := im.dir
	image := filepath.Join(dir, key+".erofs")
	mnt := filepath.Join(dir, key)
	im.mu.Lock()
	defer im.mu.Unlock()
	if mounted(mnt) {
		return mnt, nil
	}
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return "", err
	}
	if _, err := os.Stat(image); err != nil {
		if err := im.build(ctx, layers, image); err != nil {
			return "", err
		}
	}
	if out, err := exec.CommandContext(ctx, "mount", "-t", "erofs", "-o", "ro,loop,nodev,nosuid", image, mnt).CombinedOutput(); err != nil {
		return "", fmt.Errorf("mounting the template's image: %w: %s", err, host.LastLine(out))
	}
	return mnt, nil
}

// build writes the erofs image of layers, merged, to image.
func (im *Images) build(ctx context.Context, layers []string, image string) error {
	t0 := time.Now()
	src := layers[0]
	if len(layers) > 1 {
		// The layers' merged view, as the sandbox's overlay shows it, but
		// with whiteouts and opaque directories already applied.
		merged, err := os.MkdirTemp(filepath.Dir(image), "merge-")
		if err != nil {
			return err
		}
		defer os.Remove(merged)
		if err := unix.Mount("overlay", merged, "overlay", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID,
			"lowerdir="+strings.Join(layers, ":")+",userxattr"); err != nil {
			return fmt.Errorf("merging the template's layers: %w", err)
		}
		defer unix.Unmount(merged, unix.MNT_DETACH)
		src = merged
	}
	tmp := image + ".tmp"
	defer os.Remove(tmp)
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "mkfs.erofs", "--quiet", tmp, src)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building the template's image: %w: %s", err, host.LastLine(out.Bytes()))
	}
	if err := os.WriteFile(strings.TrimSuffix(image, ".erofs")+".layers", []byte(strings.Join(layers, "\n")+"\n"), 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, image); err != nil {
		return err
	}
	im.log.Info("template image built", "image", image, "layers", len(layers), "ms", time.Since(t0).Milliseconds())
	return nil
}

// layersKey names the image of layers: their paths and change times, which
// a rebuilt layer at the same path changes.
func layersKey(layers []string) (string, error) {
	if len(layers) == 0 {
		return "", errors.New("a sandbox with no template layers")
	}
	h := sha256.New()
	for _, l := range layers {
		var st unix.Stat_t
		if err := unix.Stat(l, &st); err != nil {
			return "", fmt.Errorf("template layer: %w", err)
		}
		fmt.Fprintf(h, "%s\x00%d.%d\x00", l, st.Ctim.Sec, st.Ctim.Nsec)
	}
	return hex.EncodeToString(h.Sum(nil))[:24], nil
}

// mounted reports whether dir is the root of a mount: on another device
// than its parent.
func mounted(dir string) bool {
	var st, parent unix.Stat_t
	if unix.Stat(dir, &st) != nil || unix.Stat(filepath.Dir(dir), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}
