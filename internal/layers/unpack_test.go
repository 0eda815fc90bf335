package layers_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// tree lists every path under dir with its type, size and content digest.
func tree(t testing.TB, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		line := fmt.Sprintf("%s %v %d", p, fi.Mode(), fi.Size())
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += " " + digest(b)
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// TestHostileLayers feeds crafted layers to AddLayer: each is refused with
// nothing written outside the layer and no layer or temporary directory left.
func TestHostileLayers(t *testing.T) {
	s := newStore(t)
	outside := testenv.Dir(t)
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(outside, "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	s.MaxUnpackBytes = 1 << 20
	s.MaxUnpackEntries = 100

	big := mkTar(t, entry{name: "big", body: strings.Repeat("x", 1<<20+1)})
	// A header claiming 1 TiB, with no content behind it.
	var huge bytes.Buffer
	tw := tar.NewWriter(&huge)
	tw.WriteHeader(&tar.Header{Name: "huge", Typeflag: tar.TypeReg, Size: 1 << 40, Mode: 0o644})
	tw.Flush()
	many := make([]entry, 101)
	for i := range many {
		many[i] = entry{name: fmt.Sprintf("f%d", i)}
	}
	good := mkTar(t, entry{name: "a", body: strings.Repeat("a", 4000)}, entry{name: "b", body: "b"})

	cases := []struct {
		name string
		tar  []byte
		id   string // default: the tar's digest
		want error
	}{
		{"dotdot", mkTar(t, entry{name: "../escape", body: "x"}), "", errdefs.ErrInvalid},
		{"dotdot-nested", mkTar(t, entry{name: "a/"}, entry{name: "a/../../escape", body: "x"}), "", errdefs.ErrInvalid},
		{"absolute", mkTar(t, entry{name: victim, body: "pwned"}), "", errdefs.ErrInvalid},
		{"whiteout-dotdot", mkTar(t, entry{name: "../.wh.victim"}), "", errdefs.ErrInvalid},
		{"symlink-parent", mkTar(t,
			entry{name: "d", typ: tar.TypeSymlink, link: filepath.Join(outside, "dir")},
			entry{name: "d/x", body: "pwned"}), "", errdefs.ErrInvalid},
		{"symlink-parent-relative", mkTar(t,
			entry{name: "d", typ: tar.TypeSymlink, link: "../../../../../../../../" + outside[1:] + "/dir"},
			entry{name: "d/x", body: "pwned"}), "", errdefs.ErrInvalid},
		{"hardlink-dotdot", mkTar(t, entry{name: "h", typ: tar.TypeLink, link: "../../victim"}), "", errdefs.ErrInvalid},
		{"hardlink-absolute", mkTar(t, entry{name: "h", typ: tar.TypeLink, link: victim}), "", errdefs.ErrInvalid},
		{"hardlink-missing", mkTar(t, entry{name: "h", typ: tar.TypeLink, link: "nothere"}), "", errdefs.ErrInvalid},
		{"hardlink-dir", mkTar(t, entry{name: "d/"}, entry{name: "h", typ: tar.TypeLink, link: "d"}), "", errdefs.ErrInvalid},
		{"char-device", mkTar(t, entry{name: "null", typ: tar.TypeChar}), "", errdefs.ErrInvalid},
		{"block-device", mkTar(t, entry{name: "sda", typ: tar.TypeBlock}), "", errdefs.ErrInvalid},
		{"fifo", mkTar(t, entry{name: "fifo", typ: tar.TypeFifo}), "", errdefs.ErrInvalid},
		{"too-big", big, "", errdefs.ErrTooLarge},
		{"huge-header", huge.Bytes(), "", errdefs.ErrTooLarge},
		{"too-many-entries", mkTar(t, many...), "", errdefs.ErrTooLarge},
		{"truncated", good[:1500], "", errdefs.ErrInvalid},
		{"garbage", bytes.Repeat([]byte("not a tar"), 200), "", errdefs.ErrInvalid},
		{"digest-mismatch", good, digest([]byte("other")), errdefs.ErrInvalid},
		{"bad-id", good, "../../etc", errdefs.ErrInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before, beforeOut := tree(t, s.Dir()), tree(t, outside)
			id := tc.id
			if id == "" {
				id = digest(tc.tar)
			}
			_, err := s.AddLayer(context.Background(), id, bytes.NewReader(tc.tar))
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			t.Logf("refused: %v", err)
			if diff := cmp.Diff(before, tree(t, s.Dir())); diff != "" {
				t.Errorf("store changed (-before +after):\n%s", diff)
			}
			if diff := cmp.Diff(beforeOut, tree(t, outside)); diff != "" {
				t.Errorf("outside changed (-before +after):\n%s", diff)
			}
			if ids, _ := s.LayerIDs(); len(ids) != 0 {
				t.Errorf("layers left: %v", ids)
			}
		})
	}

	// Contained rather than refused: a symlink, then a file of the same name,
	// replaces the symlink instead of writing through it; a symlink pointing
	// out is stored as it is (it resolves inside the sandbox); a hard link to
	// it links the symlink, not the file outside.
	t.Run("symlink-replaced", func(t *testing.T) {
		b := mkTar(t,
			entry{name: "evil", typ: tar.TypeSymlink, link: victim},
			entry{name: "hl", typ: tar.TypeLink, link: "evil"},
			entry{name: "rel", typ: tar.TypeSymlink, link: "../../../../../../../../" + victim[1:]},
			entry{name: "evil", body: "pwned"},
			entry{name: "rel", body: "pwned too"},
		)
		beforeOut := tree(t, outside)
		id := digest(b)
		if _, err := s.AddLayer(context.Background(), id, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
		defer s.RemoveLayer(id)
		if diff := cmp.Diff(beforeOut, tree(t, outside)); diff != "" {
			t.Errorf("outside changed (-before +after):\n%s", diff)
		}
		for name, want := range map[string]string{"evil": "pwned", "rel": "pwned too"} {
			p := filepath.Join(s.LayerDir(id), name)
			fi, err := os.Lstat(p)
			if err != nil || !fi.Mode().IsRegular() {
				t.Fatalf("%s: %v, %v; want a regular file", name, fi, err)
			}
			if got, _ := os.ReadFile(p); string(got) != want {
				t.Errorf("%s = %q", name, got)
			}
		}
		if target, err := os.Readlink(filepath.Join(s.LayerDir(id), "hl")); err != nil || target != victim {
			t.Errorf("hl -> %q, %v; want the symlink itself", target, err)
		}
		if st := stat(t, victim); st.Nlink != 1 {
			t.Errorf("victim has %d links", st.Nlink)
		}
	})
}

// TestAddLayerConcurrent adds one layer from many goroutines: they all succeed
// and one layer results.
func TestAddLayerConcurrent(t *testing.T) {
	s := newStore(t)
	b := mkTar(t, lowerEntries...)
	id := digest(b)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = s.AddLayer(context.Background(), id, bytes.NewReader(b))
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if ids, _ := s.LayerIDs(); len(ids) != 1 || ids[0] != id {
		t.Errorf("layers %v", ids)
	}
	assertNoTemps(t, s)
	got, size, err := s.AddLayerDigest(context.Background(), bytes.NewReader(b))
	if err != nil || got != id || size == 0 {
		t.Errorf("AddLayerDigest = %s, %d, %v", got, size, err)
	}
	if err := s.RemoveLayer(id); err != nil || s.HasLayer(id) {
		t.Errorf("RemoveLayer: %v, still there: %v", err, s.HasLayer(id))
	}
	assertNoTemps(t, s)
}

// TestImportHostile imports hand-made OCI layouts whose layer blobs are
// broken: nothing is left in the store.
func TestImportHostile(t *testing.T) {
	s := newStore(t)
	layer := mkTar(t, entry{name: "f", body: strings.Repeat("data", 10000)})
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(layer)
	zw.Close()
	corrupt := bytes.Clone(gz.Bytes())
	for i := 20; i < 60; i++ {
		corrupt[i] ^= 0xff
	}
	cases := []struct {
		name   string
		blob   []byte
		diffID string
	}{
		{"corrupt-gzip", corrupt, digest(layer)},
		{"truncated-gzip", gz.Bytes()[:gz.Len()/2], digest(layer)},
		{"not-gzip", []byte("plain junk, not a layer"), digest(layer)},
		{"diffid-mismatch", gz.Bytes(), digest([]byte("another layer"))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := ociLayout(t, tc.blob, tc.diffID)
			before := tree(t, s.Dir())
			_, err := s.Import(context.Background(), layers.ImportSource{Layout: dir}, nil)
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("err = %v, want invalid", err)
			}
			t.Logf("refused: %v", err)
			if diff := cmp.Diff(before, tree(t, s.Dir())); diff != "" {
				t.Errorf("store changed (-before +after):\n%s", diff)
			}
		})
	}
}

// ociLayout writes an OCI layout of one image with one gzip layer blob and the
// diffID its config claims, without checking either.
func ociLayout(t testing.TB, blob []byte, diffID string) string {
	t.Helper()
	dir := testenv.Dir(t)
	write := func(b []byte) (string, int) {
		d := digest(b)
		p := filepath.Join(dir, "blobs", "sha256", d)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return "sha256:" + d, len(b)
	}
	mustJSON := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	layerDigest, layerSize := write(blob)
	config := mustJSON(map[string]any{
		"architecture": "amd64", "os": "linux",
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + diffID}},
	})
	configDigest, configSize := write(config)
	manifest := mustJSON(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": configDigest, "size": configSize},
		"layers": []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layerDigest, "size": layerSize}},
	})
	manifestDigest, manifestSize := write(manifest)
	index := mustJSON(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
		"manifests": []any{map[string]any{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifestDigest, "size": manifestSize}},
	})
	if err := os.WriteFile(filepath.Join(dir, "index.json"), index, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"1.0.0"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}
