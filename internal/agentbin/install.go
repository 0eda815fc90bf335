package agentbin

import (
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/atoll-dev/atoll/internal/agent/launch"
	"github.com/atoll-dev/atoll/internal/atomicfile"
)

// Install copies the agent binary src into dir under a name made from its
// content hash and returns the copy's path. Sandboxes run the copy, so it
// must outlive the process that started them (a `go run` binary does not) and
// must never change under a running sandbox; a new build gets a new name.
func Install(dir, src string) (string, error) {
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", err
	}
	// Sandboxes exec it as their unprivileged host uid: parents need +x.
	if err := os.Chmod(dir, 0o711); err != nil {
		return "", err
	}
	if err := checkStatic(src); err != nil {
		return "", err
	}
	in, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("opening agent binary: %w", err)
	}
	defer in.Close()
	h := sha256.New()
	if _, err := io.Copy(h, in); err != nil {
		return "", err
	}
	dst := filepath.Join(dir, launch.Name+"-"+hex.EncodeToString(h.Sum(nil))[:16])
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	if _, err := in.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	tmp, err := os.CreateTemp(dir, ".agent-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", err
	}
	if err := tmp.Close(); err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", err
	}
	return dst, atomicfile.SyncDir(dir)
}

// checkStatic refuses an agent binary that needs a dynamic loader: it runs in
// sandboxes whose root has no C library of the host's. Go builds are static
// with CGO_ENABLED=0.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("reading agent binary: %w", err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("the agent binary " + path + " is dynamically linked; build atoll with CGO_ENABLED=0")
		}
	}
	return nil
}
