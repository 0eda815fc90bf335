package blob

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	gblob "gocloud.dev/blob"
)

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
