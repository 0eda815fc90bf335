// Package blobtest is the conformance suite of the object store contract
// (blob.Store): every implementation runs Run from its own tests, so that
// the archive can use any of them alike.
package blobtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/internal/blob"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Open returns an empty store of the test's own, which the suite closes.
// Stores that share a server keep apart by a prefix of their own.
type Open func(t *testing.T) blob.Store

// Run runs the suite against the stores open returns.
func Run(t *testing.T, open Open) {
	for _, tc := range []struct {
		name string
		test func(t *testing.T, st blob.Store)
	}{
		{"PutGetDeleteList", testPutGetDeleteList},
		{"Overwrite", testOverwrite},
		{"FailedPut", testFailedPut},
		{"Large", testLarge},
		{"ConcurrentPuts", testConcurrentPuts},
		{"HostileKeys", testHostileKeys},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := open(t)
			t.Cleanup(func() { st.Close() })
			tc.test(t, st)
		})
	}
}

func put(t *testing.T, st blob.Store, key string, data []byte) {
	t.Helper()
	if err := st.Put(context.Background(), key, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	}); err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
}

// get returns the object key, or the error of opening or reading it.
func get(st blob.Store, key string) ([]byte, error) {
	r, err := st.Get(context.Background(), key)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err == nil && int64(len(b)) != r.Size() {
		err = fmt.Errorf("read %d bytes of an object of size %d", len(b), r.Size())
	}
	return b, err
}

func list(t *testing.T, st blob.Store, prefix string) []string {
	t.Helper()
	keys, err := st.List(context.Background(), prefix)
	if err != nil {
		t.Fatalf("list %q: %v", prefix, err)
	}
	return keys
}

func testPutGetDeleteList(t *testing.T, st blob.Store) {
	ctx := context.Background()
	objects := map[string][]byte{
		"sandboxes/b.tar": []byte("bee"),
		"sandboxes/a.tar": []byte("a"),
		"snapshots/a.tar": {},
		"top":             []byte("top"),
	}
	for k, v := range objects {
		put(t, st, k, v)
	}
	for k, v := range objects {
		if got, err := get(st, k); err != nil || !bytes.Equal(got, v) {
			t.Errorf("get %s: %q, %v; want %q", k, got, err, v)
		}
	}
	if diff := cmp.Diff([]string{"sandboxes/a.tar", "sandboxes/b.tar", "snapshots/a.tar", "top"}, list(t, st, "")); diff != "" {
		t.Errorf("list all (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"sandboxes/a.tar", "sandboxes/b.tar"}, list(t, st, "sandboxes/")); diff != "" {
		t.Errorf("list sandboxes/ (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"sandboxes/a.tar"}, list(t, st, "sandboxes/a.")); diff != "" {
		t.Errorf("list sandboxes/a. (-want +got):\n%s", diff)
	}
	if keys := list(t, st, "nothing/"); len(keys) != 0 {
		t.Errorf("list nothing/: %q", keys)
	}
	if err := st.Delete(ctx, "sandboxes/a.tar"); err != nil {
		t.Fatal(err)
	}
	if _, err := get(st, "sandboxes/a.tar"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("get a deleted key: %v, want not found", err)
	}
	if err := st.Delete(ctx, "sandboxes/a.tar"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("delete a deleted key: %v, want not found", err)
	}
	if _, err := get(st, "never/written"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("get a missing key: %v, want not found", err)
	}
	if got, err := get(st, "sandboxes/b.tar"); err != nil || string(got) != "bee" {
		t.Errorf("a neighbour of the deleted key: %q, %v", got, err)
	}
	// Keys that are odd but valid are kept as they are.
	for _, k := range []string{"a b/ü 日本/x.tar", "x.tar.123.tmp", "-", "a/..b/c..", strings.Repeat("k", 200)} {
		put(t, st, k, []byte(k))
		if got, err := get(st, k); err != nil || string(got) != k {
			t.Errorf("key %q: %q, %v", k, got, err)
		}
		if keys := list(t, st, k); len(keys) != 1 || keys[0] != k {
			t.Errorf("list %q: %q", k, keys)
		}
	}
}

func testOverwrite(t *testing.T, st blob.Store) {
	put(t, st, "k", []byte("a longer first version"))
	put(t, st, "k", []byte("second"))
	if got, err := get(st, "k"); err != nil || string(got) != "second" {
		t.Errorf("after overwrite: %q, %v", got, err)
	}
	if keys := list(t, st, ""); len(keys) != 1 {
		t.Errorf("after overwrite the store holds %q", keys)
	}
}

// testFailedPut: a Put whose writer fails, or whose context ends, leaves
// the key as it was: the old object, or none.
func testFailedPut(t *testing.T, st blob.Store) {
	put(t, st, "k", []byte("old"))
	boom := errors.New("boom")
	half := func(w io.Writer) error {
		if _, err := w.Write(bytes.Repeat([]byte("new"), 1000)); err != nil {
			return err
		}
		return boom
	}
	for _, key := range []string{"k", "fresh"} {
		if err := st.Put(context.Background(), key, half); !errors.Is(err, boom) {
			t.Errorf("put %s whose writer failed: %v, want its error", key, err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		err := st.Put(ctx, key, func(w io.Writer) error {
			w.Write([]byte("new"))
			cancel()
			return ctx.Err()
		})
		if err == nil {
			t.Errorf("put %s whose context ended: succeeded", key)
		}
	}
	if got, err := get(st, "k"); err != nil || string(got) != "old" {
		t.Errorf("after failed puts: %q, %v; want the old object", got, err)
	}
	if _, err := get(st, "fresh"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a new key after failed puts: %v, want not found", err)
	}
}

// A Put may hold up to putMemory bytes of an object in memory, whatever its
// size (the S3 SDK keeps 66 MiB of parts in flight), and largeSize is more:
// an object held whole shows. It is many S3 parts, for parts out of order
// to show too.
const (
	putMemory = 80 << 20
	largeSize = 96 << 20
)

// testLarge streams an object bigger than what the store may hold in
// memory, and reads it back streamed. The data is pseudo-random, so that
// parts out of order show.
func testLarge(t *testing.T, st blob.Store) {
	ctx := context.Background()
	// A low GC target keeps garbage from passing for held memory.
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		var ms runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak.Load() {
				peak.Store(ms.HeapAlloc)
			}
		}
	})
	want := sha256.New()
	err := st.Put(ctx, "large.tar", func(w io.Writer) error {
		src := rand.NewChaCha8([32]byte{1})
		_, err := io.CopyN(io.MultiWriter(w, want), src, largeSize)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	r, err := st.Get(ctx, "large.tar")
	if err != nil {
		t.Fatal(err)
	}
	got := sha256.New()
	n, err := io.Copy(got, r)
	r.Close()
	close(stop)
	wg.Wait()
	if err != nil || n != largeSize || r.Size() != largeSize {
		t.Fatalf("read %d bytes of size %d, %v; want %d", n, r.Size(), err, largeSize)
	}
	if !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Error("the object read back differs from what was written")
	}
	if grew := int64(peak.Load()) - int64(base); grew > putMemory {
		t.Errorf("the heap grew by %d MiB for an object of %d MiB: buffered, not streamed", grew>>20, largeSize>>20)
	} else {
		t.Logf("the heap grew by %d MiB for an object of %d MiB", grew>>20, largeSize>>20)
	}
}

// testConcurrentPuts: of puts racing to one key one wins whole, and a
// reader meanwhile never sees a mix of them.
func testConcurrentPuts(t *testing.T, st blob.Store) {
	const n, size = 6, 256 << 10
	var wg sync.WaitGroup
	done := make(chan struct{})
	check := func(b []byte) error {
		if len(b) != size || !bytes.Equal(b, bytes.Repeat(b[:1], size)) {
			return fmt.Errorf("an object of %d bytes, not one whole put", len(b))
		}
		return nil
	}
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			// A read may fail while puts race (gofakes3 then reports a
			// checksum mismatch, which the S3 SDK checks), but what it
			// returns is one whole put.
			if b, err := get(st, "k"); err == nil {
				if err := check(b); err != nil {
					t.Errorf("reading while puts race: %v", err)
					return
				}
			}
		}
	})
	var puts sync.WaitGroup
	for i := range n {
		puts.Go(func() {
			if err := st.Put(context.Background(), "k", func(w io.Writer) error {
				_, err := w.Write(bytes.Repeat([]byte{byte('a' + i)}, size))
				return err
			}); err != nil {
				t.Errorf("put %d: %v", i, err)
			}
		})
	}
	puts.Wait()
	close(done)
	wg.Wait()
	b, err := get(st, "k")
	if err == nil {
		err = check(b)
	}
	if err != nil {
		t.Errorf("after the race: %v", err)
	}
	if diff := cmp.Diff([]string{"k"}, list(t, st, "")); diff != "" {
		t.Errorf("what the race left (-want +got):\n%s", diff)
	}
}

// hostileKeys would name a place outside the store, or something other
// than what they say, if a store took them as given.
var hostileKeys = []string{
	"", "/etc/passwd", "../x", "a/../../x", "..", ".", "a/./b", "a//b", "a/", "/",
	"x\x00y", "a\\..\\b", "a\nb", "\xff\xfe", strings.Repeat("k", 1025),
}

func testHostileKeys(t *testing.T, st blob.Store) {
	ctx := context.Background()
	put(t, st, "x", []byte("x"))
	for _, k := range hostileKeys {
		err := st.Put(ctx, k, func(w io.Writer) error { _, err := w.Write([]byte("evil")); return err })
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("put %.40q: %v, want invalid", k, err)
		}
		if _, err := st.Get(ctx, k); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("get %.40q: %v, want invalid", k, err)
		}
		if err := st.Delete(ctx, k); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("delete %.40q: %v, want invalid", k, err)
		}
	}
	for _, p := range []string{"../", "/", "a/../", "x\x00"} {
		if _, err := st.List(ctx, p); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("list %q: %v, want invalid", p, err)
		}
	}
	if diff := cmp.Diff([]string{"x"}, list(t, st, "")); diff != "" {
		t.Errorf("the store after hostile keys (-want +got):\n%s", diff)
	}
}
