package confine

import (
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A Starter is one OS thread that starts every process of a sandbox. The
// capability bounding set is per thread and a child inherits the one of the
// thread that forked it, so dropping it on this thread alone bounds every
// process the sandbox will ever run: 27 plain prctl calls, where dropping it
// on every thread takes an AllThreadsSyscall (a stop of the Go world and a
// signal to each thread) per capability, the largest item of a sandbox's
// start in user space. The permitted, effective and inheritable sets still
// shrink on every thread (one AllThreadsSyscall), so none of the agent's
// threads holds more than Capabilities; the agent starts every process
// through Do. The init stage serves it on the process's main thread, the one
// /proc/<pid>/status describes.
type Starter struct {
	fns  chan func()
	stop chan struct{}
}

// NewStarter makes a starter; Serve runs it.
func NewStarter() *Starter {
	return &Starter{fns: make(chan func()), stop: make(chan struct{})}
}

// Serve locks the calling goroutine to its thread for good (the thread's
// credentials are its own from here) and runs what Do is given on it, until
// Stop.
func (s *Starter) Serve() {
	goruntime.LockOSThread()
	for {
		select {
		case f := <-s.fns:
			f()
		case <-s.stop:
			return
		}
	}
}

// Stop ends Serve; the process is about to exit. A Do after it waits for
// good (the exit), rather than run its function elsewhere.
func (s *Starter) Stop() { close(s.stop) }

// Do runs f on the starter's thread and returns when it has.
func (s *Starter) Do(f func()) {
	done := make(chan struct{})
	s.fns <- func() {
		defer close(done)
		f()
	}
	<-done
}

// DropCapabilities drops the bounding set to Capabilities on the starter's
// thread, clears its ambient set, and shrinks the permitted, effective and
// inheritable sets of every thread to Capabilities (which also empties every
// thread's ambient set: the kernel keeps only ambient capabilities both
// permitted and inheritable). What the starter starts holds at most
// Capabilities and can regain none of the others, as with the package's
// DropCapabilities.
func (s *Starter) DropCapabilities() error {
	var err error
	s.Do(func() {
		// Up to the first number the kernel does not know (EINVAL):
		// reading cap_last_cap in a new network namespace's /proc/sys
		// cost more than the drops.
		for c := 0; c < 64; c++ {
			if kept(c) {
				continue
			}
			e := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
			if e == unix.EINVAL && c > unix.CAP_AUDIT_READ { // every kernel with id-mapped mounts knows the ones before
				break
			}
			if e != nil {
				err = fmt.Errorf("dropping capability %d: %w", c, e)
				return
			}
		}
		if e := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); e != nil {
			err = fmt.Errorf("clearing ambient capabilities: %w", e)
		}
	})
	if err != nil {
		return err
	}
	return capsetAllThreads()
}

// kept reports whether capability c is in Capabilities.
func kept(c int) bool {
	for _, k := range Capabilities {
		if k.Number == c {
			return true
		}
	}
	return false
}

// lastCap is the highest capability the running kernel knows.
func lastCap() int {
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			return n
		}
	}
	return unix.CAP_LAST_CAP
}

// capsetAllThreads sets every thread's permitted and effective sets to
// Capabilities and its inheritable set to none.
func capsetAllThreads() error {
	var mask [2]uint32
	for _, c := range Capabilities {
		mask[c.Number/32] |= 1 << (c.Number % 32)
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
