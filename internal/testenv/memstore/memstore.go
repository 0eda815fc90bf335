// Package memstore holds what the stand-ins for the server's services
// (sandboxes, snapshots, templates) share, which the CLI's and the SDK's
// tests drive through a real internal/server: Table, the in-memory table of
// records by ID or name, with the errors those services answer; and the
// reading of image archives and build contexts the template stand-ins do.
package memstore

import (
	"fmt"
	"sync"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Table is a mutex-guarded map of records of type T. Its methods are safe
// for concurrent use; the zero value is not usable, New makes one.
type Table[T any] struct {
	what string // names a record in errors: "sandbox", "template"

	mu sync.Mutex
	m  map[string]T
}

// New returns an empty table of records called what ("sandbox") in its
// errors.
func New[T any](what string) *Table[T] {
	return &Table[T]{what: what, m: map[string]T{}}
}

func (t *Table[T]) notFound(key string) error {
	return fmt.Errorf("%s %s: %w", t.what, key, errdefs.ErrNotFound)
}

// Get returns the record key, or an ErrNotFound.
func (t *Table[T]) Get(key string) (T, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.m[key]
	if !ok {
		return v, t.notFound(key)
	}
	return v, nil
}

// Has reports whether there is a record key.
func (t *Table[T]) Has(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.m[key]
	return ok
}

// Put stores v as the record key, over any there was.
func (t *Table[T]) Put(key string, v T) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.m[key] = v
}

// Insert stores the record mk returns for the table's size (from which
// fakes make IDs), in one step, and returns it.
func (t *Table[T]) Insert(mk func(n int) (string, T)) T {
	t.mu.Lock()
	defer t.mu.Unlock()
	key, v := mk(len(t.m))
	t.m[key] = v
	return v
}

// List returns the records keep accepts, all of them if keep is nil, in
// no order.
func (t *Table[T]) List(keep func(T) bool) []T {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []T
	for _, v := range t.m {
		if keep == nil || keep(v) {
			out = append(out, v)
		}
	}
	return out
}

// Update changes the record key through f, under the table's lock, and
// returns it as f left it. An error from f leaves the record as it was and
// is returned with it; a missing record is an ErrNotFound.
func (t *Table[T]) Update(key string, f func(*T) error) (T, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.m[key]
	if !ok {
		return v, t.notFound(key)
	}
	if err := f(&v); err != nil {
		return t.m[key], err
	}
	t.m[key] = v
	return v, nil
}

// Delete removes the record key and returns it, or an ErrNotFound. check,
// if not nil, may refuse with an error, under the table's lock.
func (t *Table[T]) Delete(key string, check func(T) error) (T, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.m[key]
	if !ok {
		return v, t.notFound(key)
	}
	if check != nil {
		if err := check(v); err != nil {
			return v, err
		}
	}
	delete(t.m, key)
	return v, nil
}
