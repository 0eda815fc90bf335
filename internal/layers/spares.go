package layers

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Writable layers are recycled. Deleting a subvolume costs btrfs a
// transaction commit when its cleaner drops it (to settle the quota
// groups), on top of the subvolume ioctls, and sandboxes that come and go
// in bulk wrote next to nothing: a fresh writable layer is an empty
// subvolume with an empty upper/ and work/. So RemoveWritable empties a
// layer that holds little and keeps it, as a spare, for the next
// CreateWritable; a layer holding more is deleted as before, since
// removing many files one by one costs more than dropping the subvolume.
// A spare is empty by construction: it is only named a spare after
// everything in it was removed, so nothing of one sandbox reaches the next.
// Spares left by a previous run are deleted at Open.

const (
	// maxSpares bounds the empty subvolumes kept: about what a burst of
	// deletes frees before the creates behind it take them.
	maxSpares = 64
	// A layer is recycled when it holds at most recycleEntries files and
	// directories and recycleBytes bytes of regular files; otherwise it is
	// dropped whole. Its quota group still counts what was removed until
	// btrfs's next commit, so the bound also keeps that lag small.
	recycleEntries = 256
	recycleBytes   = 4 << 20
)

func (s *Store) sparesDir() string { return filepath.Join(s.dir, "spares") }

// sweepSpares deletes the spares of a previous run.
func (s *Store) sweepSpares() error {
	names, err := dirNames(s.sparesDir())
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := deleteSubvolume(filepath.Join(s.sparesDir(), n)); err != nil {
			return err
		}
	}
	return nil
}

// takeSpare moves a spare to dir and reports whether there was one.
func (s *Store) takeSpare(dir string) bool {
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	for len(s.spares) > 0 {
		sp := s.spares[len(s.spares)-1]
		s.spares = s.spares[:len(s.spares)-1]
		if err := os.Rename(sp, dir); err == nil {
			return true
		} else if errors.Is(err, os.ErrExist) || errors.Is(err, unix.ENOTEMPTY) {
			// dir appeared meanwhile: keep the spare for another.
			s.spares = append(s.spares, sp)
			return false
		}
		s.log.Warn("layer store: spare writable layer lost", "path", sp)
	}
	return false
}

// RecycleWritable removes sandbox id's writable layer like RemoveWritable,
// keeping it emptied as a spare when it is small. Only a layer nothing uses
// any more may be recycled: the caller has seen every process of the
// sandbox end (runtime.Runtime.Stop), so nothing can write into the spare
// after it was emptied.
func (s *Store) RecycleWritable(id string) error {
	if s.recycle(s.WritableDir(id)) {
		return nil
	}
	return s.RemoveWritable(id)
}

// recycle empties the writable layer at dir and keeps it as a spare, if it
// is small enough; it reports whether it did. On false dir is still there,
// maybe partly emptied, for the caller to delete.
func (s *Store) recycle(dir string) bool {
	s.spareMu.Lock()
	full := len(s.spares) >= maxSpares
	s.spareSeq++
	sp := filepath.Join(s.sparesDir(), strconv.FormatUint(s.spareSeq, 10))
	s.spareMu.Unlock()
	if full || !isSubvolumeRoot(dir) || !small(dir) {
		return false
	}
	if err := emptyDir(dir); err != nil {
		s.log.Warn("layer store: emptying a writable layer", "path", dir, "err", err)
		return false
	}
	if err := os.Rename(dir, sp); err != nil {
		return false
	}
	s.spareMu.Lock()
	s.spares = append(s.spares, sp)
	s.spareMu.Unlock()
	return true
}

// isSubvolumeRoot reports whether dir is the root of a btrfs subvolume (its
// inode number is always 256).
func isSubvolumeRoot(dir string) bool {
	var st unix.Stat_t
	return unix.Lstat(dir, &st) == nil && st.Ino == 256 && st.Mode&unix.S_IFMT == unix.S_IFDIR
}

// errTooBig ends the walk of a layer too big to recycle.
var errTooBig = errors.New("too big to recycle")

// small reports whether the tree under dir is within the recycling bounds,
// without reading past them.
func small(dir string) bool {
	entries, bytes := 0, int64(0)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == dir {
			return nil
		}
		if entries++; entries > recycleEntries {
			return errTooBig
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			if bytes += info.Size(); bytes > recycleBytes {
				return errTooBig
			}
		}
		return nil
	})
	return err == nil
}

// emptyDir removes everything in dir and checks that nothing is left.
func emptyDir(dir string) error {
	names, err := dirNames(dir)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
			return err
		}
	}
	if left, err := dirNames(dir); err != nil || len(left) > 0 {
		return fmt.Errorf("%d entries left: %v", len(left), err)
	}
	return nil
}
