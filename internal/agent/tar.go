package agent

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

func (a *Agent) handleTarGet(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	if err != nil {
		writeError(w, err)
		return
	}
	fi, err := os.Lstat(p)
	if err != nil {
		writeError(w, fsError(err))
		return
	}
	w.Header().Set("Content-Type", "application/x-tar")
	tw := tar.NewWriter(w)
	if fi.IsDir() {
		err = filepath.WalkDir(p, func(fp string, d fs.DirEntry, err error) error {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while we walk
			}
			if err != nil {
				return err
			}
			if fp == p {
				return nil
			}
			rel, err := filepath.Rel(p, fp)
			if err != nil {
				return err
			}
			return addTarEntry(tw, fp, filepath.ToSlash(rel))
		})
	} else {
		err = addTarEntry(tw, p, fi.Name())
	}
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		// The status line is long gone: break the stream so the client sees
		// a truncated archive rather than a short valid one.
		a.log.Debug("tar download", "op", "tar", "err", err)
		panic(http.ErrAbortHandler)
	}
}

// addTarEntry writes one file as it is on disk; symlinks are stored, not followed.
func addTarEntry(tw *tar.Writer, fp, name string) error {
	fi, err := os.Lstat(fp)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var link string
	if fi.Mode()&os.ModeSymlink != 0 {
		if link, err = os.Readlink(fp); err != nil {
			return err
		}
	}
	if fi.Mode()&os.ModeSocket != 0 {
		return nil // tar has no sockets
	}
	hdr, err := tar.FileInfoHeader(fi, link)
	if err != nil {
		return err
	}
	hdr.Name = name
	if fi.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uname, hdr.Gname = "", "" // numeric ids only: names differ between images
	if !fi.Mode().IsRegular() {
		return tw.WriteHeader(hdr)
	}
	f, err := os.OpenFile(fp, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	_, err = io.CopyN(tw, f, hdr.Size)
	return err
}

func (a *Agent) handleTarPut(w http.ResponseWriter, r *http.Request) {
	err := func() error {
		p, err := queryPath(r)
		if err != nil {
			return err
		}
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return errorf(errdefs.ErrInvalid, "%s is not a directory", p)
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return fsError(err)
		}
		root, err := os.OpenRoot(p)
		if err != nil {
			return fsError(err)
		}
		defer root.Close()
		return a.extract(root, r.Body)
	}()
	respondEmpty(w, err)
}

// extract unpacks a tar stream under root. os.Root refuses any path that
// leaves it, through "..", absolute names or symlinks; the checks here only
// give the common attacks a clear message. Anything the archive asks that
// cannot be done is the client's fault: a 400, never a 500.
func (a *Agent) extract(root *os.Root, r io.Reader) error {
	type dirMeta struct {
		name  string
		mode  os.FileMode
		mtime time.Time
	}
	var (
		dirs  []dirMeta
		total int64
		tr    = tar.NewReader(r)
		// made are the directories known to be there: a file's parent
		// is made once, not once per file (a tar of a thousand small
		// files, a vault's clone, spends its time in such syscalls).
		made = map[string]bool{}
		// in is the directory files were last written in, opened: the
		// next of its files is made with one openat, not two.
		in = &subdir{}
	)
	defer in.close()
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return errorf(errdefs.ErrInvalid, "reading archive: %v", err)
		}
		if n >= a.maxTarFiles {
			return errorf(errdefs.ErrTooLarge, "archive has more than %d entries", a.maxTarFiles)
		}
		name, err := entryName(hdr.Name)
		if err != nil {
			return err
		}
		mode := hdr.FileInfo().Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)
		if err := extractEntry(root, tr, hdr, name, mode, &total, a.maxTarBytes, made, in); err != nil {
			return tarError(hdr.Name, err)
		}
		if hdr.Typeflag == tar.TypeDir && name != "." {
			dirs = append(dirs, dirMeta{name, mode, hdr.ModTime})
		}
	}
	// Directory modes last, so a read-only directory can still be filled;
	// deepest first, so setting times on a child does not touch its parent's.
	for _, d := range slices.Backward(dirs) {
		if err := root.Chmod(d.name, d.mode); err != nil {
			return tarError(d.name, err)
		}
		root.Chtimes(d.name, d.mtime, d.mtime)
	}
	return nil
}

func entryName(name string) (string, error) {
	switch {
	case name == "" || strings.ContainsRune(name, 0):
		return "", errorf(errdefs.ErrInvalid, "archive entry with bad name %q", name)
	case strings.HasPrefix(name, "/"):
		return "", errorf(errdefs.ErrInvalid, "archive entry %q has an absolute name", name)
	case !filepath.IsLocal(name):
		return "", errorf(errdefs.ErrInvalid, "archive entry %q escapes the target directory", name)
	}
	return filepath.Clean(name), nil
}

func extractEntry(root *os.Root, tr *tar.Reader, hdr *tar.Header, name string, mode os.FileMode, total *int64, maxBytes int64, made map[string]bool, in *subdir) error {
	if name == "." {
		if hdr.Typeflag == tar.TypeDir {
			return nil // the target directory itself
		}
		return errorf(errdefs.ErrInvalid, "archive entry %q is not a directory", hdr.Name)
	}
	if dir := filepath.Dir(name); dir != "." && !made[dir] {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		made[dir] = true
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := root.MkdirAll(name, 0o700); err != nil {
			return err
		}
		made[name] = true
		return root.Lchown(name, hdr.Uid, hdr.Gid)
	case tar.TypeReg:
		if hdr.Size < 0 || hdr.Size > maxBytes-*total {
			return errorf(errdefs.ErrTooLarge, "archive holds more than %d bytes", maxBytes)
		}
		*total += hdr.Size
		// O_EXCL: never open through a symlink planted at name. What is
		// there already is removed only then, as tar does.
		dir, err := in.open(root, filepath.Dir(name))
		if err != nil {
			return err
		}
		base := filepath.Base(name)
		f, err := dir.OpenFile(base, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			if err := clearPath(root, name); err != nil {
				return err
			}
			f, err = dir.OpenFile(base, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		}
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := io.CopyN(f, tr, hdr.Size); err != nil {
			return err
		}
		if err := f.Chown(hdr.Uid, hdr.Gid); err != nil {
			return err
		}
		if err := f.Chmod(mode); err != nil {
			return err
		}
		// The times through the open file: a path would be resolved in
		// root again.
		if err := futimes(f, hdr.ModTime); err != nil {
			return err
		}
		return f.Close()
	case tar.TypeSymlink:
		if hdr.Linkname == "" || strings.ContainsRune(hdr.Linkname, 0) {
			return errorf(errdefs.ErrInvalid, "bad symlink target")
		}
		if err := clearPath(root, name); err != nil {
			return err
		}
		if err := root.Symlink(hdr.Linkname, name); err != nil {
			return err
		}
		return root.Lchown(name, hdr.Uid, hdr.Gid)
	case tar.TypeLink:
		if strings.HasPrefix(hdr.Linkname, "/") || !filepath.IsLocal(hdr.Linkname) {
			return errorf(errdefs.ErrInvalid, "hard link to %q outside the target directory", hdr.Linkname)
		}
		if err := clearPath(root, name); err != nil {
			return err
		}
		return root.Link(filepath.Clean(hdr.Linkname), name)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return errorf(errdefs.ErrInvalid, "device nodes and fifos are not allowed")
	case tar.TypeXGlobalHeader:
		return nil
	}
	return errorf(errdefs.ErrInvalid, "unsupported entry type %q", hdr.Typeflag)
}

// clearPath removes what is at name unless it is a directory, as tar does before
// writing an entry.
func clearPath(root *os.Root, name string) error {
	fi, err := root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return errorf(errdefs.ErrConflict, "a directory is in the way")
	}
	return root.Remove(name)
}

// tarError names the entry and makes anything without a kind invalid: os.Root's
// "path escapes" errors included.
func tarError(name string, err error) error {
	err = fsError(err)
	var ke *kindError
	if errors.As(err, &ke) {
		return &kindError{kind: ke.kind, msg: fmt.Sprintf("archive entry %q: %s", name, ke.msg)}
	}
	return errorf(errdefs.ErrInvalid, "archive entry %q: %v", name, err)
}

// futimes sets f's access and modification times to t (futimens(3),
// which is utimensat(2) with a NULL path: x/sys/unix has no wrapper).
func futimes(f *os.File, t time.Time) error {
	if t.IsZero() {
		return nil // as os.Chtimes: a zero time leaves it as it is
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	ts := [2]unix.Timespec{unix.NsecToTimespec(t.UnixNano()), unix.NsecToTimespec(t.UnixNano())}
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall6(unix.SYS_UTIMENSAT, fd, 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	}); err != nil {
		return err
	}
	if errno != 0 {
		return &os.PathError{Op: "futimens", Path: f.Name(), Err: errno}
	}
	return nil
}

// subdir is a directory under an extraction's root, kept open.
type subdir struct {
	name string
	r    *os.Root
}

// open returns the directory name of root, opened as a root of its own
// (so that nothing in it leads out of it either), or root itself for ".".
func (d *subdir) open(root *os.Root, name string) (*os.Root, error) {
	if name == "." {
		return root, nil
	}
	if d.r != nil && d.name == name {
		return d.r, nil
	}
	d.close()
	r, err := root.OpenRoot(name)
	if err != nil {
		return nil, err
	}
	d.name, d.r = name, r
	return r, nil
}

func (d *subdir) close() {
	if d.r != nil {
		d.r.Close()
		d.r = nil
	}
}
