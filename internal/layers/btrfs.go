package layers

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Writable layers are btrfs subvolumes under a qgroup limit: the limit is the
// sandbox's disk quota (writes past it fail with EDQUOT inside the sandbox), and
// subvolumes can later be snapshotted without copying data. These are the few
// btrfs ioctls atoll needs, from linux/btrfs.h.

const (
	btrfsIocSubvolCreate = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	btrfsIocSnapDestroy  = 0x5000940f // _IOW(0x94, 15, struct btrfs_ioctl_vol_args)
	btrfsIocQuotaCtl     = 0xc0109428 // _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args)
	btrfsIocQgroupLimit  = 0x8030942b // _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)

	btrfsQuotaCtlEnable  = 1
	btrfsQgroupLimitRfer = 1 // BTRFS_QGROUP_LIMIT_MAX_RFER
	btrfsSuperMagic      = 0x9123683e
)

type btrfsVolArgs struct {
	Fd   int64
	Name [4088]byte
}

type btrfsQuotaCtlArgs struct {
	Cmd    uint64
	Status uint64
}

type btrfsQgroupLimitArgs struct {
	Qgroupid uint64
	Flags    uint64
	MaxRfer  uint64
	MaxExcl  uint64
	RsvRfer  uint64
	RsvExcl  uint64
}

func ioctl(fd uintptr, req uintptr, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, fd, req, uintptr(arg)); e != 0 {
		return e
	}
	return nil
}

func isBtrfs(dir string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, err
	}
	return st.Type == btrfsSuperMagic, nil
}

// enableQuota turns on btrfs quota groups for the filesystem holding dir; it is
// a no-op when they are on.
func enableQuota(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	args := btrfsQuotaCtlArgs{Cmd: btrfsQuotaCtlEnable}
	if err := ioctl(f.Fd(), btrfsIocQuotaCtl, unsafe.Pointer(&args)); err != nil {
		return fmt.Errorf("enabling btrfs quota: %w", err)
	}
	return nil
}

func volArgs(name string) (*btrfsVolArgs, error) {
	a := &btrfsVolArgs{}
	if len(name) >= len(a.Name) || name == "" {
		return nil, fmt.Errorf("bad subvolume name %q", name)
	}
	copy(a.Name[:], name)
	return a, nil
}

// createSubvolume makes path a new, empty btrfs subvolume.
func createSubvolume(path string) error {
	err := subvolumeIoctl(path, btrfsIocSubvolCreate)
	if errors.Is(err, unix.EEXIST) {
		return os.ErrExist
	}
	if err != nil {
		return fmt.Errorf("creating subvolume %s: %w", filepath.Base(path), err)
	}
	return nil
}

// deleteSubvolume removes the subvolume at path with everything in it.
func deleteSubvolume(path string) error {
	err := subvolumeIoctl(path, btrfsIocSnapDestroy)
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("deleting subvolume %s: %w", filepath.Base(path), err)
	}
	return nil
}

// subvolumeIoctl runs a vol_args ioctl naming path on path's parent directory.
func subvolumeIoctl(path string, req uintptr) error {
	parent, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer parent.Close()
	a, err := volArgs(filepath.Base(path))
	if err != nil {
		return err
	}
	return ioctl(parent.Fd(), req, unsafe.Pointer(a))
}

// limitSubvolume caps the bytes the subvolume at path refers to; 0 lifts the cap.
func limitSubvolume(path string, bytes uint64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	// Qgroupid 0 means the subvolume of the open file.
	args := btrfsQgroupLimitArgs{Flags: btrfsQgroupLimitRfer, MaxRfer: bytes}
	if bytes == 0 {
		args.Flags, args.MaxRfer = btrfsQgroupLimitRfer, ^uint64(0)
	}
	if err := ioctl(f.Fd(), btrfsIocQgroupLimit, unsafe.Pointer(&args)); err != nil {
		return fmt.Errorf("limiting subvolume: %w", err)
	}
	return nil
}

const (
	btrfsIocSnapCreateV2  = 0x50009417 // _IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2)
	btrfsIocSubvolSetflag = 0x4008941a // _IOW(0x94, 26, __u64)
	btrfsSubvolRdonly     = 1 << 1
)

// setReadOnly makes the subvolume at path read-only.
func setReadOnly(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	flags := uint64(btrfsSubvolRdonly)
	if err := ioctl(f.Fd(), btrfsIocSubvolSetflag, unsafe.Pointer(&flags)); err != nil {
		return fmt.Errorf("making %s read-only: %w", filepath.Base(path), err)
	}
	return nil
}

// btrfsVolArgsV2 is struct btrfs_ioctl_vol_args_v2 (4096 bytes).
type btrfsVolArgsV2 struct {
	Fd      int64
	Transid uint64
	Flags   uint64
	Unused  [4]uint64
	Name    [4040]byte
}

// snapshotSubvolume makes dst a snapshot of the subvolume src: no data is
// copied, whatever src holds. A read-only snapshot cannot change afterwards.
func snapshotSubvolume(src, dst string, readOnly bool) error {
	s, err := os.Open(src)
	if err != nil {
		return err
	}
	defer s.Close()
	parent, err := os.Open(filepath.Dir(dst))
	if err != nil {
		return err
	}
	defer parent.Close()
	a := &btrfsVolArgsV2{Fd: int64(s.Fd())}
	name := filepath.Base(dst)
	if len(name) >= len(a.Name) {
		return fmt.Errorf("bad snapshot name %q", name)
	}
	copy(a.Name[:], name)
	if readOnly {
		a.Flags = btrfsSubvolRdonly
	}
	if err := ioctl(parent.Fd(), btrfsIocSnapCreateV2, unsafe.Pointer(a)); err != nil {
		return fmt.Errorf("snapshotting %s: %w", filepath.Base(src), err)
	}
	return nil
}

const (
	btrfsIocInoLookup = 0xd0009412 // _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)
	// btrfsFirstFreeObjectid is the inode of every subvolume's root.
	btrfsFirstFreeObjectid = 256
)

type btrfsInoLookupArgs struct {
	Treeid   uint64
	Objectid uint64
	Name     [4080]byte
}

// WritableUsage is what sandbox id's writable layer refers to and its
// quota (0: none), in bytes, as its btrfs quota group counts them: the
// limit the quota enforces is on the same figure. btrfs brings the count
// up to date at each transaction commit, so it can lag writes by the
// commit interval (30 s by default).
func (s *Store) WritableUsage(id string) (used, quota int64, err error) {
	return subvolumeUsage(s.WritableDir(id))
}

// SnapshotUsage is what snapshot id refers to, in bytes, as its btrfs
// quota group counts it (see WritableUsage).
func (s *Store) SnapshotUsage(id string) (int64, error) {
	used, _, err := subvolumeUsage(s.snapshotDir(id))
	return used, err
}

// subvolumeUsage reads the level-0 quota group of the subvolume at w.
func subvolumeUsage(w string) (used, quota int64, err error) {
	f, err := os.Open(w)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	// The subvolume's ID, which names its level-0 quota group.
	look := btrfsInoLookupArgs{Objectid: btrfsFirstFreeObjectid}
	if err := ioctl(f.Fd(), btrfsIocInoLookup, unsafe.Pointer(&look)); err != nil {
		return 0, 0, fmt.Errorf("finding the subvolume: %w", err)
	}
	fs, err := btrfsSysfs(w)
	if err != nil {
		return 0, 0, err
	}
	dir := filepath.Join(fs, "qgroups", fmt.Sprintf("0_%d", look.Treeid))
	read := func(name string) (int64, error) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return 0, err
		}
		v := strings.TrimSpace(string(b))
		if v == "none" {
			return 0, nil
		}
		return strconv.ParseInt(v, 10, 64)
	}
	if used, err = read("referenced"); err != nil {
		return 0, 0, fmt.Errorf("reading the quota group: %w", err)
	}
	if quota, err = read("max_referenced"); err != nil {
		return 0, 0, fmt.Errorf("reading the quota group: %w", err)
	}
	return used, quota, nil
}
