package testenv

import (
	"archive/tar"
	"bytes"
)

// Tar is a tar stream of regular files (mode 0644) given as pairs of name
// and content, in that order: a build context, an image layer, an upload.
func Tar(files ...string) *bytes.Buffer {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i := 0; i+1 < len(files); i += 2 {
		tw.WriteHeader(&tar.Header{Name: files[i], Mode: 0o644, Size: int64(len(files[i+1])), Typeflag: tar.TypeReg})
		tw.Write([]byte(files[i+1]))
	}
	tw.Close()
	return &buf
}
