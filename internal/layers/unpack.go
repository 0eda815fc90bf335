package layers

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Image layers are unpacked once each into <Dir>/layers/<id>, where id is the
// hex sha256 of the uncompressed layer tar (its OCI diffID), and shared read-only
// by every template that has them. Sandboxes mount them as overlay lower layers
// in "userxattr" mode inside a user namespace, through id-mapped bind mounts, so
// files keep the uid/gid the image gives them, and OCI whiteouts are turned into
// overlay ones as they are unpacked:
//
//   - ".wh.NAME" becomes a character device 0/0 named NAME;
//   - ".wh..wh..opq" in a directory sets user.overlay.opaque=y on it (and
//     trusted.overlay.opaque=y, which an overlay mounted without userxattr reads).
//
// A layer tar is hostile input. Every path operation goes through an os.Root on
// the layer's temporary directory, or through a directory descriptor opened by
// it; names must be relative and stay inside the layer (absolute names are
// refused rather than re-rooted: OCI layers use relative names, and a tar that
// doesn't is more likely crafted than careless); an entry replaces what the layer
// already has at its name and is never written through a symlink; the parents
// of an entry must be real directories; hard links must point at a file already
// in the layer; devices and fifos are refused; and a layer is capped in bytes
// and entries. A layer is renamed into place only once it is complete and its
// digest checked, so no half-made layer is ever visible.

// Default limits on one unpacked layer, and on all the layers of an import.
const (
	DefaultMaxUnpackBytes   = 64 << 30
	DefaultMaxUnpackEntries = 2 << 20
)

const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
	tmpPrefix      = ".tmp-"
	// maxTrailer bounds what may follow the end-of-archive marker of a layer
	// tar (zero padding up to the record size, in practice).
	maxTrailer = 1 << 20
)

func (s *Store) layersDir() string { return filepath.Join(s.dir, "layers") }

// LayerDir is the directory of image layer id.
func (s *Store) LayerDir(id string) string { return filepath.Join(s.layersDir(), id) }

// HasLayer reports whether image layer id is unpacked.
func (s *Store) HasLayer(id string) bool {
	if !validLayerID(id) {
		return false
	}
	fi, err := os.Lstat(s.LayerDir(id))
	return err == nil && fi.IsDir()
}

// LayerSize is the bytes of the regular files of image layer id, as an
// imported layer's size is counted.
func (s *Store) LayerSize(id string) (int64, error) {
	if !s.HasLayer(id) {
		return 0, fmt.Errorf("%w: layer %s", errdefs.ErrNotFound, shortID(id))
	}
	return treeSize(s.LayerDir(id))
}

// LayerIDs lists the unpacked image layers.
func (s *Store) LayerIDs() ([]string, error) {
	ents, err := os.ReadDir(s.layersDir())
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() && validLayerID(e.Name()) {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// RemoveLayer deletes image layer id. The caller knows which templates refer to
// it; the layer disappears from view at once, before its files are deleted.
func (s *Store) RemoveLayer(id string) error {
	if !validLayerID(id) {
		return fmt.Errorf("%w: layer id %q", errdefs.ErrInvalid, id)
	}
	tmp, err := os.MkdirTemp(s.layersDir(), tmpPrefix+"rm-")
	if err != nil {
		return err
	}
	gone := filepath.Join(tmp, id)
	if err := os.Rename(s.LayerDir(id), gone); err != nil {
		os.Remove(tmp)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("removing layer %s: %w", id, err)
	}
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("removing layer %s: %w", id, err)
	}
	return nil
}

// sweepLayerTemps removes the temporary directories of unpacks and removals a
// previous process did not finish.
func (s *Store) sweepLayerTemps() error {
	ents, err := os.ReadDir(s.layersDir())
	if err != nil {
		return err
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			if err := os.RemoveAll(filepath.Join(s.layersDir(), e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

func validLayerID(id string) bool {
	if len(id) != 2*sha256.Size {
		return false
	}
	for _, c := range id {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func (s *Store) limits() (bytes int64, entries int) {
	bytes, entries = s.MaxUnpackBytes, s.MaxUnpackEntries
	if bytes <= 0 {
		bytes = DefaultMaxUnpackBytes
	}
	if entries <= 0 {
		entries = DefaultMaxUnpackEntries
	}
	return bytes, entries
}

// AddLayer unpacks the uncompressed layer tar r as layer diffID (hex sha256 of
// the tar, with or without a "sha256:" prefix) and returns its unpacked size in
// bytes. The tar's digest must match diffID. Adding a layer the store has is a
// no-op (r is not read); concurrent adds of one layer each unpack into their own
// temporary directory and the first to finish wins.
func (s *Store) AddLayer(ctx context.Context, diffID string, r io.Reader) (int64, error) {
	maxBytes, maxEntries := s.limits()
	_, size, err := s.addLayer(ctx, strings.TrimPrefix(diffID, "sha256:"), r, maxBytes, maxEntries)
	return size, err
}

// AddLayerDigest is AddLayer for a tar whose digest the caller doesn't know: it
// returns the layer id it computed.
func (s *Store) AddLayerDigest(ctx context.Context, r io.Reader) (id string, size int64, err error) {
	maxBytes, maxEntries := s.limits()
	return s.addLayer(ctx, "", r, maxBytes, maxEntries)
}

func (s *Store) addLayer(ctx context.Context, want string, r io.Reader, maxBytes int64, maxEntries int) (string, int64, error) {
	if want != "" && !validLayerID(want) {
		return "", 0, fmt.Errorf("%w: layer id %q", errdefs.ErrInvalid, want)
	}
	if want != "" && s.HasLayer(want) {
		size, err := treeSize(s.LayerDir(want))
		return want, size, err
	}
	tmp, err := os.MkdirTemp(s.layersDir(), tmpPrefix+"add-")
	if err != nil {
		return "", 0, err
	}
	done := false
	defer func() {
		if !done {
			os.RemoveAll(tmp)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", 0, err
	}
	h := sha256.New()
	u := &unpacker{ctx: ctx, maxBytes: maxBytes, maxEntries: maxEntries}
	if err := u.unpack(tmp, r, h); err != nil {
		return "", 0, fmt.Errorf("unpacking layer %s: %w", shortID(want), err)
	}
	id := hex.EncodeToString(h.Sum(nil))
	if want != "" && id != want {
		return "", 0, fmt.Errorf("%w: layer %s: content has digest sha256:%s", errdefs.ErrInvalid, shortID(want), id)
	}
	if err := syncFS(tmp); err != nil {
		return "", 0, err
	}
	size, err := treeSize(tmp)
	if err != nil {
		return "", 0, err
	}
	if err := os.Rename(tmp, s.LayerDir(id)); err != nil {
		if !s.HasLayer(id) { // not a lost race with another add of the same layer
			return "", 0, fmt.Errorf("adding layer %s: %w", shortID(id), err)
		}
		return id, size, nil
	}
	done = true
	return id, size, nil
}

// syncFS flushes the filesystem holding dir, before a layer unpacked in dir is
// renamed into place: one syncfs instead of an fsync per file.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// treeSize is the bytes of the regular files under dir, each inode once.
func treeSize(dir string) (int64, error) {
	var size int64
	seen := map[uint64]bool{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		size += fi.Size()
		return nil
	})
	return size, err
}

// unpacker unpacks one layer tar.
type unpacker struct {
	ctx        context.Context
	maxBytes   int64
	maxEntries int

	root    *os.Root
	bytes   int64
	entries int
	dirs    []dirTime // directory times, set last: unpacking children changes them
}

type dirTime struct {
	name         string
	atime, mtime time.Time
}

// unpack unpacks the tar r into the empty directory dir, hashing all of r into h.
func (u *unpacker) unpack(dir string, r io.Reader, h hash.Hash) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	u.root = root
	tr := tar.NewReader(io.TeeReader(r, h))
	for {
		if err := u.ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: reading tar: %v", errdefs.ErrInvalid, err)
		}
		u.entries++
		if u.entries > u.maxEntries {
			return fmt.Errorf("%w: layer has more than %d entries", errdefs.ErrTooLarge, u.maxEntries)
		}
		if err := u.entry(hdr, tr); err != nil {
			return err
		}
	}
	// Hash what follows the end-of-archive marker too: the digest is of the
	// whole stream.
	n, err := io.Copy(io.Discard, io.LimitReader(io.TeeReader(r, h), maxTrailer+1))
	if err != nil {
		return fmt.Errorf("%w: reading tar: %v", errdefs.ErrInvalid, err)
	}
	if n > maxTrailer {
		return fmt.Errorf("%w: data after the end of the tar", errdefs.ErrInvalid)
	}
	for i := len(u.dirs) - 1; i >= 0; i-- {
		d := u.dirs[i]
		if fi, err := root.Lstat(d.name); err != nil || !fi.IsDir() {
			continue // replaced by a later entry
		}
		if err := root.Chtimes(d.name, d.atime, d.mtime); err != nil {
			return err
		}
	}
	return nil
}

// entryName checks and cleans a tar entry name.
func entryName(name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("%w: tar entry with no name", errdefs.ErrInvalid)
	}
	if strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("%w: tar entry name %q has a NUL byte", errdefs.ErrInvalid, name)
	}
	if path.IsAbs(name) {
		return "", fmt.Errorf("%w: tar entry name %q is absolute", errdefs.ErrInvalid, name)
	}
	clean := path.Clean(name)
	if !filepath.IsLocal(clean) {
		return "", fmt.Errorf("%w: tar entry name %q leaves the layer", errdefs.ErrInvalid, name)
	}
	return clean, nil
}

func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	name, err := entryName(hdr.Name)
	if err != nil {
		return err
	}
	dir, base := path.Split(name)
	dir = path.Clean(dir) // "" → "."
	switch {
	case base == whiteoutOpaque:
		return u.opaque(dir)
	case strings.HasPrefix(base, whiteoutMeta):
		return nil // aufs bookkeeping (.wh..wh.plnk and the like)
	case strings.HasPrefix(base, whiteoutPrefix):
		target := strings.TrimPrefix(base, whiteoutPrefix)
		if target == "" || target == "." || target == ".." {
			return fmt.Errorf("%w: bad whiteout %q", errdefs.ErrInvalid, hdr.Name)
		}
		return u.whiteout(dir, target)
	}
	if name == "." {
		if hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("%w: tar entry %q for the layer root is not a directory", errdefs.ErrInvalid, hdr.Name)
		}
		return u.meta(hdr, name, nil)
	}
	if err := u.parents(dir); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	existing, err := u.root.Lstat(name)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if existing != nil && !(existing.IsDir() && hdr.Typeflag == tar.TypeDir) {
		if err := u.root.RemoveAll(name); err != nil {
			return err
		}
		existing = nil
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if existing == nil {
			if err := u.root.Mkdir(name, 0o700); err != nil {
				return err
			}
		}
		return u.meta(hdr, name, nil)
	case tar.TypeReg, tar.TypeGNUSparse: // the reader fills sparse files' holes in
		return u.file(hdr, name, r)
	case tar.TypeSymlink:
		if hdr.Linkname == "" || strings.ContainsRune(hdr.Linkname, 0) {
			return fmt.Errorf("%w: symlink %q has a bad target", errdefs.ErrInvalid, hdr.Name)
		}
		// The target is not checked: it is resolved inside the sandbox.
		if err := u.root.Symlink(hdr.Linkname, name); err != nil {
			return err
		}
		return u.meta(hdr, name, nil)
	case tar.TypeLink:
		return u.link(hdr, name)
	case tar.TypeXGlobalHeader:
		return nil
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return fmt.Errorf("%w: tar entry %q is a device or fifo", errdefs.ErrInvalid, hdr.Name)
	default:
		return fmt.Errorf("%w: tar entry %q has unsupported type %q", errdefs.ErrInvalid, hdr.Name, hdr.Typeflag)
	}
}

// parents makes sure every directory on the way to dir is a real directory,
// creating missing ones as image tools do (0755, root).
func (u *unpacker) parents(dir string) error {
	if dir == "." {
		return nil
	}
	p := ""
	for _, c := range strings.Split(dir, "/") {
		p = path.Join(p, c)
		fi, err := u.root.Lstat(p)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := u.root.Mkdir(p, 0o755); err != nil {
				return err
			}
		case err != nil:
			return err
		case !fi.IsDir():
			return fmt.Errorf("%w: parent %q is not a directory", errdefs.ErrInvalid, p)
		}
	}
	return nil
}

func (u *unpacker) file(hdr *tar.Header, name string, r io.Reader) error {
	if hdr.Size < 0 || hdr.Size > u.maxBytes-u.bytes {
		return fmt.Errorf("%w: layer unpacks to more than %d bytes", errdefs.ErrTooLarge, u.maxBytes)
	}
	u.bytes += hdr.Size
	f, err := u.root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(f, &ctxReader{u.ctx, r})
	if err != nil {
		if u.ctx.Err() != nil {
			return u.ctx.Err()
		}
		return fmt.Errorf("%w: reading %s: %v", errdefs.ErrInvalid, name, err)
	}
	if n != hdr.Size {
		return fmt.Errorf("%w: %s: short file", errdefs.ErrInvalid, name)
	}
	if err := u.meta(hdr, name, f); err != nil {
		return err
	}
	return f.Close()
}

func (u *unpacker) link(hdr *tar.Header, name string) error {
	target, err := entryName(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link %q: %w", hdr.Name, err)
	}
	fi, err := u.root.Lstat(target)
	if err != nil {
		return fmt.Errorf("%w: hard link %q: target %q is not in the layer", errdefs.ErrInvalid, hdr.Name, hdr.Linkname)
	}
	if !fi.Mode().IsRegular() && fi.Mode()&os.ModeSymlink == 0 {
		return fmt.Errorf("%w: hard link %q: target %q is not a file", errdefs.ErrInvalid, hdr.Name, hdr.Linkname)
	}
	if target == name {
		return fmt.Errorf("%w: hard link %q to itself", errdefs.ErrInvalid, hdr.Name)
	}
	// A link shares its target's inode, owner, mode and times: nothing to set.
	return u.root.Link(target, name)
}

// meta sets the owner, mode, extended attributes and times of the entry at name,
// which this unpack created; f is it, open, if the caller has it.
func (u *unpacker) meta(hdr *tar.Header, name string, f *os.File) error {
	isLink := hdr.Typeflag == tar.TypeSymlink
	if err := u.root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("chown %s: %w", name, err)
	}
	if !isLink {
		if f == nil {
			var err error
			if f, err = u.root.Open(name); err != nil {
				return err
			}
			defer f.Close()
		}
		// After chown, which clears set-id bits.
		if err := f.Chmod(tarMode(hdr.Mode)); err != nil {
			return err
		}
		for k, v := range hdr.PAXRecords {
			attr, ok := strings.CutPrefix(k, "SCHILY.xattr.")
			if !ok || !keepXattr(attr) {
				continue
			}
			if err := unix.Fsetxattr(int(f.Fd()), attr, []byte(v), 0); err != nil {
				return fmt.Errorf("setting %s on %s: %w", attr, name, err)
			}
		}
	}
	atime := hdr.AccessTime
	if atime.IsZero() {
		atime = hdr.ModTime
	}
	if hdr.Typeflag == tar.TypeDir {
		u.dirs = append(u.dirs, dirTime{name, atime, hdr.ModTime})
		return nil
	}
	return u.atParent(name, func(fd int, base string) error {
		ts := []unix.Timespec{unix.NsecToTimespec(atime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
		return unix.UtimesNanoAt(fd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
	})
}

// tarMode turns a tar header mode into an os.FileMode, keeping the set-id and
// sticky bits.
func tarMode(m int64) os.FileMode {
	mode := os.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		mode |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		mode |= os.ModeSetgid
	}
	if m&0o1000 != 0 {
		mode |= os.ModeSticky
	}
	return mode
}

// keepXattr reports whether an extended attribute from a layer is applied:
// user attributes, except overlay's own (which would let a layer redirect or
// fake whiteouts), and file capabilities. Others (trusted.*, security labels
// of the build host) are dropped.
func keepXattr(name string) bool {
	switch {
	case strings.HasPrefix(name, "user.overlay."):
		return false
	case strings.HasPrefix(name, "user."), name == "security.capability":
		return true
	}
	return false
}

// atParent calls fn with a descriptor of name's parent directory, opened
// through the root, and name's last element.
func (u *unpacker) atParent(name string, fn func(fd int, base string) error) error {
	dir, base := path.Split(name)
	d, err := u.root.Open(path.Clean(dir))
	if err != nil {
		return err
	}
	defer d.Close()
	if err := fn(int(d.Fd()), base); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// whiteout hides dir/target of the layers below: an overlay whiteout is a
// character device 0/0.
func (u *unpacker) whiteout(dir, target string) error {
	if err := u.parents(dir); err != nil {
		return err
	}
	name := path.Join(dir, target)
	if err := u.root.RemoveAll(name); err != nil {
		return err
	}
	return u.atParent(name, func(fd int, base string) error {
		return unix.Mknodat(fd, base, unix.S_IFCHR, 0)
	})
}

// opaque makes dir hide the content the layers below have in it.
func (u *unpacker) opaque(dir string) error {
	if dir != "." {
		if err := u.parents(dir); err != nil {
			return err
		}
	}
	d, err := u.root.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	for _, attr := range []string{"user.overlay.opaque", "trusted.overlay.opaque"} {
		if err := unix.Fsetxattr(int(d.Fd()), attr, []byte("y"), 0); err != nil {
			return fmt.Errorf("making %s opaque: %w", dir, err)
		}
	}
	return nil
}

// ctxReader stops a long copy when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
