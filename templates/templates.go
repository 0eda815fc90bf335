// Package templates holds the Dockerfiles of the templates atoll makes
// itself (atoll template bootstrap base), embedded in the binary. Each lives
// in a directory of its own, which is its build context.
package templates

import (
	"archive/tar"
	"bytes"
	"embed"
	"io/fs"
	"path"
)

//go:embed base code-interpreter
var files embed.FS

// Context returns the build context of template name as a tar archive, and
// whether atoll has such a template.
func Context(name string) ([]byte, bool) {
	if !fs.ValidPath(name) || path.Base(name) != name {
		return nil, false
	}
	sub, err := fs.Sub(files, name)
	if err != nil {
		return nil, false
	}
	if _, err := fs.Stat(sub, "Dockerfile"); err != nil {
		return nil, false
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.AddFS(sub); err != nil {
		return nil, false
	}
	if err := tw.Close(); err != nil {
		return nil, false
	}
	return buf.Bytes(), true
}

// Names are the templates atoll makes itself.
func Names() []string {
	ents, _ := files.ReadDir(".")
	var names []string
	for _, e := range ents {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names
}
