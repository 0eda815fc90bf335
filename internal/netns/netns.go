// Package netns enters and makes network namespaces that are bound at
// paths. A thread joins one to run a function (Run): that is how a runtime
// starts a sandbox's first process in the namespace package network made for
// it, and how network configures the namespace from outside. The package is
// a leaf, so that the runtimes need not import network (nftables, DNS,
// proxies) to join a namespace.
package netns

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Run runs fn on an OS thread that has joined the network namespace at
// path, and returns fn's error. Sockets that fn opens, netlink sockets
// included, stay in that namespace after Run returns; a child process
// that fn starts (exec.Cmd.Start) is born in it, which is how a sandbox
// process joins a pre-made namespace (see package network).
//
// fn runs on a goroutine of its own that is locked to its thread; if the
// thread cannot be returned to the namespace it came from, the thread is
// discarded instead of being reused.
func Run(path string, fn func() error) error {
	target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening network namespace: %w", err)
	}
	defer unix.Close(target)
	return RunFd(target, fn)
}

// RunFd is Run for a namespace already open as target.
func RunFd(target int, fn func() error) error {
	return elsewhere(func() error {
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("joining network namespace: %w", err)
		}
		return nil
	}, fn)
}

// Create makes a network namespace, owned by the caller's user namespace,
// bind-mounted at path (which must not exist), and runs setup on a thread
// inside it before returning. The namespace lives until path is unmounted
// and nothing else holds it.
func Create(path string, setup func() error) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("creating namespace file: %w", err)
	}
	f.Close()
	err = elsewhere(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unsharing network namespace: %w", err)
		}
		return nil
	}, func() error {
		if err := unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("mounting network namespace: %w", err)
		}
		if setup != nil {
			return setup()
		}
		return nil
	})
	if err != nil {
		Remove(path)
		return err
	}
	return nil
}

// Temp makes a network namespace held only by the returned file
// descriptor: it goes when the caller closes that.
func Temp() (int, error) {
	fd := -1
	err := elsewhere(func() error { return unix.Unshare(unix.CLONE_NEWNET) }, func() (err error) {
		fd, err = unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, err
	}
	return fd, nil
}

// elsewhere runs fn on a goroutine locked to its thread after enter has
// moved that thread into another network namespace, then moves the thread
// back to the one it came from. If it cannot go back, the thread stays
// locked, so that the Go runtime ends it with the goroutine instead of
// reusing it.
func elsewhere(enter, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("opening own network namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := enter(); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		ferr := fn()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("returning to own network namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Remove unmounts and removes a namespace made by Create; a path that
// is already gone is not an error.
func Remove(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting network namespace: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing network namespace file: %w", err)
	}
	return nil
}

// Rename moves the namespace mounted at from to to. A move (MS_MOVE) is
// not allowed under a shared mount such as the namespace directory, so the
// namespace is bound again at the new path and the old mount dropped.
func Rename(from, to string) error {
	f, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("creating namespace file: %w", err)
	}
	f.Close()
	if err := unix.Mount(from, to, "none", unix.MS_BIND, ""); err != nil {
		os.Remove(to)
		return fmt.Errorf("binding network namespace: %w", err)
	}
	return Remove(from)
}

// PrepareDir makes dir a mount point with shared propagation, as
// iproute2 does for /run/netns, so that unmounting a namespace there also
// drops the copies that mount namespaces made since hold.
func PrepareDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) {
		if err := unix.Mount(dir, dir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("binding namespace directory: %w", err)
		}
		err = unix.Mount("", dir, "none", unix.MS_SHARED|unix.MS_REC, "")
	}
	if err != nil {
		return fmt.Errorf("sharing namespace directory: %w", err)
	}
	return nil
}

// Mounted reports whether path is a mounted network namespace.
func Mounted(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}
