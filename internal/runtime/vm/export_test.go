package vm

import (
	"os"

	"github.com/atoll-dev/atoll/internal/runtime/vm/vminit"
)

// What the benchmarks' peer, QEMU alone, needs to boot as the runtime does.

// BootKernel is the kernel QEMU boots.
func (r *Runtime) BootKernel() string {
	_ = r.setup()
	return r.kernel
}

// WriteTrivialInitrd writes an initramfs holding only the agent binary at
// the path the kernel runs, which, given nothing to serve, exits at once.
func (r *Runtime) WriteTrivialInitrd(path, agentPath string) error {
	b, err := os.ReadFile(agentPath)
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := newCpio(f)
	w.file(vminit.AgentPath[1:], 0o755, b)
	w.close()
	return nil
}

// PeerArgs is the runtime's machine with one serial console and no devices.
func (r *Runtime) PeerArgs(kernel, initrd, accel string) []string {
	return append(r.machineArgs(accel, 1, memoryMB(256<<20), initrd, ""), "-display", "none", "-serial", "stdio")
}
