// Package overlay mounts overlay file systems of many lower layers.
//
// mount(2) takes an overlay's options as one page, so with the layers'
// paths in "lowerdir=" a stack of some 80 layers (fewer, with longer paths)
// no longer fits, and the kernel sees a truncated path. The new mount API
// (fsopen, fsconfig, fsmount) takes each lower layer as a "lowerdir+" of its
// own (Linux 6.8), up to the overlay's own limit of MaxLayers; on an older
// kernel Mount falls back to mount(2) and its page.
package overlay

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// MaxLayers is the most lower layers an overlay stacks (the kernel's
// OVL_MAX_STACK).
const MaxLayers = 500

// Options are what Mount makes of an overlay.
type Options struct {
	Lower       []string // lower layers, top first
	Upper, Work string   // both empty for a read-only overlay
	// UserXattr: whiteouts and opaque directories are user.overlay.*
	// extended attributes (a user namespace's overlay, and the layer
	// store's), not trusted.overlay.* ones.
	UserXattr bool
	// Xino: every file gets an inode number of its own when the layers
	// are on file systems of their own (package lowers says why).
	Xino bool
	// NoDev, NoSuid, ReadOnly are the mount's flags.
	NoDev, NoSuid, ReadOnly bool
	// Volatile: the overlay never syncs its upper layer's file system, not
	// for an fsync or syncfs through it and not when it is unmounted
	// (overlayfs's "volatile"). Without it the last unmount of a writable
	// overlay syncs the whole file system the upper is on: for a sandbox's
	// writable layer on the shared layer store, a transaction commit, and
	// every other sandbox's dirty data written out, on each delete. The
	// kernel marks a volatile work directory so that it is not mounted
	// again (a crash may have lost what was never synced); Mount removes
	// the mark of an earlier volatile mount, its caller having accepted that.
	Volatile bool
}

// volatileMark is where the kernel marks the work directory of a volatile
// overlay, under Options.Work.
const volatileMark = "work/incompat/volatile"

// Mount mounts an overlay of o at target.
func Mount(target string, o Options) error {
	if len(o.Lower) == 0 {
		return errors.New("an overlay needs a lower layer")
	}
	if len(o.Lower) > MaxLayers {
		return fmt.Errorf("%d layers: an overlay stacks at most %d", len(o.Lower), MaxLayers)
	}
	if err := clearVolatileMark(o); err != nil {
		return err
	}
	err := mountNew(target, o)
	if errors.Is(err, errNoNewAPI) {
		return mountOld(target, o)
	}
	return err
}

// clearVolatileMark removes the mark of an earlier volatile mount from the
// work directory of o, if o is volatile.
func clearVolatileMark(o Options) error {
	if !o.Volatile || o.Upper == "" {
		return nil
	}
	if err := os.RemoveAll(filepath.Join(o.Work, volatileMark)); err != nil {
		return fmt.Errorf("removing the mark of an earlier volatile overlay: %w", err)
	}
	return nil
}

// errNoNewAPI is mountNew's error when the kernel lacks fsopen or takes no
// "lowerdir+".
var errNoNewAPI = errors.New("the kernel's overlay takes no lowerdir+")

func mountNew(target string, o Options) error {
	fd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if errors.Is(err, unix.ENOSYS) {
		return errNoNewAPI
	}
	if err != nil {
		return fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fd)
	for i, l := range o.Lower {
		if err := unix.FsconfigSetString(fd, "lowerdir+", l); err != nil {
			msg := fsLog(fd)
			if i == 0 && errors.Is(err, unix.EINVAL) && strings.Contains(msg, "Unknown parameter") {
				return errNoNewAPI
			}
			if msg != "" {
				msg = " (" + msg + ")"
			}
			return fmt.Errorf("overlay lower layer %s: %w%s", l, err, msg)
		}
	}
	set := func(key, value string) error {
		if err := unix.FsconfigSetString(fd, key, value); err != nil {
			return fmt.Errorf("overlay %s=%s: %w%s", key, value, err, logSuffix(fd))
		}
		return nil
	}
	if o.Upper != "" {
		if err := set("upperdir", o.Upper); err != nil {
			return err
		}
		if err := set("workdir", o.Work); err != nil {
			return err
		}
	}
	if o.Volatile && o.Upper != "" {
		if err := unix.FsconfigSetFlag(fd, "volatile"); err != nil {
			return fmt.Errorf("overlay volatile: %w%s", err, logSuffix(fd))
		}
	}
	if o.Xino {
		if err := set("xino", "on"); err != nil {
			return err
		}
	}
	if o.UserXattr {
		if err := unix.FsconfigSetFlag(fd, "userxattr"); err != nil {
			return fmt.Errorf("overlay userxattr: %w%s", err, logSuffix(fd))
		}
	}
	if err := unix.FsconfigCreate(fd); err != nil {
		return fmt.Errorf("creating the overlay: %w%s", err, logSuffix(fd))
	}
	attrs, _ := o.flags()
	mfd, err := unix.Fsmount(fd, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return fmt.Errorf("fsmount overlay: %w", err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mounting the overlay at %s: %w", target, err)
	}
	return nil
}

// mountOld is mount(2), its options in one page.
func mountOld(target string, o Options) error {
	opts := "lowerdir=" + strings.Join(o.Lower, ":")
	if o.Upper != "" {
		opts += ",upperdir=" + o.Upper + ",workdir=" + o.Work
	}
	if o.UserXattr {
		opts += ",userxattr"
	}
	if o.Xino {
		opts += ",xino=on"
	}
	if o.Volatile && o.Upper != "" {
		opts += ",volatile"
	}
	if len(opts) >= unix.Getpagesize() {
		return fmt.Errorf("%d lower layers: their paths pass the one page of mount options an overlay takes on this kernel (before Linux 6.8)", len(o.Lower))
	}
	_, flags := o.flags()
	if err := unix.Mount("overlay", target, "overlay", flags, opts); err != nil {
		return fmt.Errorf("mounting the overlay at %s: %w", target, err)
	}
	return nil
}

// flags are o's mount flags for fsmount(2) and for mount(2).
func (o Options) flags() (attrs int, ms uintptr) {
	for _, f := range []struct {
		on   bool
		attr int
		flag uintptr
	}{
		{o.NoDev, unix.MOUNT_ATTR_NODEV, unix.MS_NODEV},
		{o.NoSuid, unix.MOUNT_ATTR_NOSUID, unix.MS_NOSUID},
		{o.ReadOnly, unix.MOUNT_ATTR_RDONLY, unix.MS_RDONLY},
	} {
		if f.on {
			attrs |= f.attr
			ms |= f.flag
		}
	}
	return attrs, ms
}

// fsLog reads the messages the kernel left on an fs context.
func fsLog(fd int) string {
	var msgs []string
	buf := make([]byte, 4096)
	for {
		n, err := unix.Read(fd, buf)
		if err != nil || n <= 0 {
			return strings.Join(msgs, "; ")
		}
		msgs = append(msgs, strings.TrimSpace(string(buf[:n])))
	}
}

func logSuffix(fd int) string {
	if s := fsLog(fd); s != "" {
		return " (" + s + ")"
	}
	return ""
}
