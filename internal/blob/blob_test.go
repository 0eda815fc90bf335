package blob

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gblob "gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	"github.com/atoll-dev/atoll/internal/testenv"
)

// TestBlob runs what the archive needs of a bucket against each kind of
// store: write, read back, list, delete, and NotFound for a missing key.
func TestBlob(t *testing.T) {
	for _, tc := range []struct {
		name string
		url  func(t *testing.T) string
	}{
		{"file", func(t *testing.T) string { return "file://" + t.TempDir() + "/archive" }},
		{"s3", func(t *testing.T) string { return testenv.S3URL(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			b, err := Open(ctx, tc.url(t))
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			// A prefix of its own, so that runs sharing a bucket don't meet.
			var r [8]byte
			rand.Read(r[:])
			prefix := "blobtest-" + hex.EncodeToString(r[:]) + "/"
			key := prefix + "sandboxes/x.tar"
			// Archives are large: past 16 MiB the S3 writer switches to a
			// multipart upload, here in 5 MiB parts (S3's smallest).
			// Random, so that parts out of order show.
			data := make([]byte, 17<<20)
			rand.Read(data)

			w, err := b.NewWriter(ctx, key, &gblob.WriterOptions{BufferSize: 5 << 20})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Write(data); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatalf("writing %s: %v", key, err)
			}
			got, err := b.ReadAll(ctx, key)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("reading %s back: %d bytes, %v; want %d bytes", key, len(got), err, len(data))
			}

			it := b.List(&gblob.ListOptions{Prefix: prefix})
			var keys []string
			for {
				obj, err := it.Next(ctx)
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				keys = append(keys, obj.Key)
			}
			if len(keys) != 1 || keys[0] != key {
				t.Errorf("listing %s: %q, want [%q]", prefix, keys, key)
			}

			if err := b.Delete(ctx, key); err != nil {
				t.Fatal(err)
			}
			if _, err := b.NewReader(ctx, key, nil); gcerrors.Code(err) != gcerrors.NotFound {
				t.Errorf("reading a deleted key: %v, want NotFound", err)
			}
			if err := b.Delete(ctx, key); gcerrors.Code(err) != gcerrors.NotFound {
				t.Errorf("deleting a deleted key: %v, want NotFound", err)
			}
			if _, err := b.NewReader(ctx, prefix+"never-written", nil); gcerrors.Code(err) != gcerrors.NotFound {
				t.Errorf("reading a missing key: %v, want NotFound", err)
			}
		})
	}
}

// TestBlobBadURL checks that a URL atoll cannot use fails at Open, which
// `atoll serve` calls at startup, with a message that says what is wrong.
func TestBlobBadURL(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"gs://bucket", `unsupported scheme "gs"`},
		{"/var/lib/atoll/archive", `unsupported scheme ""`},
		{"s3:///archive", "no bucket name"},
		{"s3://archive?endpoint=http://127.0.0.1:9000&regoin=us-east-1", `unknown query parameter "regoin"`},
		{"s3://archive?use_path_style=maybe", "use_path_style"},
		{"file://relative/dir", "want file:///absolute/path"},
		{"s3://arch ive", "invalid character"},
	} {
		b, err := Open(context.Background(), tc.url)
		if err == nil {
			b.Close()
			t.Errorf("Open(%q) succeeded", tc.url)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Open(%q): %v, want it to say %s", tc.url, err, tc.want)
		}
	}
}

// TestFileBucketTempBeside: a file bucket writes an object to a temporary
// file beside it, where a crash's leftover can be found under the object's
// key, and hands that file to BeforeWrite, so that a caller can sync it.
func TestFileBucketTempBeside(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "bucket")
	b, err := Open(ctx, "file://"+dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var f *os.File
	w, err := b.NewWriter(ctx, "sandboxes/x.tar", &gblob.WriterOptions{
		BeforeWrite: func(as func(any) bool) error { as(&f); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	if f == nil || filepath.Dir(f.Name()) != filepath.Join(dir, "sandboxes") {
		t.Fatalf("temporary file %v, want one in %s", f, filepath.Join(dir, "sandboxes"))
	}
	it := b.List(&gblob.ListOptions{Prefix: "sandboxes/x.tar."})
	if obj, err := it.Next(ctx); err != nil || filepath.Join(dir, obj.Key) != f.Name() {
		t.Errorf("listing the temporary file: %+v %v", obj, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "sandboxes", "x.tar")); err != nil || fi.Size() != 1024 {
		t.Errorf("object: %v %v", fi, err)
	}
}
