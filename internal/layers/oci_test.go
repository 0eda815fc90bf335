package layers_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/testenv"
)

var mtime = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

// entry is one tar entry; typ defaults to a regular file, or a directory when
// the name ends in "/".
type entry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid, gid         int
}

func mkTar(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			Linkname: e.link, ModTime: mtime, Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
			if strings.HasSuffix(e.name, "/") {
				h.Typeflag = tar.TypeDir
			}
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// The test image: a small tree, then a layer that deletes a file and makes a
// directory opaque.
var (
	lowerEntries = []entry{
		{name: "etc/"},
		{name: "etc/passwd", body: "root:x:0:0::/root:/bin/sh\n"},
		{name: "bin/"},
		{name: "bin/tool", body: "#!/bin/sh\n", mode: 0o4755},
		{name: "tmp/", mode: 0o1777},
		{name: "home/user/", uid: 1000, gid: 1000},
		{name: "home/user/notes", body: "hi", mode: 0o600, uid: 1000, gid: 1000},
		{name: "data/"},
		{name: "data/a", body: "a"},
		{name: "data/b", body: "b"},
		{name: "gone.txt", body: "delete me"},
		{name: "link", typ: tar.TypeSymlink, link: "/etc/passwd"},
		{name: "hard", typ: tar.TypeLink, link: "etc/passwd"},
	}
	upperEntries = []entry{
		{name: ".wh.gone.txt"},
		{name: "data/"},
		{name: "data/.wh..wh..opq"},
		{name: "data/c", body: "c"},
		{name: "new.txt", body: "new"},
	}
	testConfig = v1.Config{Env: []string{"PATH=/bin", "A=b"}, WorkingDir: "/home/user", User: "1000:1000",
		Entrypoint: []string{"/bin/tool"}, Cmd: []string{"-v"}}
)

func testImage(t testing.TB) (v1.Image, []string) {
	t.Helper()
	var ls []v1.Layer
	var ids []string
	for _, es := range [][]entry{lowerEntries, upperEntries} {
		b := mkTar(t, es...)
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ids = append(ids, digest(b))
	}
	img, err := mutate.AppendLayers(empty.Image, ls...)
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.Config(img, testConfig); err != nil {
		t.Fatal(err)
	}
	return img, ids
}

func stat(t testing.TB, p string) *syscall.Stat_t {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t)
}

func checkImage(t *testing.T, s *layers.Store, got layers.Image, img v1.Image, ids []string) {
	t.Helper()
	d, _ := img.Digest()
	want := layers.Image{Digest: d.String(), Layers: ids, Size: got.Size, Config: layers.ImageConfig{
		Env: testConfig.Env, WorkingDir: testConfig.WorkingDir, User: testConfig.User,
		Entrypoint: testConfig.Entrypoint, Cmd: testConfig.Cmd}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("image (-want +got):\n%s", diff)
	}
	// Regular file bytes of both layers, the hard link counted once.
	if wantSize := int64(26 + 10 + 2 + 1 + 1 + 9 + 1 + 3); got.Size != wantSize {
		t.Errorf("size %d, want %d", got.Size, wantSize)
	}
	low, up := s.LayerDir(ids[0]), s.LayerDir(ids[1])
	if b, err := os.ReadFile(filepath.Join(low, "etc/passwd")); err != nil || string(b) != "root:x:0:0::/root:/bin/sh\n" {
		t.Errorf("etc/passwd: %q, %v", b, err)
	}
	modes := map[string]os.FileMode{
		"etc/passwd": 0o644, "bin/tool": 0o755 | os.ModeSetuid, "tmp": 0o777 | os.ModeSticky | os.ModeDir,
		"home/user/notes": 0o600, "etc": 0o755 | os.ModeDir, "link": 0o777 | os.ModeSymlink,
	}
	for p, m := range modes {
		fi, err := os.Lstat(filepath.Join(low, p))
		if err != nil {
			t.Error(err)
			continue
		}
		if fi.Mode() != m {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode(), m)
		}
		if p != "link" && !fi.ModTime().Equal(mtime) {
			t.Errorf("%s: mtime %v, want %v", p, fi.ModTime(), mtime)
		}
	}
	if st := stat(t, filepath.Join(low, "home/user/notes")); st.Uid != 1000 || st.Gid != 1000 {
		t.Errorf("notes owned by %d:%d", st.Uid, st.Gid)
	}
	if st := stat(t, filepath.Join(low, "home/user")); st.Uid != 1000 {
		t.Errorf("home/user owned by %d", st.Uid)
	}
	if target, err := os.Readlink(filepath.Join(low, "link")); err != nil || target != "/etc/passwd" {
		t.Errorf("link -> %q, %v", target, err)
	}
	if a, b := stat(t, filepath.Join(low, "hard")), stat(t, filepath.Join(low, "etc/passwd")); a.Ino != b.Ino {
		t.Error("hard is not a hard link of etc/passwd")
	}
	// The whiteout is a character device 0/0, the opaque directory is marked.
	st := stat(t, filepath.Join(up, "gone.txt"))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("gone.txt: mode %o rdev %d, want a 0/0 char device", st.Mode, st.Rdev)
	}
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(filepath.Join(up, "data"), "user.overlay.opaque", buf)
	if err != nil || string(buf[:n]) != "y" {
		t.Errorf("data: user.overlay.opaque = %q, %v", buf[:n], err)
	}
	if _, err := os.Lstat(filepath.Join(up, "data/.wh..wh..opq")); err == nil {
		t.Error("the opaque marker was unpacked as a file")
	}
}

func newStore(t *testing.T) *layers.Store {
	t.Helper()
	return testenv.Layers(t, testenv.Dir(t))
}

func TestImport(t *testing.T) {
	s := newStore(t)
	img, ids := testImage(t)
	ctx := context.Background()

	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/test/img:v1"
	if err := remote.Write(mustRef(t, ref), img); err != nil {
		t.Fatal(err)
	}
	dir := testenv.Dir(t)
	dockerArchive := filepath.Join(dir, "docker.tar")
	if err := tarball.WriteToFile(dockerArchive, mustRef(t, "test/img:v1"), img); err != nil {
		t.Fatal(err)
	}
	layoutDir := filepath.Join(dir, "layout")
	lp, err := layout.Write(layoutDir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"})); err != nil {
		t.Fatal(err)
	}
	ociArchive := filepath.Join(dir, "oci.tar")
	tarDir(t, layoutDir, ociArchive)

	sources := []struct {
		name string
		src  layers.ImportSource
	}{
		{"registry", layers.ImportSource{Ref: ref, Insecure: true}},
		{"docker-archive", layers.ImportSource{Archive: dockerArchive}},
		{"oci-layout", layers.ImportSource{Layout: layoutDir, Platform: "linux/amd64"}},
		{"oci-archive", layers.ImportSource{Archive: ociArchive, Platform: "linux/amd64"}},
	}
	for _, tc := range sources {
		t.Run(tc.name, func(t *testing.T) {
			for _, id := range ids {
				if err := s.RemoveLayer(id); err != nil {
					t.Fatal(err)
				}
			}
			var calls []layers.Progress
			got, err := s.Import(ctx, tc.src, func(p layers.Progress) { calls = append(calls, p) })
			if err != nil {
				t.Fatal(err)
			}
			checkImage(t, s, got, img, ids)
			if len(calls) == 0 || calls[len(calls)-1].LayersDone != 2 || calls[len(calls)-1].Layers != 2 {
				t.Errorf("progress calls %+v", calls)
			}
			// A second import reuses the layers: same directories, same inodes.
			before := stat(t, s.LayerDir(ids[0])).Ino
			again, err := s.Import(ctx, tc.src, nil)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(got, again); diff != "" {
				t.Errorf("second import (-first +second):\n%s", diff)
			}
			if after := stat(t, s.LayerDir(ids[0])).Ino; after != before {
				t.Error("second import unpacked the layer again")
			}
			if got, _ := s.LayerIDs(); len(got) != 2 {
				t.Errorf("layers %v", got)
			}
			assertNoTemps(t, s)
		})
	}

	t.Run("wrong-platform", func(t *testing.T) {
		_, err := s.Import(ctx, layers.ImportSource{Layout: layoutDir, Platform: "linux/s390x"}, nil)
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("err = %v, want not found", err)
		}
	})
	t.Run("missing-tag", func(t *testing.T) {
		_, err := s.Import(ctx, layers.ImportSource{Ref: strings.TrimSuffix(ref, "v1") + "nope", Insecure: true}, nil)
		if !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("err = %v, want not found", err)
		}
	})
}

// TestOverlay mounts the two unpacked layers as an overlay, as sandboxes do
// (userxattr), and checks what the image's second layer deleted is gone.
func TestOverlay(t *testing.T) {
	s := newStore(t)
	img, ids := testImage(t)
	lp, err := layout.Write(testenv.Dir(t), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(context.Background(), layers.ImportSource{Layout: string(lp)}, nil); err != nil {
		t.Fatal(err)
	}
	mnt := testenv.Dir(t)
	opts := "lowerdir=" + s.LayerDir(ids[1]) + ":" + s.LayerDir(ids[0]) + ",userxattr"
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, opts); err != nil {
		t.Fatalf("mounting overlay: %v", err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	for p, want := range map[string]bool{
		"gone.txt": false, "data/a": false, "data/b": false, "data/c": true,
		"new.txt": true, "etc/passwd": true, "bin/tool": true,
	} {
		_, err := os.Lstat(filepath.Join(mnt, p))
		if got := err == nil; got != want {
			t.Errorf("%s: exists %v, want %v (%v)", p, got, want, err)
		}
	}
	ents, err := os.ReadDir(filepath.Join(mnt, "data"))
	if err != nil || len(ents) != 1 {
		t.Errorf("data holds %v, %v; want only c", ents, err)
	}
}

func mustRef(t testing.TB, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// tarDir writes the tree under dir as a tar file.
func tarDir(t testing.TB, dir, file string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		h.Name = rel
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func assertNoTemps(t testing.TB, s *layers.Store) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(s.Dir(), "layers"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}
