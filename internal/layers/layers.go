// Package layers stores sandbox file systems: read-only template layers shared
// by every sandbox that uses them, and one writable layer per sandbox, a btrfs
// subvolume under a quota group limit. The store needs btrfs: the data directory
// itself when it is btrfs, otherwise a btrfs image in the data directory,
// loop-mounted by the server. (XFS project quotas would do too, but kernels
// without CONFIG_XFS_QUOTA, like these development hosts, lack them.)
package layers

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Config configures a Store.
type Config struct {
	// Dir is the directory the layers live in. If it is not on btrfs, Store
	// creates Dir.img and mounts it on Dir.
	Dir string
	// ImageSize is the size of the sparse image file; default 90% of the free
	// space of the filesystem holding Dir, at most 1 TiB.
	ImageSize int64
	// DirtyLimit bounds the bytes the layer filesystem holds written but not
	// yet on disk, for all sandboxes together (see writeback.go); default
	// DefaultDirtyLimit. Negative leaves the kernel's defaults, and a loop
	// device's buffered I/O, as they are.
	DirtyLimit int64
	Logger     *slog.Logger
}

// Store holds template and writable layers.
type Store struct {
	// MaxUnpackBytes caps the file bytes one image layer, and all the layers of
	// one import, unpack to; MaxUnpackEntries caps one layer's tar entries. Zero
	// means DefaultMaxUnpackBytes and DefaultMaxUnpackEntries. Set them before use.
	MaxUnpackBytes   int64
	MaxUnpackEntries int

	// tmplMu serialises preparing templates on first use.
	tmplMu sync.Mutex
	dir    string
	looped bool // Dir is a loop-mounted image that Open mounted
	log    *slog.Logger

	// spares are emptied writable layers kept for reuse (spares.go).
	spareMu  sync.Mutex
	spares   []string
	spareSeq uint64
}

// Open prepares the store's filesystem.
func Open(cfg Config) (*Store, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.Dir, 0o711); err != nil {
		return nil, err
	}
	s := &Store{dir: cfg.Dir, log: cfg.Logger}
	ok, err := isBtrfs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	if !ok {
		if err := mountImage(cfg); err != nil {
			return nil, err
		}
		s.looped = true
	}
	if err := enableQuota(cfg.Dir); err != nil {
		return nil, err
	}
	if cfg.DirtyLimit == 0 {
		cfg.DirtyLimit = DefaultDirtyLimit
	}
	if cfg.DirtyLimit > 0 {
		// Without the bound the store still works; snapshots of sandboxes
		// that wrote a lot just before take longer.
		if err := boundWriteback(cfg.Dir, cfg.DirtyLimit); err != nil {
			cfg.Logger.Warn("layer store: writeback not bounded; snapshots right after large writes will be slow", "err", err)
		}
	}
	for _, d := range []string{"sandboxes", "templates", "layers", "spares"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o700); err != nil {
			return nil, err
		}
	}
	if err := s.sweepLayerTemps(); err != nil {
		return nil, err
	}
	if err := s.sweepSpares(); err != nil {
		return nil, err
	}
	return s, nil
}

// Dir is the root of the store.
func (s *Store) Dir() string { return s.dir }

// mountImage formats (once) and loop-mounts Dir.img on Dir.
func mountImage(cfg Config) error {
	img := filepath.Clean(cfg.Dir) + ".img"
	if _, err := os.Stat(img); errors.Is(err, os.ErrNotExist) {
		size := cfg.ImageSize
		if size == 0 {
			var st unix.Statfs_t
			if err := unix.Statfs(filepath.Dir(img), &st); err != nil {
				return err
			}
			size = min(int64(st.Bavail)*st.Bsize/10*9, 1<<40)
		}
		size &^= 1<<20 - 1
		if size < 512<<20 {
			return fmt.Errorf("%w: layer image of %d bytes is too small", errdefs.ErrInvalid, size)
		}
		tmp := img + ".tmp"
		f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		err = f.Truncate(size)
		f.Close()
		if err != nil {
			return err
		}
		if out, err := exec.Command("mkfs.btrfs", "-q", tmp).CombinedOutput(); err != nil {
			return fmt.Errorf("mkfs.btrfs (install btrfs-progs): %v: %s", err, bytes.TrimSpace(out))
		}
		if err := os.Rename(tmp, img); err != nil {
			return err
		}
		cfg.Logger.Info("created layer image", "path", img, "bytes", size)
	}
	if out, err := exec.Command("mount", "-o", "loop,noatime", img, cfg.Dir).CombinedOutput(); err != nil {
		return fmt.Errorf("mounting layer image: %v: %s", err, bytes.TrimSpace(out))
	}
	if err := os.Chmod(cfg.Dir, 0o711); err != nil {
		return err
	}
	return nil
}

// Unmount unmounts a layer image that Open mounted. Only tests need this: a
// server leaves it mounted for the sandboxes that outlive it.
func (s *Store) Unmount() error {
	if !s.looped {
		return nil
	}
	return unix.Unmount(s.dir, unix.MNT_DETACH)
}

// WritableDir is sandbox id's writable layer: it holds upper/ and work/.
func (s *Store) WritableDir(id string) string { return filepath.Join(s.dir, "sandboxes", id) }

// CreateWritable makes the writable layer of sandbox id, capped at quota bytes
// (0: no cap), and returns its directory. Calling it again for a layer that
// exists only updates the cap.
func (s *Store) CreateWritable(id string, quota int64) (string, error) {
	dir := s.WritableDir(id)
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) || !s.takeSpare(dir) {
		if err := createSubvolume(dir); err != nil && !errors.Is(err, os.ErrExist) {
			return "", err
		}
	}
	for _, sub := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return "", err
		}
	}
	if err := limitSubvolume(dir, uint64(quota)); err != nil {
		return "", fmt.Errorf("setting disk quota: %w", err)
	}
	return dir, nil
}

// RemoveWritable deletes sandbox id's writable layer.
func (s *Store) RemoveWritable(id string) error {
	if err := deleteSubvolume(s.WritableDir(id)); err != nil {
		return fmt.Errorf("removing writable layer: %w", err)
	}
	return nil
}

// WritableExists reports whether sandbox id has a writable layer.
func (s *Store) WritableExists(id string) bool {
	_, err := os.Stat(filepath.Join(s.WritableDir(id), "upper"))
	return err == nil
}

// WritableIDs lists the sandboxes that have writable layers, for the start-up
// sweep of leftovers.
func (s *Store) WritableIDs() ([]string, error) {
	return dirNames(filepath.Join(s.dir, "sandboxes"))
}

// dirNames lists the names in directory dir.
func dirNames(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names, nil
}
