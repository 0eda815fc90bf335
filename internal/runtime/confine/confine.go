// Package confine holds the steps that confine a sandbox's processes from
// the inside, shared by the runtimes so that each is defined once: Docker's
// default capability set (the ns init and the vm's guest init drop to it,
// the gvisor runtime asks runsc for it), runc's masked and read-only /proc
// and /sys paths, bringing loopback up, and making mount points in a root
// being built.
//
// gvisor takes the capability names only: its /proc and /sys are the
// sentry's own, and runsc does not apply an OCI spec's masked paths.
//
// The functions here run inside the sandbox, in the agent binary, so the
// package is a leaf: it imports nothing of atoll's.
package confine

import (
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// Capability is one Linux capability, by number and by the name OCI specs
// use.
type Capability struct {
	Number int
	Name   string
}

// Capabilities is Docker's default capability set: what root in a sandbox
// keeps.
var Capabilities = []Capability{
	{unix.CAP_CHOWN, "CAP_CHOWN"}, {unix.CAP_DAC_OVERRIDE, "CAP_DAC_OVERRIDE"},
	{unix.CAP_FOWNER, "CAP_FOWNER"}, {unix.CAP_FSETID, "CAP_FSETID"},
	{unix.CAP_KILL, "CAP_KILL"}, {unix.CAP_SETGID, "CAP_SETGID"},
	{unix.CAP_SETUID, "CAP_SETUID"}, {unix.CAP_SETPCAP, "CAP_SETPCAP"},
	{unix.CAP_NET_BIND_SERVICE, "CAP_NET_BIND_SERVICE"}, {unix.CAP_NET_RAW, "CAP_NET_RAW"},
	{unix.CAP_SYS_CHROOT, "CAP_SYS_CHROOT"}, {unix.CAP_MKNOD, "CAP_MKNOD"},
	{unix.CAP_AUDIT_WRITE, "CAP_AUDIT_WRITE"}, {unix.CAP_SETFCAP, "CAP_SETFCAP"},
}

// CapabilityNames are the names of Capabilities, for an OCI spec.
func CapabilityNames() []string {
	names := make([]string, len(Capabilities))
	for i, c := range Capabilities {
		names[i] = c.Name
	}
	return names
}

// DropCapabilities shrinks every thread's bounding, permitted, effective and
// inheritable sets to Capabilities and clears the ambient set: the caller
// and every process it starts hold at most those, and none can regain the
// others. Capabilities are per thread, hence AllThreadsSyscall (which needs a
// binary without cgo, as the agent is), one per capability dropped: where
// one thread starts every process, a Starter's DropCapabilities is cheaper.
func DropCapabilities() error {
	for c := 0; c <= lastCap(); c++ {
		if kept(c) {
			continue
		}
		if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); e != 0 {
			return fmt.Errorf("dropping capability %d: %w", c, e)
		}
	}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); e != 0 {
		return fmt.Errorf("clearing ambient capabilities: %w", e)
	}
	return capsetAllThreads()
}
