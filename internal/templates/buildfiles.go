package templates

import (
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/internal/atomicfile"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Build files are what E2B's template builds upload before a build: one tar
// (plain or gzip) of the files of each COPY step, addressed by a hash the
// client computes over them, so that a client asks first whether the server
// has them and uploads only what changed. Each is unpacked as a layer, as a
// build context is (no escapes, no devices, the store's size limits), and
// pinned there by a small file naming the layer under the hash: the layer
// collector keeps pinned layers. A pin not used for buildFilesTTL goes with
// the next collection; the client then uploads the files again.
const buildFilesTTL = 24 * time.Hour

func (s *Service) buildFilesDir() string { return filepath.Join(s.layers.Dir(), "build-files") }

// validFilesHash accepts E2B's hashes (hex SHA-256) and nothing that could
// name a path.
func validFilesHash(h string) bool {
	if len(h) < 16 || len(h) > 128 {
		return false
	}
	return strings.Trim(h, "0123456789abcdefABCDEF") == ""
}

// addBuildFiles unpacks the tar r (gzip-compressed or not) and pins it as
// the build files hash. Uploading files the server has replaces them.
func (s *Service) addBuildFiles(ctx context.Context, hash string, r io.Reader) error {
	if !validFilesHash(hash) {
		return fmt.Errorf("%w: malformed files hash", errdefs.ErrInvalid)
	}
	// Held as an import is, so that no collection removes the layer between
	// its unpacking and its pin.
	defer s.beginImport(ctx)()
	br := bufio.NewReader(r)
	var tr io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("%w: reading gzip: %v", errdefs.ErrInvalid, err)
		}
		defer zr.Close()
		tr = zr
	}
	id, _, err := s.layers.AddLayerDigest(ctx, tr)
	if err != nil {
		return fmt.Errorf("unpacking the files: %w", err)
	}
	if err := os.MkdirAll(s.buildFilesDir(), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(s.buildFilesDir(), hash), []byte(id), 0o600)
}

// buildFilesLayer is the layer pinned as hash, if any.
func (s *Service) buildFilesLayer(hash string) (string, bool) {
	if !validFilesHash(hash) {
		return "", false
	}
	b, err := os.ReadFile(filepath.Join(s.buildFilesDir(), hash))
	id := strings.TrimSpace(string(b))
	if err != nil || !s.layers.HasLayer(id) {
		return "", false
	}
	return id, true
}

// hasBuildFiles reports whether the build files hash are here, and keeps
// them another buildFilesTTL if so: a build will use them.
func (s *Service) hasBuildFiles(hash string) bool {
	_, ok := s.buildFilesLayer(hash)
	if ok {
		now := time.Now()
		_ = os.Chtimes(filepath.Join(s.buildFilesDir(), hash), now, now)
	}
	return ok
}

// buildFilesRoot opens the build files hash, the build context of a COPY.
func (s *Service) buildFilesRoot(hash string) (*os.Root, error) {
	id, ok := s.buildFilesLayer(hash)
	if !ok {
		return nil, fmt.Errorf("%w: the files %.12s… were not uploaded (or have expired): upload them again", errdefs.ErrInvalid, hash)
	}
	return os.OpenRoot(s.layers.LayerDir(id))
}

// pinnedBuildFiles returns the layers of the build files in use, and
// removes the pins unused for buildFilesTTL. Called with tmplMu held.
func (s *Service) pinnedBuildFiles() map[string]bool {
	pinned := map[string]bool{}
	ents, err := os.ReadDir(s.buildFilesDir())
	if errors.Is(err, fs.ErrNotExist) {
		return pinned
	}
	for _, e := range ents {
		p := filepath.Join(s.buildFilesDir(), e.Name())
		fi, err := e.Info()
		if err != nil || !validFilesHash(e.Name()) || time.Since(fi.ModTime()) > buildFilesTTL {
			_ = os.Remove(p)
			continue
		}
		if b, err := os.ReadFile(p); err == nil {
			pinned[strings.TrimSpace(string(b))] = true
		}
	}
	return pinned
}
