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
	if dir, ok := strings.CutPrefix(url, "file://"); ok {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
	}
	b, err := gblob.OpenBucket(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("opening bucket %s: %w", url, err)
	}
	return b, nil
}
