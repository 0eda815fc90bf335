// Package blob opens the object storage that archived sandboxes go to, by
// URL, through gocloud.dev/blob: file:///path (the default, a local
// directory) today; S3-compatible stores join it for cluster mode.
package blob

import (
	"context"
	"fmt"
	"os"
	"strings"

	gblob "gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:// buckets
)

// Bucket is an object store bucket.
type Bucket = gblob.Bucket

// Open opens the bucket at url, creating a file:// bucket's directory.
func Open(ctx context.Context, url string) (*Bucket, error) {
	if rest, ok := strings.CutPrefix(url, "file://"); ok {
		dir, query, _ := strings.Cut(rest, "?")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		// A file bucket writes each object to a temporary file beside it,
		// not in $TMPDIR: the rename that commits the object then never
		// crosses file systems, and what a crash leaves stays in the
		// bucket, under the object's key, where start-up finds it.
		if !strings.Contains(query, "no_tmp_dir=") {
			if query == "" {
				url += "?no_tmp_dir=1"
			} else {
				url += "&no_tmp_dir=1"
			}
		}
	}
	b, err := gblob.OpenBucket(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("opening bucket %s: %w", url, err)
	}
	return b, nil
}
