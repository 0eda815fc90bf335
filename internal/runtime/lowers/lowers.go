// Package lowers gives a sandbox's overlay root lower layers with inode
// numbers of their own.
//
// The layer store keeps each template layer and each writable layer in a
// btrfs subvolume of one file system, each subvolume with inode numbers of
// its own, and the kernel's overlay passes them on unchanged when every layer
// is on one file system: a file a sandbox makes can show the same device and
// inode number as a template file, or two template files can. Tools take
// such files for hard links of one (tar, rsync -H, cp -a), and gVisor's
// sentry serves one's contents for the other. So each template layer becomes
// a read-only erofs image, built when its template is made (or on its first
// use, whichever comes first), mounted once per node and shared by every
// sandbox and template over it (a Dockerfile build's steps share all but
// their newest layer); with every lower layer on a file system of its own,
// the overlay's xino (mount option xino=on) makes every inode number
// distinct.
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

	"golang.org/x/sync/singleflight"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/runtime/host"
)

// ErrNoErofs is New's error when mkfs.erofs is not installed.
var ErrNoErofs = errors.New("mkfs.erofs is not installed (erofs-utils)")

// Images builds and mounts the images of templates' layers under a
// directory of their own.
type Images struct {
	dir string
	log *slog.Logger
	// layer makes one layer's image ready at a time, by key: a start over
	// layers already mounted, or a build of another layer, does not wait
	// for a build.
	layer singleflight.Group
	// pruneMu keeps one prune at a time.
	pruneMu sync.Mutex
}

// New keeps images and their mounts in dir.
func New(dir string, log *slog.Logger) (*Images, error) {
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoErofs, err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// Its own private mount: the images' mounts propagate nowhere, and a
	// lazy unmount of dir takes them all.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := host.PrivateMount(dir); err != nil {
		return nil, err
	}
	im := &Images{dir: dir, log: log}
	// Images a build of an earlier run left half written (killed): no
	// build of this run is under way yet.
	tmps, _ := filepath.Glob(filepath.Join(dir, "*"+tmpSuffix))
	for _, t := range tmps {
		_ = os.Remove(t)
	}
	im.prune()
	return im, nil
}

// Discard unmounts and removes the images that New kept in dir, for a node
// that keeps them elsewhere now.
func Discard(dir string) error {
	for _, m := range host.MountsUnder(dir) { // deepest first
		_ = unix.Unmount(m, unix.MNT_DETACH)
	}
	return os.RemoveAll(dir)
}

// prune removes the images of layers that are gone or rebuilt (a template
// deleted or built again), unmounting them lazily: a sandbox still running
// over one keeps it until it stops.
func (im *Images) prune() {
	im.pruneMu.Lock()
	defer im.pruneMu.Unlock()
	srcs, _ := filepath.Glob(filepath.Join(im.dir, "*.src"))
	for _, sf := range srcs {
		b, err := os.ReadFile(sf)
		if err != nil {
			continue
		}
		base := strings.TrimSuffix(sf, ".src")
		if key, err := layerKey(strings.TrimSpace(string(b))); err == nil && key == filepath.Base(base) {
			continue
		}
		removeImage(base, sf)
		im.log.Info("layer image pruned", "image", base+".erofs")
	}
	// Images of whole templates, which an earlier version built.
	old, _ := filepath.Glob(filepath.Join(im.dir, "*.layers"))
	for _, l := range old {
		removeImage(strings.TrimSuffix(l, ".layers"), l)
	}
}

// Prune removes the images of layers that are gone, as New does: a node
// calls it after it deletes layers.
func (im *Images) Prune() { im.prune() }

// removeImage unmounts (lazily) and removes the image at base, with the
// file that names its source.
func removeImage(base, source string) {
	_ = unix.Unmount(base, unix.MNT_DETACH)
	_ = os.Remove(base)
	_ = os.Remove(base + ".erofs")
	_ = os.Remove(source)
}

// Mount returns the directories where the erofs images of layers (top
// first) are mounted, in the same order, building and mounting those no
// sandbox used before. An overlay over them needs xino on (package overlay's
// Options.Xino) for the inode numbers to be distinct.
func (im *Images) Mount(ctx context.Context, layers []string) ([]string, error) {
	if len(layers) == 0 {
		return nil, errors.New("a sandbox with no template layers")
	}
	dirs := make([]string, len(layers))
	for i, l := range layers {
		d, err := im.mountLayer(ctx, l)
		if err != nil {
			return nil, err
		}
		dirs[i] = d
	}
	return dirs, nil
}

// mountLayer returns where the image of layer is mounted.
func (im *Images) mountLayer(ctx context.Context, layer string) (string, error) {
	key, err := layerKey(layer)
	if err != nil {
		return "", err
	}
	mnt := filepath.Join(im.dir, key)
	if mounted(mnt) {
		return mnt, nil
	}
	// One caller builds and mounts; the others wait for it. The build goes
	// on if the caller that began it gives up: it is of use to the rest.
	ch := im.layer.DoChan(key, func() (any, error) {
		if mounted(mnt) {
			return nil, nil
		}
		return nil, im.buildAndMount(context.WithoutCancel(ctx), layer, key)
	})
	select {
	case res := <-ch:
		return mnt, res.Err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// buildAndMount mounts the image of layer at its key's directory, building
// the image first if there is none.
func (im *Images) buildAndMount(ctx context.Context, layer, key string) error {
	image := filepath.Join(im.dir, key+".erofs")
	mnt := filepath.Join(im.dir, key)
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return err
	}
	if _, err := os.Stat(image); err != nil {
		if err := im.build(ctx, layer, image); err != nil {
			return err
		}
		im.prune()
	}
	if err := host.MountErofs(ctx, image, mnt); err != nil {
		return fmt.Errorf("the image of template layer %s: %w", layer, err)
	}
	return nil
}

// build writes the erofs image of layer to image. mkfs.erofs keeps owners,
// times, extended attributes and the layer store's whiteouts (0/0 character
// devices, user.overlay.* attributes), which the overlay applies as before.
func (im *Images) build(ctx context.Context, layer, image string) error {
	t0 := time.Now()
	tmp := image + tmpSuffix
	defer os.Remove(tmp)
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "mkfs.erofs", "--quiet", tmp, layer)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building the image of template layer %s: %w: %s", layer, err, host.LastLine(out.Bytes()))
	}
	if err := os.WriteFile(strings.TrimSuffix(image, ".erofs")+".src", []byte(layer+"\n"), 0o600); err != nil {
		return err
	}
	// On disk before it is named: an image renamed into place and lost
	// to a power cut would keep its key, empty, and fail every mount.
	if err := syncFile(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, image); err != nil {
		return err
	}
	if err := syncFile(im.dir); err != nil {
		return err
	}
	im.log.Info("layer image built", "image", image, "layer", layer, "ms", time.Since(t0).Milliseconds())
	return nil
}

// tmpSuffix ends the name of an image being built.
const tmpSuffix = ".tmp"

// syncFile flushes the file or directory p to disk.
func syncFile(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	return errors.Join(f.Sync(), f.Close())
}

// layerKey names the image of layer: its path and change time, which a
// layer rebuilt at the same path changes.
func layerKey(layer string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(layer, &st); err != nil {
		return "", fmt.Errorf("template layer: %w", err)
	}
	h := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d.%d", layer, st.Ctim.Sec, st.Ctim.Nsec))
	return hex.EncodeToString(h[:])[:24], nil
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
