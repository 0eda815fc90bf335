// Package blob declares the object store that archived sandboxes and
// snapshots go to, and the contract every implementation keeps; Open opens
// one by URL (bucket.go): a local directory or S3. Each implementation
// proves itself with the conformance suite in blob/blobtest.
package blob

import (
	"context"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Store is the contract. Keys are slash-separated relative paths
// (CheckKey); a key of another shape is errdefs.ErrInvalid, before the
// store is touched, so that no key can name a place outside the store.
type Store interface {
	// Put writes the object key with what write writes, streamed (an
	// object of any size passes through in bounded memory), and replaces
	// an object of key atomically: a reader sees the old object whole or
	// the new one whole. It is durable when Put returns nil. If write or
	// the store fails, Put returns the error and key keeps what it held.
	// Of concurrent Puts to one key, one wins whole; a Get meanwhile may
	// fail, but never returns a mix.
	Put(ctx context.Context, key string, write func(io.Writer) error) error
	// Get opens the object key; errdefs.ErrNotFound if there is none.
	Get(ctx context.Context, key string) (Object, error)
	// Delete removes the object key; errdefs.ErrNotFound if there is none.
	Delete(ctx context.Context, key string) error
	// List returns the keys that begin with prefix, sorted. Besides the
	// objects Put wrote, it may show a store's own temporary objects
	// (a local directory's "<key>.<random>.tmp" of a Put cut short by a
	// crash), which Delete removes.
	List(ctx context.Context, prefix string) ([]string, error)
	Close() error
}

// Object is an object being read.
type Object interface {
	io.ReadCloser
	// Size is the object's length in bytes.
	Size() int64
}

// maxKey bounds a key's length: S3's limit.
const maxKey = 1024

// CheckKey returns errdefs.ErrInvalid unless key is a relative path of
// UTF-8 segments joined by "/", none empty, "." or "..", without NUL,
// control characters or backslashes, at most 1024 bytes long.
func CheckKey(key string) error {
	if key == "" || len(key) > maxKey || !utf8.ValidString(key) {
		return fmt.Errorf("%w: object key must be 1 to %d bytes of UTF-8", errdefs.ErrInvalid, maxKey)
	}
	for _, r := range key {
		if r < 0x20 || r == 0x7f || r == '\\' {
			return fmt.Errorf("%w: object key %q has a control character or backslash", errdefs.ErrInvalid, key)
		}
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("%w: object key %q is not a relative path of named parts", errdefs.ErrInvalid, key)
		}
	}
	return nil
}

// checkPrefix is CheckKey for List's prefix, which may be empty or end in
// "/" or a part's beginning.
func checkPrefix(prefix string) error {
	p := strings.TrimSuffix(prefix, "/")
	if p == "" && prefix != "/" {
		return nil
	}
	return CheckKey(p)
}
