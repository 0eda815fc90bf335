package confine

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

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
