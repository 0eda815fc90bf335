package confine

import (
	"fmt"
	"os"
	"path/filepath"
)

// Mountpoint returns root+target after making sure it exists as a directory
// (dir) or a file. Template layers normally provide mount points; making one
// here writes it into the sandbox's writable layer. Paths come from the
// node, not from the sandbox, and the root is not yet visible to any sandbox
// process, so plain path operations are safe here.
func Mountpoint(root, target string, dir bool) (string, error) {
	p := filepath.Join(root, target)
	if fi, err := os.Lstat(p); err == nil {
		if fi.IsDir() != dir || fi.Mode()&os.ModeSymlink != 0 {
			return "", fmt.Errorf("mountpoint %s has the wrong type", target)
		}
		return p, nil
	}
	if dir {
		return p, os.MkdirAll(p, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return "", err
	}
	return p, f.Close()
}
