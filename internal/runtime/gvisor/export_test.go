package gvisor

import (
	"context"

	"github.com/atoll-dev/atoll/internal/runtime"
)

// ReleaseForTest makes sandbox id's agent let go of its socket, as a
// checkpoint does first.
func (r *Runtime) ReleaseForTest(ctx context.Context, id string, inst runtime.Instance) error {
	return r.release(ctx, id, inst)
}
