//go:build !amd64

package spawn

import (
	"errors"
	"os/exec"
)

// haveFastStart says fastStart is there: only on amd64 (clone_amd64.go);
// elsewhere the helper starts processes with os/exec.
const haveFastStart = false

func fastStart(*exec.Cmd) (int, int, error) { return 0, -1, errors.New("spawn: no fast start") }

func reap(int) {}
