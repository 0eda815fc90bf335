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
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

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
// binary without cgo, as the agent is).
func DropCapabilities() error {
	kept := make(map[int]bool, len(Capabilities))
	for _, c := range Capabilities {
		kept[c.Number] = true
	}
	last := unix.CAP_LAST_CAP
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = n
		}
	}
	for c := 0; c <= last; c++ {
		if kept[c] {
			continue
		}
		if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); e != 0 {
			return fmt.Errorf("dropping capability %d: %w", c, e)
		}
	}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0); e != 0 {
		return fmt.Errorf("clearing ambient capabilities: %w", e)
	}
	var mask [2]uint32
	for c := range kept {
		mask[c/32] |= 1 << (c % 32)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{
		{Effective: mask[0], Permitted: mask[0]},
		{Effective: mask[1], Permitted: mask[1]},
	}
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset: %w", e)
	}
	return nil
}

// MaskedPaths and ReadonlyPaths follow runc's defaults for Docker.
var MaskedPaths = []string{
	"/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
	"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
	"/proc/interrupts", "/sys/firmware", "/sys/devices/virtual/powercap",
}

var ReadonlyPaths = []string{
	"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
}

// MaskPaths hides MaskedPaths (an empty read-only tmpfs over a directory,
// /dev/null over a file) and makes ReadonlyPaths read-only, in the calling
// process's root; paths the kernel lacks are skipped.
func MaskPaths() error {
	for _, p := range MaskedPaths {
		fi, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("masking %s: %w", p, err)
		}
		if fi.IsDir() {
			err = unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0")
		} else {
			err = unix.Mount("/dev/null", p, "", unix.MS_BIND, "")
		}
		if err != nil {
			return fmt.Errorf("masking %s: %w", p, err)
		}
	}
	for _, p := range ReadonlyPaths {
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("binding %s: %w", p, err)
		}
		flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
		if err := unix.Mount(p, p, "", flags, ""); err != nil {
			return fmt.Errorf("read-only %s: %w", p, err)
		}
	}
	return nil
}

// Loopback brings lo up in the calling thread's network namespace: a
// sandbox's own namespace, or the vm's guest. In a namespace the node made,
// lo is up already and the sandbox could not change it.
func Loopback() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback flags: %w", err)
	}
	if ifr.Uint16()&unix.IFF_UP != 0 {
		return nil
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}

// Mountpoint returns root+target after making sure it exists as a directory
// (dir) or a file. Template layers normally provide mount points; making one
// here writes it into the sandbox's writable layer. Paths come from the
// node, not from the sandbox, and the root is not yet visible to any sandbox
// process, so plain path operations are safe here.
func Mountpoint(root, target string, dir bool) (string, error) {
	p := filepath.Join(root, target)
	if fi, err := os.Lstat(p); err == nil {
		if fi.IsDir() != dir || fi.Mode()&os.ModeSymlink != 0 {
			return "", fmt.Errorf("mountpoint %s has the wrong type", target)
		}
		return p, nil
	}
	if dir {
		return p, os.MkdirAll(p, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return "", err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return "", err
	}
	return p, f.Close()
}
