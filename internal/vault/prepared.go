package vault

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// A clone unpacked into a sandbox (a mount that has no layer: layer.go)
// cost two git processes on the host: the index (read-tree) and the
// working tree's tar (archive), both the same for every mount of one
// commit. They are kept, per commit and owner, in the cache repository's
// atoll-mount/ directory (dropped with the cache, made again when
// missing).

// preparedDir is where a cache repository keeps its prepared mounts.
const preparedDir = "atoll-mount"

// preparedFiles are the paths of the index and the tree's tar of commit
// for owner uid:gid in the cache repository dir.
func preparedFiles(dir, commit string, uid, gid int) (index, tree string) {
	base := filepath.Join(dir, preparedDir, fmt.Sprintf("%s-%d-%d", commit, uid, gid))
	return base + ".index", base + ".tar"
}

// prepared returns the paths of the index and the tree's tar of commit
// in the cache repository dir of vault id, made if missing; one maker at
// a time for each.
func (s *Service) prepared(ctx context.Context, id, dir, commit string, uid, gid int) (string, string, error) {
	index, tree := preparedFiles(dir, commit, uid, gid)
	if _, err := os.Stat(tree); err == nil {
		return index, tree, nil
	}
	_, err, _ := s.preparing.Do(tree, func() (any, error) {
		if _, err := os.Stat(tree); err == nil {
			return nil, nil
		}
		if err := os.MkdirAll(filepath.Dir(tree), 0o700); err != nil {
			return nil, err
		}
		// Older commits' are of no more use: a mount is of the head.
		if old, _ := filepath.Glob(filepath.Join(dir, preparedDir, "*")); len(old) > 0 {
			for _, o := range old {
				if !strings.HasPrefix(filepath.Base(o), commit+"-") {
					os.Remove(o)
				}
			}
		}
		tmpIndex := index + ".tmp-" + newID()
		defer os.Remove(tmpIndex)
		// The index of the tree, without its files' stat data: git in
		// the sandbox hashes them once, finds them clean and refreshes it.
		if _, err := s.run(ctx, dir, []string{"GIT_INDEX_FILE=" + tmpIndex}, nil, "read-tree", commit); err != nil {
			return nil, err
		}
		if err := os.Rename(tmpIndex, index); err != nil {
			return nil, err
		}
		// The tree last, renamed into place whole: its presence says both
		// are there. Not fsynced: the cache is dropped after a reboot.
		f, err := os.CreateTemp(filepath.Dir(tree), ".tree-*")
		if err != nil {
			return nil, err
		}
		defer os.Remove(f.Name())
		tw := tar.NewWriter(f)
		err = s.tarTree(ctx, tw, dir, commit, uid, gid)
		if err == nil {
			err = tw.Close()
		}
		if err = errors.Join(err, f.Close()); err != nil {
			return nil, err
		}
		return nil, os.Rename(f.Name(), tree)
	})
	if err != nil {
		return "", "", fmt.Errorf("preparing the mount of %s: %w", commit, err)
	}
	return index, tree, nil
}
