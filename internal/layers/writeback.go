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

// A snapshot waits for the data its subvolume holds only in memory to reach
// the disk, and the sandbox stays frozen meanwhile (see docs/lifecycle.md). So
// that this costs the same however recently a sandbox wrote, the store bounds
// the layer filesystem's dirty data:
//
//   - its backing device info (bdi) gets a strict limit of DirtyLimit bytes:
//     the kernel starts writeback early and throttles writers at that level
//     instead of letting them fill a share of all memory first;
//   - a loop device under it does direct I/O, so what btrfs writes back goes
//     to the disk at once instead of into the image file's page cache, which
//     every btrfs commit would flush again (a commit's cache flush is an
//     fsync of the whole image file).

// DefaultDirtyLimit is the dirty data the layer filesystem may hold, all
// sandboxes together: at the disk's speed, what a snapshot then flushes
// takes milliseconds.
const DefaultDirtyLimit = 16 << 20

const btrfsIocFsInfo = 0x8400941f // _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args)

// btrfsFsInfoArgs is struct btrfs_ioctl_fs_info_args (1024 bytes).
type btrfsFsInfoArgs struct {
	MaxID          uint64
	NumDevices     uint64
	Fsid           [16]byte
	Nodesize       uint32
	Sectorsize     uint32
	CloneAlignment uint32
	CsumType       uint16
	CsumSize       uint16
	Flags          uint64
	Generation     uint64
	MetadataUUID   [16]byte
	Reserved       [944]byte
}

// btrfsSysfs is /sys/fs/btrfs/<fsid> of the filesystem holding dir.
func btrfsSysfs(dir string) (string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var a btrfsFsInfoArgs
	if err := ioctl(f.Fd(), btrfsIocFsInfo, unsafe.Pointer(&a)); err != nil {
		return "", fmt.Errorf("reading btrfs fs info: %w", err)
	}
	u := a.Fsid
	return fmt.Sprintf("/sys/fs/btrfs/%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]), nil
}

// boundWriteback applies the dirty data limit to the btrfs filesystem
// holding dir, and direct I/O to the loop devices it sits on. Both are
// settings of the running kernel, not of the image, so Open applies them on
// every start, to an image it mounted or one a previous server left mounted.
func boundWriteback(dir string, limit int64) error {
	fs, err := btrfsSysfs(dir)
	if err != nil {
		return err
	}
	bdi := filepath.Join(fs, "bdi")
	// max_bytes first: with strict_limit alone the bdi's share of the
	// global limit would apply, which is large.
	if err := os.WriteFile(filepath.Join(bdi, "max_bytes"), []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
		return fmt.Errorf("limiting dirty data: %w", err)
	}
	if err := os.WriteFile(filepath.Join(bdi, "strict_limit"), []byte("1"), 0); err != nil {
		return fmt.Errorf("limiting dirty data: %w", err)
	}
	devs, err := os.ReadDir(filepath.Join(fs, "devices"))
	if err != nil {
		return err
	}
	for _, d := range devs {
		if !strings.HasPrefix(d.Name(), "loop") {
			continue
		}
		if err := loopDirectIO(filepath.Join("/dev", d.Name())); err != nil {
			return err
		}
	}
	return nil
}

// loopDirectIO switches the loop device dev to direct I/O on its backing
// file; the kernel allows it while the device is in use.
func loopDirectIO(dev string) error {
	f, err := os.Open(dev)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), unix.LOOP_SET_DIRECT_IO, 1); err != nil {
		return fmt.Errorf("direct I/O on %s: %w", filepath.Base(dev), err)
	}
	return nil
}

// FlushWritable writes what the layer filesystem holds in memory to the
// disk. Called before a sandbox is frozen for a snapshot, it leaves the
// frozen snapshot only what was written since.
func (s *Store) FlushWritable(sandboxID string) error {
	f, err := os.Open(s.WritableDir(sandboxID))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer f.Close()
	// syncfs, not fsync: btrfs has no cheaper call that takes one
	// subvolume's delalloc to disk, and what syncfs writes beyond this
	// subvolume is bounded by the dirty limit too.
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("flushing writable layer: %w", err)
	}
	return nil
}
