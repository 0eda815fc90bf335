package network

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"
)

// InNetns runs fn on an OS thread that has joined the network namespace at
// path, and returns fn's error. Sockets that fn opens, netlink sockets
// included, stay in that namespace after InNetns returns; a child process
// that fn starts (exec.Cmd.Start) is born in it, which is how a sandbox
// process joins a pre-made namespace: see the package comment.
//
// fn runs on a goroutine of its own that is locked to its thread; if the
// thread cannot be returned to the namespace it came from, the thread is
// discarded instead of being reused.
func InNetns(path string, fn func() error) error {
	target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening network namespace: %w", err)
	}
	defer unix.Close(target)
	return inNetnsFd(target, fn)
}

func inNetnsFd(target int, fn func() error) error {
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
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("joining network namespace: %w", err)
			return
		}
		ferr := fn()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			// Leave the thread locked: the runtime ends it with this goroutine.
			errc <- errors.Join(ferr, fmt.Errorf("returning to own network namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// newNetns makes a network namespace, owned by the caller's user namespace,
// bind-mounted at path (which must not exist), and runs setup on a thread
// inside it before returning. The namespace lives until path is unmounted
// and nothing else holds it.
func newNetns(path string, setup func() error) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("creating namespace file: %w", err)
	}
	f.Close()
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
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("unsharing network namespace: %w", err)
			return
		}
		err = unix.Mount("/proc/thread-self/ns/net", path, "none", unix.MS_BIND, "")
		if err != nil {
			err = fmt.Errorf("mounting network namespace: %w", err)
		} else if setup != nil {
			err = setup()
		}
		if serr := unix.Setns(orig, unix.CLONE_NEWNET); serr != nil {
			errc <- errors.Join(err, fmt.Errorf("returning to own network namespace: %w", serr))
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	if err := <-errc; err != nil {
		removeNetns(path)
		return err
	}
	return nil
}

// removeNetns unmounts and removes a namespace made by newNetns; a path that
// is already gone is not an error.
func removeNetns(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmounting network namespace: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing network namespace file: %w", err)
	}
	return nil
}

// renameNetns moves the namespace mounted at from to to. A move (MS_MOVE) is
// not allowed under a shared mount such as the namespace directory, so the
// namespace is bound again at the new path and the old mount dropped.
func renameNetns(from, to string) error {
	f, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("creating namespace file: %w", err)
	}
	f.Close()
	if err := unix.Mount(from, to, "none", unix.MS_BIND, ""); err != nil {
		os.Remove(to)
		return fmt.Errorf("binding network namespace: %w", err)
	}
	return removeNetns(from)
}

// prepareNetnsDir makes dir a mount point with shared propagation, as
// iproute2 does for /run/netns, so that unmounting a namespace there also
// drops the copies that mount namespaces made since hold.
func prepareNetnsDir(dir string) error {
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

// isNetns reports whether path is a mounted network namespace.
func isNetns(path string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false
	}
	return st.Type == unix.NSFS_MAGIC
}

// writeSysctl sets a sysctl under /proc/sys of the calling thread's network
// namespace; name uses dots ("net.ipv4.ip_forward").
func writeSysctl(name, value string) error {
	p := filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/"))
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("setting %s: %w", name, err)
	}
	return nil
}

func readSysctl(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/")))
	return strings.TrimSpace(string(b)), err
}
