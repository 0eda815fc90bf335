package layers

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// NewLayerDir makes an empty directory on the store's filesystem to build a
// layer in; CommitLayer turns it into a layer. Uncommitted ones are swept at
// the next Open.
func (s *Store) NewLayerDir() (string, error) {
	return os.MkdirTemp(s.layersDir(), tmpPrefix+"build-")
}

// CommitLayer makes dir, from NewLayerDir, the layer id. If the layer exists
// already (a concurrent build made it), dir is dropped.
func (s *Store) CommitLayer(id, dir string) error {
	if !validLayerID(id) {
		return fmt.Errorf("%w: layer id %q", errdefs.ErrInvalid, id)
	}
	if err := syncfs(dir); err != nil {
		return err
	}
	if err := os.Rename(dir, s.LayerDir(id)); err != nil {
		if s.HasLayer(id) {
			return os.RemoveAll(dir)
		}
		return fmt.Errorf("committing layer %s: %w", id, err)
	}
	return nil
}

// CloneTree copies the tree src into the existing directory dst sharing data
// blocks (btrfs reflinks, so the cost does not grow with file sizes), keeping
// owners, modes, times, extended attributes and device nodes: overlay
// whiteouts and opaque markers survive. This is how a build step's writable
// layer becomes a layer.
func CloneTree(src, dst string) error {
	out, err := exec.Command("cp", "-a", "--reflink=auto", src+"/.", dst+"/").CombinedOutput()
	if err != nil {
		return fmt.Errorf("copying %s: %v: %s", filepath.Base(src), err, bytes.TrimSpace(out))
	}
	return nil
}

// HostTemplateWith is the host template with layers (bottom first) stacked on
// its own layer: a template built FROM host.
func (s *Store) HostTemplateWith(layerIDs []string) (Template, error) {
	t, err := s.Template(HostTemplate)
	if err != nil {
		return t, err
	}
	var upper []string
	for i := len(layerIDs) - 1; i >= 0; i-- {
		if !s.HasLayer(layerIDs[i]) {
			return Template{}, fmt.Errorf("%w: layer %s is missing", errdefs.ErrNotFound, layerIDs[i])
		}
		upper = append(upper, s.LayerDir(layerIDs[i]))
	}
	t.Layers = append(upper, t.Layers...)
	return t, nil
}

func syncfs(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil && !errors.Is(err, unix.ENOSYS) {
		return err
	}
	return nil
}
