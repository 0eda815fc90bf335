// Package blob opens the object storage that archived sandboxes go to, by
// URL, through gocloud.dev/blob: file:///path (the default, a local
// directory) or s3://bucket for Amazon S3 and S3-compatible stores, e.g.
//
//	s3://archive?endpoint=http://127.0.0.1:9000&region=us-east-1&use_path_style=true
//
// An s3:// bucket takes its credentials from the AWS SDK's usual sources
// (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE and ~/.aws, an
// instance role); its query parameters are those of gocloud.dev/blob/s3blob's
// URLOpener. Any bucket takes prefix=dir/ to keep its objects under dir/.
package blob

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strings"

	gblob "gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:// buckets
	_ "gocloud.dev/blob/s3blob"   // s3:// buckets
)

// Bucket is an object store bucket.
type Bucket = gblob.Bucket

// Open opens the bucket at rawURL, creating a file:// bucket's directory.
// It checks the URL, not the store: an unreachable store or a missing bucket
// shows at the first read or write.
func Open(ctx context.Context, rawURL string) (*Bucket, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("parsing bucket URL: %w", err)
	}
	switch u.Scheme {
	case "file":
		dir := u.Path
		if u.Host == "." { // file://./dir, relative, as fileblob reads it
			dir = strings.TrimPrefix(dir, "/")
		} else if u.Host != "" || dir == "" {
			return nil, fmt.Errorf("bucket URL %s: want file:///absolute/path or file://./relative/path", rawURL)
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		// A file bucket writes each object to a temporary file beside it,
		// not in $TMPDIR: the rename that commits the object then never
		// crosses file systems, and what a crash leaves stays in the
		// bucket, under the object's key, where start-up finds it.
		if q := u.Query(); !q.Has("no_tmp_dir") {
			q.Set("no_tmp_dir", "1")
			u.RawQuery = q.Encode()
		}
	case "s3":
		if u.Host == "" {
			return nil, fmt.Errorf("bucket URL %s: no bucket name (want s3://bucket?...)", rawURL)
		}
	default:
		return nil, fmt.Errorf("bucket URL %s: unsupported scheme %q (want file:// or s3://)", rawURL, u.Scheme)
	}
	b, err := gblob.DefaultURLMux().OpenBucketURL(ctx, u)
	if err != nil {
		return nil, fmt.Errorf("opening bucket: %w", err)
	}
	return b, nil
}
