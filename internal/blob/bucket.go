package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	gblob "gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:// buckets
	_ "gocloud.dev/blob/s3blob"   // s3:// buckets
	"gocloud.dev/gcerrors"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Bucket is a Store in a bucket of gocloud.dev/blob: a local directory or
// an S3 bucket.
type Bucket struct {
	b *gblob.Bucket
}

var _ Store = (*Bucket)(nil)

// Open opens the bucket at rawURL, creating a file:// bucket's directory:
// through gocloud.dev/blob, file:///path (the default, a local directory)
// or s3://bucket for Amazon S3 and S3-compatible stores, e.g.
//
//	s3://archive?endpoint=http://127.0.0.1:9000&region=us-east-1&use_path_style=true
//
// An s3:// bucket takes its credentials from the AWS SDK's usual sources
// (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE and ~/.aws, an
// instance role); its query parameters are those of gocloud.dev/blob/s3blob's
// URLOpener. Any bucket takes prefix=dir/ to keep its objects under dir/.
//
// Open checks the URL, not the store: an unreachable store or a missing bucket
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
		//
		// Nor does it write a sidecar file of attributes beside an object:
		// that file is rewritten in place after the rename, so a reader
		// racing a Put of the same key could read it half written (the
		// suite's concurrent puts did), and nothing here reads attributes
		// but the size, which the file has. Sidecars of older versions'
		// objects are still read, and deleted with their objects.
		q := u.Query()
		for k, v := range map[string]string{"no_tmp_dir": "1", "metadata": "skip"} {
			if !q.Has(k) {
				q.Set(k, v)
			}
		}
		u.RawQuery = q.Encode()
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
	return &Bucket{b: b}, nil
}

// Put writes the object through a writer of its own context, cancelled if
// write fails: a cancelled writer's Close discards what was written.
//
// In a file bucket the object is a temporary file beside its key, renamed
// onto the key by Close (see Open); for a power cut to leave the object
// whole, that file is synced before the rename and its directory after.
// (An object store's write is durable when Close returns.)
func (b *Bucket) Put(ctx context.Context, key string, write func(io.Writer) error) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var f *os.File
	w, err := b.b.NewWriter(wctx, key, &gblob.WriterOptions{
		BeforeWrite: func(as func(any) bool) error { as(&f); return nil },
	})
	if err != nil {
		return kind(err, key)
	}
	abort := func(err error) error {
		cancel()
		w.Close()
		return err
	}
	if err := write(w); err != nil {
		return abort(err)
	}
	if f != nil {
		if err := f.Sync(); err != nil {
			return abort(err)
		}
	}
	if err := w.Close(); err != nil {
		return kind(err, key)
	}
	if f != nil {
		return syncDir(filepath.Dir(f.Name()))
	}
	return nil
}

// Get opens the object key.
func (b *Bucket) Get(ctx context.Context, key string) (Object, error) {
	if err := CheckKey(key); err != nil {
		return nil, err
	}
	r, err := b.b.NewReader(ctx, key, nil)
	if err != nil {
		return nil, kind(err, key)
	}
	return r, nil
}

// Delete removes the object key.
func (b *Bucket) Delete(ctx context.Context, key string) error {
	if err := CheckKey(key); err != nil {
		return err
	}
	return kind(b.b.Delete(ctx, key), key)
}

// List returns the keys that begin with prefix, sorted.
func (b *Bucket) List(ctx context.Context, prefix string) ([]string, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	it := b.b.List(&gblob.ListOptions{Prefix: prefix})
	var keys []string
	for {
		obj, err := it.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", prefix, err)
		}
		keys = append(keys, obj.Key)
	}
	slices.Sort(keys)
	return keys, nil
}

// Close closes the bucket.
func (b *Bucket) Close() error { return b.b.Close() }

// kind is err with the contract's kind: gocloud's NotFound is
// errdefs.ErrNotFound.
func kind(err error, key string) error {
	switch {
	case err == nil:
		return nil
	case gcerrors.Code(err) == gcerrors.NotFound:
		return fmt.Errorf("object %s: %w", key, errdefs.ErrNotFound)
	}
	return fmt.Errorf("object %s: %w", key, err)
}

// syncDir makes a directory's entries (a rename into it) durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err == nil {
		err = errors.Join(d.Sync(), d.Close())
	}
	return err
}
