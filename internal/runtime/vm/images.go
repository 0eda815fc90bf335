package vm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/runtime/host"
	"github.com/atoll-dev/atoll/internal/runtime/overlay"
	"github.com/atoll-dev/atoll/internal/runtime/vm/vminit"
)

// guestModules are the modules the guest needs; what each depends on is
// read from the kernel's own modules.dep (moduleOrder), so that a kernel
// package that splits or regroups them still loads in order. crc32c_generic
// is named because ext4 and jbd2 find it through the crypto API, which
// modules.dep does not record. A module the kernel has built in is not in
// modules.dep and needs no loading.
var guestModules = []string{
	"virtio_mmio", "virtio_blk", "virtio_console", "virtio_net",
	"crc32c_generic", "ext4", "erofs", "overlay",
}

// moduleOrder returns the modules.dep paths of want and of everything they
// depend on, each after its dependencies. Names match with - and _ alike
// and whatever the file's compression suffix, as modprobe matches them.
func moduleOrder(dep []byte, want []string) []string {
	deps := map[string][]string{} // module name → its modules.dep line's paths
	path := map[string]string{}
	for _, l := range strings.Split(string(dep), "\n") {
		p, rest, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		n := moduleName(p)
		path[n] = p
		deps[n] = strings.Fields(rest)
	}
	var order []string
	seen := map[string]bool{}
	var visit func(n string)
	visit = func(n string) {
		if seen[n] {
			return
		}
		seen[n] = true
		p, ok := path[n]
		if !ok {
			return // built in, or absent: the guest says which when it fails
		}
		for _, d := range deps[n] {
			visit(moduleName(d))
		}
		order = append(order, p)
	}
	for _, n := range want {
		visit(moduleName(n))
	}
	return order
}

// moduleName is a module's name as the kernel knows it: the file's base
// name without .ko and a compression suffix, - read as _.
func moduleName(p string) string {
	n := filepath.Base(p)
	if i := strings.Index(n, ".ko"); i >= 0 {
		n = n[:i]
	}
	return strings.ReplaceAll(n, "-", "_")
}

// findKernel returns the newest /boot/vmlinuz-* and its modules directory.
func findKernel() (kernel, modules string, err error) {
	m, _ := filepath.Glob("/boot/vmlinuz-*")
	var best string
	var bestTime time.Time
	for _, k := range m {
		fi, err := os.Stat(k)
		if err != nil {
			continue
		}
		ver := strings.TrimPrefix(filepath.Base(k), "vmlinuz-")
		if _, err := os.Stat(filepath.Join("/lib/modules", ver, "modules.dep")); err != nil {
			continue
		}
		if best == "" || fi.ModTime().After(bestTime) {
			best, bestTime = k, fi.ModTime()
		}
	}
	if best == "" {
		return "", "", ErrNoKernel
	}
	return best, filepath.Join("/lib/modules", strings.TrimPrefix(filepath.Base(best), "vmlinuz-")), nil
}

// fingerprint names a cached artefact by its inputs: paths with their size
// and modification time.
func fingerprint(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintln(h, p)
		if fi, err := os.Stat(p); err == nil {
			fmt.Fprintln(h, fi.Size(), fi.ModTime().UnixNano())
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// vmlinux returns an uncompressed kernel for PVH boot, extracted once from
// the bzImage at kernel into the cache: QEMU then jumps straight into it,
// seconds sooner under TCG than through qboot and the kernel's own
// decompressor. A kernel that is not xz-compressed is booted as it is.
func (r *Runtime) vmlinux(kernel string) (string, error) {
	out := filepath.Join(r.cacheDir(), "vmlinux-"+fingerprint(kernel))
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	b, err := os.ReadFile(kernel)
	if err != nil {
		return "", err
	}
	if bytes.HasPrefix(b, []byte("\x7fELF")) {
		return kernel, nil
	}
	i := bytes.Index(b, []byte("\xfd7zXZ\x00"))
	if i < 0 {
		return kernel, nil
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp)
	cmd := exec.Command("xz", "-dc", "--single-stream")
	cmd.Stdin = bytes.NewReader(b[i:])
	cmd.Stdout = f
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	f.Close()
	if err != nil {
		// Without xz the bzImage boots through qboot, more slowly.
		r.log.Info("booting the compressed kernel", "err", err, "stderr", host.LastLine(stderr.Bytes()))
		return kernel, nil
	}
	hdr := make([]byte, 4)
	if g, err := os.Open(tmp); err == nil {
		io.ReadFull(g, hdr)
		g.Close()
	}
	if string(hdr) != "\x7fELF" {
		return kernel, nil
	}
	return out, os.Rename(tmp, out)
}

// initrdFormat names how baseInitrd lays out its image, in its cached file's
// name: a change to the modules or their order must not reuse an old image.
const initrdFormat = "initrd 2"

// baseInitrd returns the initramfs shared by every sandbox: the agent binary
// and the guest's modules. Each sandbox's config follows it as a second cpio
// archive (the kernel unpacks concatenated archives in turn).
func (r *Runtime) baseInitrd(agentPath string) (string, error) {
	dep := filepath.Join(r.modules, "modules.dep")
	out := filepath.Join(r.cacheDir(), "initrd-"+fingerprint(initrdFormat, strings.Join(guestModules, " "), agentPath, dep)+".cpio")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	deps, err := os.ReadFile(dep)
	if err != nil {
		return "", err
	}
	var buf bytes.Buffer
	w := newCpio(&buf)
	for _, d := range []string{"dev", "proc", "sys", "mnt", "newroot", "modules"} {
		w.dir(d)
	}
	agent, err := os.ReadFile(agentPath)
	if err != nil {
		return "", err
	}
	w.file(strings.TrimPrefix(vminit.AgentPath, "/"), 0o755, agent)
	var order []string
	for _, p := range moduleOrder(deps, guestModules) {
		b, err := os.ReadFile(filepath.Join(r.modules, p))
		if err != nil {
			return "", err
		}
		w.file("modules/"+filepath.Base(p), 0o644, b)
		order = append(order, filepath.Base(p))
	}
	w.file(strings.TrimPrefix(vminit.ModuleOrder, "/"), 0o644, []byte(strings.Join(order, "\n")+"\n"))
	w.close()
	if err := writeAtomic(out, buf.Bytes()); err != nil {
		return "", err
	}
	// Initramfs of agent binaries since replaced: a start reads the base
	// only while it writes its own, so an hour unused is long gone.
	old, _ := filepath.Glob(filepath.Join(r.cacheDir(), "initrd-*.cpio"))
	for _, o := range old {
		if fi, err := os.Stat(o); err == nil && o != out && time.Since(fi.ModTime()) > time.Hour {
			os.Remove(o)
		}
	}
	return out, nil
}

// writeInitrd writes the sandbox's initramfs: base followed by cfg.
func writeInitrd(path, base string, cfg vminit.Config) error {
	b, err := os.ReadFile(base)
	if err != nil {
		return err
	}
	js, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	buf := bytes.NewBuffer(b)
	w := newCpio(buf)
	w.file(strings.TrimPrefix(vminit.ConfigPath, "/"), 0o600, js)
	w.close()
	return os.WriteFile(path, buf.Bytes(), 0o600)
}

func writeAtomic(path string, b []byte) error {
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// cpio writes the "newc" format the kernel unpacks.
type cpio struct {
	w   io.Writer
	ino int
}

func newCpio(w io.Writer) *cpio { return &cpio{w: w, ino: 1} }

func (c *cpio) entry(name string, mode uint32, data []byte) {
	c.ino++
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	io.WriteString(c.w, hdr)
	io.WriteString(c.w, name+"\x00")
	c.pad(len(hdr) + len(name) + 1)
	c.w.Write(data)
	c.pad(len(data))
}

func (c *cpio) pad(n int) {
	if n%4 != 0 {
		c.w.Write(make([]byte, 4-n%4))
	}
}

func (c *cpio) dir(name string)                         { c.entry(name, unix.S_IFDIR|0o755, nil) }
func (c *cpio) file(name string, perm uint32, b []byte) { c.entry(name, unix.S_IFREG|perm, b) }
func (c *cpio) close()                                  { c.entry("TRAILER!!!", 0, nil) }

// layerImage returns an erofs image of the read-only directory dir, built
// once and shared by every sandbox over it. Layers are immutable, so their
// path names them; a bind (the host template's /usr) changes with the host's
// packages, so the modification times of its top two levels are part of its
// name, and an upgrade makes a new image (sandboxes on the old one keep it).
func (r *Runtime) layerImage(ctx context.Context, dir string, mutable bool) (string, error) {
	parts := []string{dir}
	if mutable {
		parts = append(parts, treeStamp(dir)...)
	}
	out := filepath.Join(r.cacheDir(), "layer-"+fingerprint(parts...)+".erofs")
	built, err := r.buildImage(out, dir, func(tmp string) error {
		// mkfs.erofs keeps owners, times and extended attributes (the
		// layer store's whiteouts and opaque directories are
		// user.overlay.* ones).
		return run(ctx, "mkfs.erofs", "--quiet", tmp, dir)
	})
	if err != nil {
		return "", fmt.Errorf("building the image of %s: %w", dir, err)
	}
	if built {
		r.pruneImages(dir, out)
	}
	return out, nil
}

// mergedImage returns an erofs image of the overlay of the read-only
// directories dirs (top first), whiteouts and opaque directories applied,
// for layers past the disks a machine has. It is made from an overlay of
// the layers' own images, not of the layers: those are subvolumes of one
// btrfs, whose inode numbers repeat from one to the next, and mkfs.erofs
// would take two files of one number for links of one file.
func (r *Runtime) mergedImage(ctx context.Context, dirs []string) (string, error) {
	out := filepath.Join(r.cacheDir(), "layer-"+fingerprint(dirs...)+".erofs")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	images := make([]string, len(dirs))
	for i, d := range dirs {
		img, err := r.layerImage(ctx, d, false)
		if err != nil {
			return "", err
		}
		images[i] = img
	}
	_, err := r.buildImage(out, strings.Join(dirs, "\n"), func(tmp string) error {
		work, err := os.MkdirTemp(r.cacheDir(), ".merge-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(work)
		// The images' mounts and the overlay over them live in a mount
		// namespace of their own, which takes them when the build ends,
		// however it ends: a cancelled build or a killed node left them
		// on the host before.
		return host.InMountNamespace(func() error {
			// Unmounted here all the same, top first, so that the
			// images' loop devices (before Linux 6.12) are gone when
			// this returns.
			var mounted []string
			defer func() {
				for _, m := range slices.Backward(mounted) {
					_ = unix.Unmount(m, 0)
				}
			}()
			lower := make([]string, len(images))
			for i, img := range images {
				lower[i] = filepath.Join(work, strconv.Itoa(i))
				if err := os.Mkdir(lower[i], 0o700); err != nil {
					return err
				}
				if err := host.MountErofs(ctx, img, lower[i]); err != nil {
					return err
				}
				mounted = append(mounted, lower[i])
			}
			root := filepath.Join(work, "root")
			if err := os.Mkdir(root, 0o700); err != nil {
				return err
			}
			mounted = append(mounted, root)
			// Xino: each image is a file system of its own, so every
			// file gets an inode number of its own.
			if err := overlay.Mount(root, overlay.Options{Lower: lower, UserXattr: true, Xino: true, ReadOnly: true, NoDev: true, NoSuid: true}); err != nil {
				return err
			}
			return run(ctx, "mkfs.erofs", "--quiet", tmp, root)
		})
	})
	if err != nil {
		return "", fmt.Errorf("building the image of %d layers under %s: %w", len(dirs), dirs[0], err)
	}
	return out, nil
}

// buildImage has build write the image out (to the temporary file it is
// given) unless out exists, once across the node's processes, and records
// src, what it was made of, beside it. It reports whether it built.
func (r *Runtime) buildImage(out, src string, build func(tmp string) error) (bool, error) {
	if _, err := os.Stat(out); err == nil {
		return false, nil
	}
	r.buildMu.Lock()
	defer r.buildMu.Unlock()
	if _, err := os.Stat(out); err == nil {
		return false, nil
	}
	// Another node process may build the same image: the first takes it.
	lock, err := os.OpenFile(out+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return false, err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return false, err
	}
	defer os.Remove(out + ".lock")
	if _, err := os.Stat(out); err == nil {
		return false, nil
	}
	t0 := time.Now()
	tmp := out + ".tmp"
	defer os.Remove(tmp)
	if err := build(tmp); err != nil {
		return false, err
	}
	if err := os.Rename(tmp, out); err != nil {
		return false, err
	}
	if err := os.WriteFile(out+".src", []byte(src), 0o600); err != nil {
		return false, err
	}
	r.log.Info("vm layer image built", "image", out, "top", strings.SplitN(src, "\n", 2)[0], "ms", time.Since(t0).Milliseconds())
	return true, nil
}

// pruneImages removes the images of layers that are gone and, when kept is
// a new image of src, src's older ones, unless a sandbox's machine uses
// them. A checkpoint naming a pruned image cannot be restored, and says so.
func (r *Runtime) pruneImages(src, kept string) {
	inUse := map[string]bool{}
	machines, _ := filepath.Glob(filepath.Join(r.runRoot, "sandboxes", "*", machineName))
	for _, mf := range machines {
		var m machine
		if b, err := os.ReadFile(mf); err == nil && json.Unmarshal(b, &m) == nil {
			for _, d := range m.Disks {
				inUse[d.Path] = true
			}
		}
	}
	srcs, _ := filepath.Glob(filepath.Join(r.cacheDir(), "layer-*.erofs.src"))
	for _, sf := range srcs {
		img := strings.TrimSuffix(sf, ".src")
		b, err := os.ReadFile(sf)
		if err != nil || img == kept || inUse[img] {
			continue
		}
		gone := false
		for _, d := range strings.Split(string(b), "\n") {
			if _, err := os.Stat(d); errors.Is(err, os.ErrNotExist) {
				gone = true
			}
		}
		if string(b) == src || gone {
			os.Remove(img)
			os.Remove(sf)
		}
	}
}

// treeStamp lists dir's entries two levels deep with their modification
// times.
func treeStamp(dir string) []string {
	var out []string
	add := func(p string) {
		if fi, err := os.Lstat(p); err == nil {
			out = append(out, p+" "+strconv.FormatInt(fi.ModTime().UnixNano(), 10))
		}
	}
	add(dir)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		add(p)
		if e.IsDir() {
			sub, _ := os.ReadDir(p)
			for _, s := range sub {
				add(filepath.Join(p, s.Name()))
			}
		}
	}
	return out
}

// defaultDiskBytes sizes the writable disk of a sandbox without a quota.
const defaultDiskBytes = 16 << 30

// makeWritableDisk builds the sandbox's writable ext4 disk at path from its
// writable layer: upper/ and work/ as the store keeps them, with their
// owners and extended attributes. The file is sparse; its size is the
// layer's quota, so that a full disk is the guest's ENOSPC, as a full quota
// is an ns sandbox's.
func makeWritableDisk(ctx context.Context, path, writable string) error {
	size := writableQuota(writable)
	if size <= 0 {
		size = defaultDiskBytes
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	f.Close()
	if err != nil {
		return err
	}
	// No journal-less shortcuts: the disk must survive a VM killed
	// mid-write. Reserved blocks 0: the quota is all the sandbox's.
	src := filepath.Join(writable, "upper")
	stage, err := os.MkdirTemp(filepath.Dir(path), "stage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stage)
	// mke2fs -d copies one directory's contents to the root: stage holds
	// upper as a bind mount and an empty work.
	if err := os.Mkdir(filepath.Join(stage, "upper"), 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(stage, "work"), 0o755); err != nil {
		return err
	}
	// The bind mount goes with its namespace, even if the node dies.
	return host.InMountNamespace(func() error {
		if err := unix.Mount(src, filepath.Join(stage, "upper"), "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding the writable layer: %w", err)
		}
		defer unix.Unmount(filepath.Join(stage, "upper"), unix.MNT_DETACH)
		if err := run(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1", "-d", stage, path); err != nil {
			return fmt.Errorf("building the writable disk: %w", err)
		}
		return nil
	})
}

// writableQuota reads the btrfs qgroup limit of the writable layer's
// subvolume, 0 if it has none or is not on btrfs.
func writableQuota(dir string) int64 {
	out, err := exec.Command("btrfs", "qgroup", "show", "-rf", "--raw", dir).Output()
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// Qgroupid Referenced Exclusive Max-referenced [Path]
		if len(f) >= 4 && strings.HasPrefix(f[0], "0/") {
			n, err := strconv.ParseInt(f[3], 10, 64)
			if err == nil {
				return n
			}
		}
	}
	return 0
}

// syncBack copies what the guest wrote on its disk at img back into the
// writable layer's upper/, which stays what persists and what snapshots,
// forks and other runtimes see. It works on a copy of img (a reflink where
// the file system has them): mounting replays the journal of a disk whose VM
// did not unmount it, which must not touch a disk a checkpoint still needs.
func syncBack(ctx context.Context, img, writable, scratch string) error {
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(scratch)
	cp := filepath.Join(scratch, "disk.img")
	if err := run(ctx, "cp", "--reflink=auto", "--sparse=always", img, cp); err != nil {
		return err
	}
	mnt := filepath.Join(scratch, "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		return err
	}
	// The disk's mount (and its loop device) go with the namespace, even
	// if the node dies mid-copy.
	return host.InMountNamespace(func() error {
		if err := run(ctx, "mount", "-t", "ext4", "-o", "loop,nodev,nosuid", cp, mnt); err != nil {
			return fmt.Errorf("mounting the writable disk: %w", err)
		}
		// Unmounted here all the same, so that the loop device is gone
		// when this returns, not once the namespace is torn down.
		defer run(context.WithoutCancel(ctx), "umount", mnt)
		if _, err := os.Stat(filepath.Join(mnt, "upper")); err != nil {
			return fmt.Errorf("the writable disk has no upper directory: %w", err)
		}
		// -aHAX: owners, modes, times, hard links, ACLs and extended
		// attributes (the overlay's), device nodes (its whiteouts).
		if err := run(ctx, "rsync", "-aHAX", "--numeric-ids", "--delete", mnt+"/upper/", filepath.Join(writable, "upper")+"/"); err != nil {
			return fmt.Errorf("copying the writable disk back: %w", err)
		}
		return nil
	})
}

// run runs a tool to completion, its error carrying the last line it printed.
func run(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Cancel = func() error { return cmd.Process.Kill() }
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return fmt.Errorf("%s is not installed", name)
		}
		return fmt.Errorf("%s: %w: %s", name, err, host.LastLine(out.Bytes()))
	}
	return nil
}
