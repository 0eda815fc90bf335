package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// treeEntry is what a tar round trip must keep of a file.
type treeEntry struct {
	Mode     fs.FileMode
	UID, GID int
	Content  string
	Target   string
}

func readTree(t *testing.T, dir string) map[string]treeEntry {
	t.Helper()
	tree := map[string]treeEntry{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		e := treeEntry{Mode: fi.Mode(), UID: int(st.Uid), GID: int(st.Gid)}
		switch {
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			e.Content = string(b)
		case fi.Mode()&fs.ModeSymlink != 0:
			e.Target, _ = os.Readlink(p)
		}
		rel, _ := filepath.Rel(dir, p)
		tree[rel] = e
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return tree
}

func TestTarRoundTrip(t *testing.T) {
	e := startAgent(t, Config{})
	ctx := context.Background()
	src := filepath.Join(e.dir, "src")
	for _, dir := range []string{"bin", "sub/deep", "empty", "ro"} {
		os.MkdirAll(filepath.Join(src, dir), 0o755)
	}
	os.WriteFile(src+"/a.txt", []byte("alpha"), 0o640)
	os.WriteFile(src+"/bin/run", []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(src+"/sub/deep/x", bytes.Repeat([]byte("x"), 100000), 0o600)
	os.WriteFile(src+"/ro/f", []byte("in a read-only dir"), 0o444)
	os.Chmod(src+"/ro", 0o555)
	os.Chmod(src+"/bin/run", 0o4755)
	os.Chown(src+"/sub/deep/x", 1000, 1001)
	os.Symlink("../a.txt", src+"/sub/link")
	os.Symlink("/etc/passwd", src+"/abs-link")

	r, err := e.c.DownloadTar(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	archive, err := io.ReadAll(r)
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if filepath.IsAbs(hdr.Name) || !filepath.IsLocal(hdr.Name) {
			t.Errorf("entry name %q is not relative", hdr.Name)
		}
	}

	dst := filepath.Join(e.dir, "dst", "new")
	if err := e.c.UploadTar(ctx, dst, bytes.NewReader(archive)); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(readTree(t, src), readTree(t, dst)); diff != "" {
		t.Errorf("tree after round trip (-src +dst):\n%s", diff)
	}

	// One file downloads as a one-entry archive.
	r, err = e.c.DownloadTar(ctx, src+"/a.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	tr = tar.NewReader(r)
	hdr, err := tr.Next()
	if err != nil || hdr.Name != "a.txt" {
		t.Fatalf("single file: %+v, %v", hdr, err)
	}
	if _, err := tr.Next(); err != io.EOF {
		t.Errorf("more than one entry: %v", err)
	}
}

type tarEntry struct {
	hdr  tar.Header
	body string
}

func mkTar(t *testing.T, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := e.hdr
		if hdr.Mode == 0 {
			hdr.Mode = 0o644
		}
		hdr.Size = int64(len(e.body))
		hdr.ModTime = time.Unix(1700000000, 0)
		if err := tw.WriteHeader(&hdr); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	return buf.Bytes()
}

func file(name, body string) tarEntry {
	return tarEntry{hdr: tar.Header{Name: name, Typeflag: tar.TypeReg}, body: body}
}

func link(typ byte, name, target string) tarEntry {
	return tarEntry{hdr: tar.Header{Name: name, Typeflag: typ, Linkname: target}}
}

func TestTarSlip(t *testing.T) {
	e := startAgent(t, Config{})
	e.a.maxTarBytes = 1 << 20
	e.a.maxTarFiles = 100
	ctx := context.Background()
	parent := filepath.Join(e.dir, "parent")

	tests := []struct {
		name    string
		entries []tarEntry
		status  int
		code    string
	}{
		{"dotdot", []tarEntry{file("../evil", "pwned")}, 400, "invalid"},
		{"dotdot inside", []tarEntry{file("ok", "fine"), file("a/../../evil", "pwned")}, 400, "invalid"},
		{"absolute", []tarEntry{file(parent+"/evil", "pwned")}, 400, "invalid"},
		{"symlink dir then write", []tarEntry{link(tar.TypeSymlink, "l", ".."), file("l/evil", "pwned")}, 400, "invalid"},
		{"absolute symlink then write", []tarEntry{link(tar.TypeSymlink, "l", parent), file("l/evil", "pwned")}, 400, "invalid"},
		{"symlink then mkdir", []tarEntry{link(tar.TypeSymlink, "l", parent), {hdr: tar.Header{Name: "l/evil/", Typeflag: tar.TypeDir}}}, 400, "invalid"},
		{"nested symlink then write", []tarEntry{link(tar.TypeSymlink, "a", "."), link(tar.TypeSymlink, "a/b", "../.."), file("a/b/evil", "pwned")}, 400, "invalid"},
		{"hardlink outside", []tarEntry{link(tar.TypeLink, "h", "../outside")}, 400, "invalid"},
		{"hardlink absolute", []tarEntry{link(tar.TypeLink, "h", parent+"/outside")}, 400, "invalid"},
		{"hardlink through symlink", []tarEntry{link(tar.TypeSymlink, "l", ".."), link(tar.TypeLink, "h", "l/outside")}, 400, "invalid"},
		{"char device", []tarEntry{{hdr: tar.Header{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}}}, 400, "invalid"},
		{"block device", []tarEntry{{hdr: tar.Header{Name: "sda", Typeflag: tar.TypeBlock, Devmajor: 8}}}, 400, "invalid"},
		{"fifo", []tarEntry{{hdr: tar.Header{Name: "fifo", Typeflag: tar.TypeFifo}}}, 400, "invalid"},
		{"too big", []tarEntry{file("a", string(make([]byte, 600<<10))), file("b", string(make([]byte, 600<<10)))}, 413, "too_large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			os.RemoveAll(parent)
			target := filepath.Join(parent, "target")
			os.MkdirAll(target, 0o755)
			os.WriteFile(parent+"/outside", []byte("secret"), 0o600)
			err := e.c.UploadTar(ctx, target, bytes.NewReader(mkTar(t, tt.entries...)))
			wantStatus(t, err, tt.status, tt.code)

			entries, _ := os.ReadDir(parent)
			var names []string
			for _, d := range entries {
				names = append(names, d.Name())
			}
			if diff := cmp.Diff([]string{"outside", "target"}, names); diff != "" {
				t.Errorf("written outside (-want +got):\n%s", diff)
			}
			var st syscall.Stat_t
			if b, _ := os.ReadFile(parent + "/outside"); string(b) != "secret" || syscall.Stat(parent+"/outside", &st) != nil || st.Nlink != 1 {
				t.Errorf("outside file touched: %q, %d links", b, st.Nlink)
			}
		})
	}

	t.Run("symlink replaced, not followed", func(t *testing.T) {
		os.RemoveAll(parent)
		target := filepath.Join(parent, "target")
		os.MkdirAll(target, 0o755)
		os.WriteFile(parent+"/outside", []byte("secret"), 0o600)
		archive := mkTar(t, link(tar.TypeSymlink, "f", "../outside"), file("f", "mine"))
		if err := e.c.UploadTar(ctx, target, bytes.NewReader(archive)); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(parent + "/outside"); string(b) != "secret" {
			t.Errorf("outside file now %q", b)
		}
		if b, _ := os.ReadFile(target + "/f"); string(b) != "mine" {
			t.Errorf("f is %q", b)
		}
	})
	t.Run("links inside are fine", func(t *testing.T) {
		target := filepath.Join(e.dir, "fine")
		archive := mkTar(t, file("d/a", "A"), link(tar.TypeLink, "d/h", "d/a"), link(tar.TypeSymlink, "s", "d/a"), file("x/../y", "Y"))
		if err := e.c.UploadTar(ctx, target, bytes.NewReader(archive)); err != nil {
			t.Fatal(err)
		}
		for p, want := range map[string]string{"d/h": "A", "s": "A", "y": "Y"} {
			if b, err := os.ReadFile(filepath.Join(target, p)); string(b) != want {
				t.Errorf("%s: %q, %v", p, b, err)
			}
		}
	})
	t.Run("too many entries", func(t *testing.T) {
		var entries []tarEntry
		for i := range 101 {
			entries = append(entries, file(string(rune('a'+i%26))+string(rune('a'+i/26)), ""))
		}
		err := e.c.UploadTar(ctx, filepath.Join(e.dir, "many"), bytes.NewReader(mkTar(t, entries...)))
		wantStatus(t, err, 413, "too_large")
	})
}
