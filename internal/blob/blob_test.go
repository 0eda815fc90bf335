package blob_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/internal/blob"
	"github.com/atoll-dev/atoll/internal/blob/blobtest"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// TestConformance holds both kinds of bucket to the store contract: a
// local directory, and S3 (the server scripts/test.sh starts).
func TestConformance(t *testing.T) {
	t.Run("file", func(t *testing.T) {
		blobtest.Run(t, func(t *testing.T) blob.Store { return open(t, "file://"+t.TempDir()+"/archive") })
	})
	t.Run("s3", func(t *testing.T) {
		u := testenv.S3URL(t)
		blobtest.Run(t, func(t *testing.T) blob.Store {
			// A prefix of its own, so that runs sharing a bucket don't meet.
			var r [8]byte
			rand.Read(r[:])
			sep := "?"
			if strings.Contains(u, "?") {
				sep = "&"
			}
			return open(t, u+sep+"prefix=blobtest-"+hex.EncodeToString(r[:])+"/")
		})
	})
}

func open(t *testing.T, url string) *blob.Bucket {
	t.Helper()
	b, err := blob.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	return b
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
		b, err := blob.Open(context.Background(), tc.url)
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
// key and deleted, and leaves none once Put returns.
func TestFileBucketTempBeside(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "bucket")
	b := open(t, "file://"+dir)
	defer b.Close()
	var during []string
	err := b.Put(ctx, "sandboxes/x.tar", func(w io.Writer) error {
		if _, err := w.Write(make([]byte, 1024)); err != nil {
			return err
		}
		var err error
		during, err = b.List(ctx, "sandboxes/x.tar.")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(during) != 1 || !strings.HasSuffix(during[0], ".tmp") {
		t.Fatalf("temporary objects while writing: %q, want one beside the key", during)
	}
	if _, err := os.Stat(filepath.Join(dir, during[0])); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary file after Put: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "sandboxes", "x.tar")); err != nil || fi.Size() != 1024 {
		t.Errorf("object: %v %v", fi, err)
	}
	// A leftover, as a crash leaves it, is listed and deleted by its key.
	left := filepath.Join(dir, "sandboxes", "y.tar.123.tmp")
	if err := os.WriteFile(left, []byte("part"), 0o600); err != nil {
		t.Fatal(err)
	}
	if keys, err := b.List(ctx, "sandboxes/y.tar."); err != nil || len(keys) != 1 {
		t.Fatalf("leftover: %q, %v", keys, err)
	} else if err := b.Delete(ctx, keys[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(left); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("leftover after Delete: %v", err)
	}
}

// TestFileBucketConfined: hostile keys write nothing outside a file
// bucket's directory.
func TestFileBucketConfined(t *testing.T) {
	ctx := context.Background()
	parent := t.TempDir()
	b := open(t, "file://"+filepath.Join(parent, "archive", "bucket"))
	defer b.Close()
	for _, k := range []string{"../x", "../../x", "/x", "a/../../x", "..\\x"} {
		b.Put(ctx, k, func(w io.Writer) error { _, err := w.Write([]byte("evil")); return err })
	}
	var found []string
	filepath.WalkDir(parent, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			found = append(found, p)
		}
		return err
	})
	if len(found) != 0 {
		t.Errorf("hostile keys wrote %q", found)
	}
}
