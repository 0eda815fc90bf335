// Package host holds what every runtime backend needs to know of the host's
// processes and mounts: killing and waiting for a process through a pidfd, a
// process's start time (which guards against PID reuse), the mounts under a
// directory, private mounts, erofs image mounts, pid files and the tails of
// logs for error messages.
package host

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// KillPID sends pid SIGKILL through a pidfd.
func KillPID(pid int) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
}

// KillAndWait kills pid and waits until it has exited.
func KillAndWait(pid int, timeout time.Duration) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		return err
	}
	_, err = WaitPidfd(fd, timeout)
	return err
}

// WaitPidfd waits up to timeout (0: not at all) for the process of pidfd
// fd to exit, and reports whether it has: a pidfd polls readable once its
// process is gone, a zombie or reaped.
func WaitPidfd(fd int, timeout time.Duration) (exited bool, err error) {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	deadline := time.Now().Add(timeout)
	for {
		n, err := unix.Poll(fds, max(0, int(time.Until(deadline).Milliseconds())))
		if !errors.Is(err, unix.EINTR) {
			return err == nil && n > 0, err
		}
	}
}

// StartTime reads field 22 of /proc/pid/stat; a zombie counts as gone.
func StartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, errors.New("malformed stat")
	}
	if f[0] == "Z" || f[0] == "X" {
		return 0, errors.New("process exited")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// Alive reports whether process pid is the one that started at start
// (StartTime's value): a PID the kernel has given to another process since
// is not.
func Alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	st, err := StartTime(pid)
	return err == nil && st == start
}

// RemoveDir unmounts every mountpoint at or below dir, deepest first,
// and removes dir: the end of a sandbox's run directory. It goes on past
// failures and returns them all.
func RemoveDir(dir string) error {
	if noMounts(dir) {
		return os.RemoveAll(dir)
	}
	var errs []error
	for _, m := range MountsUnder(dir) {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", m, err))
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// noMounts reports whether no file at or below dir is the root of a mount,
// asking each file (statx's STATX_ATTR_MOUNT_ROOT) rather than reading
// /proc/self/mountinfo: the node's mount table holds the staging mounts of
// every sandbox starting and the images of every layer, and printing it for
// each sandbox's cleanup cost more than the few files of its run directory.
// It answers false when it cannot tell (a kernel before 5.8).
func noMounts(dir string) bool {
	errMount := errors.New("a mount, or no telling")
	err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Statx_t
		if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, 0, &st); err != nil {
			return err
		}
		if st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 || st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0 {
			return errMount
		}
		return nil
	})
	return err == nil
}

// MountsUnder lists mountpoints at or below dir, deepest first.
func MountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountinfo(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ReadPID reads the process ID a runtime's child wrote to path.
func ReadPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("reading pid: %w", err)
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// Tail returns the last few KiB of the file at path, "" if it cannot be read.
func Tail(path string) string {
	b, _ := TailBytes(path, 4096)
	return string(b)
}

// TailBytes returns up to the last n bytes of the file at path.
func TailBytes(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		f.Seek(-n, io.SeekEnd)
	}
	return io.ReadAll(io.LimitReader(f, n))
}

// LastLine is the last non-empty line of out, for error messages.
func LastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// Remembered returns the answer probe gives for key, kept in file (in /run:
// until the host reboots) so that a node restart need not probe again; file
// "" keeps nothing. A failed probe is not kept.
func Remembered(file, key string, probe func() (string, error)) (string, error) {
	key += "\n"
	if file != "" {
		if b, err := os.ReadFile(file); err == nil {
			if v, ok := strings.CutPrefix(string(b), key); ok && v != "" {
				return v, nil
			}
		}
	}
	v, err := probe()
	if err != nil || file == "" || v == "" {
		return v, err
	}
	if os.MkdirAll(filepath.Dir(file), 0o700) == nil {
		tmp := file + ".tmp"
		if os.WriteFile(tmp, []byte(key+v), 0o600) == nil {
			_ = os.Rename(tmp, file)
		}
	}
	return v, nil
}

// PrivateMount makes dir a mount of its own with private propagation, so the
// mounts made under it never propagate to other mount namespaces, and a lazy
// unmount of dir takes them all.
func PrivateMount(dir string) error { return privateMount(dir, false) }

// PrivateTmpfs is PrivateMount for a runtime's state directory, which holds
// sockets, logs and mount points made and removed with each sandbox: a
// tmpfs, as /run is, when dir is empty and not a mount yet. (On ext4 every
// directory made and removed costs a journal's work, or, without a journal,
// a search for an inode not freed recently that grows with the directories
// removed before: 7% of the machine when sandboxes come and go in bulk.)
// A directory holding something, the state of sandboxes an earlier version
// started, stays where it is, bound on itself.
func PrivateTmpfs(dir string) error { return privateMount(dir, true) }

func privateMount(dir string, tmpfs bool) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	isMount := false
	for _, m := range MountsUnder(abs) {
		isMount = isMount || m == abs
	}
	if !isMount && tmpfs {
		if names, err := os.ReadDir(abs); err != nil || len(names) > 0 {
			tmpfs = false
		}
	}
	switch {
	case isMount:
	case tmpfs:
		if err := unix.Mount("tmpfs", abs, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0711"); err != nil {
			return fmt.Errorf("mounting a tmpfs on %s: %w", abs, err)
		}
	default:
		if err := unix.Mount(abs, abs, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mounting %s: %w", abs, err)
		}
	}
	if err := unix.Mount("", abs, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making %s private: %w", abs, err)
	}
	return nil
}

// InMountNamespace runs fn on an OS thread of its own in a new mount
// namespace, a slave of the caller's: the mounts fn makes are seen by fn and
// by the commands it starts, never by the host, and they go with the
// namespace when fn returns (its thread ends) or the process dies, whatever
// fn was doing. For mounts that live only while a command reads them.
func InMountNamespace(fn func() error) error {
	errc := make(chan error, 1)
	go inMountNamespace(fn, errc)
	return <-errc
}

func inMountNamespace(fn func() error, errc chan<- error) {
	// Never unlocked: the Go runtime ends the thread, and its namespace
	// with it, when this goroutine returns.
	goruntime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		// But it never ends the main thread (it parks it instead), and
		// the main thread's namespace is the one /proc/self shows: go
		// on from another thread, holding this one meanwhile so the new
		// goroutine cannot land on it.
		done := make(chan struct{})
		go func() { inMountNamespace(fn, errc); close(done) }()
		<-done
		goruntime.UnlockOSThread()
		return
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		errc <- fmt.Errorf("new mount namespace: %w", err)
		return
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		errc <- fmt.Errorf("new mount namespace: %w", err)
		return
	}
	errc <- fn()
}

// MountErofs mounts the erofs image at dir, read-only, nodev and nosuid:
// straight from the file where the kernel can (Linux 6.12), else through a
// loop device, which takes several times as long and a device per image.
func MountErofs(ctx context.Context, image, dir string) error {
	err := unix.Mount(image, dir, "erofs", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, "")
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.ENOTBLK) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("mounting %s: %w", image, err)
	}
	if out, err := exec.CommandContext(ctx, "mount", "-t", "erofs", "-o", "ro,loop,nodev,nosuid", image, dir).CombinedOutput(); err != nil {
		return fmt.Errorf("mounting %s: %w: %s", image, err, LastLine(out))
	}
	return nil
}
