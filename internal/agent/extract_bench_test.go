package agent

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"testing"
	"time"
)

// BenchmarkExtract unpacks a tar of 1,000 small files in one directory,
// as a vault's clone is (docs/benchmarks.md, "a mount, cut down"); with
// strace -f -c it counts the syscalls a file.
//
//	go test -run - -bench Extract -benchtime 10x ./internal/agent
func BenchmarkExtract(b *testing.B) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	uid, gid := os.Getuid(), os.Getgid()
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "notes/", Mode: 0o755, Uid: uid, Gid: gid, ModTime: time.Now()})
	for i := range 1000 {
		body := fmt.Sprintf("# note %d\nsome text, [[n%d]]\n", i, i+1)
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("notes/n%d.md", i), Mode: 0o644,
			Size: int64(len(body)), Uid: uid, Gid: gid, ModTime: time.Now()})
		tw.Write([]byte(body))
	}
	tw.Close()
	a := &Agent{maxTarFiles: defaultTarFiles, maxTarBytes: defaultTarBytes}
	b.ResetTimer()
	for range b.N {
		root, err := os.OpenRoot(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		if err := a.extract(root, bytes.NewReader(buf.Bytes())); err != nil {
			b.Fatal(err)
		}
		root.Close()
	}
}
