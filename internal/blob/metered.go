package blob

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/telemetry"
)

// Metered returns s counting its calls, their time and the bytes they move
// in the Prometheus metrics (telemetry.BlobOp): what the server's archive
// and vaults ask of the object store.
func Metered(s Store) Store { return metered{s} }

type metered struct{ Store }

// result is the result label of a call's err.
func result(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, errdefs.ErrNotFound):
		return "not_found"
	}
	return "error"
}

func (m metered) Put(ctx context.Context, key string, write func(io.Writer) error) error {
	start := time.Now()
	var n int64
	err := m.Store.Put(ctx, key, func(w io.Writer) error {
		return write(countingWriter{w, &n})
	})
	telemetry.BlobOp("put", start, result(err))
	if err == nil {
		telemetry.BlobBytes("put", n)
	}
	return err
}

func (m metered) Get(ctx context.Context, key string) (Object, error) {
	start := time.Now()
	o, err := m.Store.Get(ctx, key)
	telemetry.BlobOp("get", start, result(err))
	if err != nil {
		return nil, err
	}
	return &countingObject{Object: o}, nil
}

func (m metered) Delete(ctx context.Context, key string) error {
	start := time.Now()
	err := m.Store.Delete(ctx, key)
	telemetry.BlobOp("delete", start, result(err))
	return err
}

func (m metered) List(ctx context.Context, prefix string) ([]string, error) {
	start := time.Now()
	keys, err := m.Store.List(ctx, prefix)
	telemetry.BlobOp("list", start, result(err))
	return keys, err
}

type countingWriter struct {
	w io.Writer
	n *int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	*c.n += int64(n)
	return n, err
}

// countingObject counts what is read of an object, when it is closed.
type countingObject struct {
	Object
	n int64
}

func (o *countingObject) Read(p []byte) (int, error) {
	n, err := o.Object.Read(p)
	o.n += int64(n)
	return n, err
}

func (o *countingObject) Close() error {
	telemetry.BlobBytes("get", o.n)
	o.n = 0
	return o.Object.Close()
}
