// Package vminit is the vm runtime's guest side: the PID 1 of a microVM.
// The kernel starts atoll-agent from the initramfs the runtime builds (the
// agent binary, the kernel modules the guest needs, and the sandbox's
// Config); Init loads the modules, mounts the template's layers (read-only
// erofs disks) under the writable disk (ext4) as an overlay, mounts the
// binds, /sys and a /dev of its own, and makes a cgroup with the sandbox's
// limits. It then starts itself again as the agent ("vm-agent"), in that
// cgroup and in a PID namespace of its own, so that the sandbox sees its own
// processes rather than the guest kernel's threads; the agent mounts /proc,
// moves into the new root, drops to Docker's default capabilities as the
// ns runtime does, and serves the agent protocol over a virtio-serial port
// (package channel). The first process stays the guest's init, holding the
// cgroup for the agent and out of the sandbox's sight.
//
// Debian's kernel has virtio, ext4, erofs and overlayfs as modules. Loading
// them here, rather than booting a kernel the project builds, keeps the
// guest kernel a stock distribution package that security updates reach.
package vminit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/agent/launch"
	"github.com/atoll-dev/atoll/internal/runtime/confine"
	"github.com/atoll-dev/atoll/internal/runtime/vm/channel"
)

// Paths inside the initramfs.
const (
	ConfigPath  = "/config.json"
	ModulesDir  = "/modules"
	ModuleOrder = "/modules/order" // module file names, one a line, in load order
	AgentPath   = "/" + launch.Name
	// PortName is the virtio-serial port the agent serves on.
	PortName = "atoll"
)

// Config is what the runtime tells the guest, in the initramfs.
type Config struct {
	Hostname string `json:"hostname"`
	// Writable is the serial of the writable disk (ext4 holding upper/ and
	// work/); Layers are the serials of the layer disks, top first.
	Writable string            `json:"writable"`
	Layers   []string          `json:"layers"`
	Binds    []Bind            `json:"binds,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	User     string            `json:"user,omitempty"`
	Workdir  string            `json:"workdir,omitempty"`
	// Setuid leaves no_new_privs unset (runtime.Spec.Setuid).
	Setuid bool   `json:"setuid,omitempty"`
	Limits Limits `json:"limits"`
	// Net, if set, is the guest's network: its eth0 takes the sandbox's
	// addresses and routes.
	Net *Net `json:"net,omitempty"`
}

// Net is a guest's eth0 and the files that describe its network.
type Net struct {
	// Hostname is the sandbox's, for a restored guest (readdressNet); at
	// boot it is the Config's.
	Hostname string   `json:"hostname,omitempty"`
	MAC      string   `json:"mac"`
	MTU      int      `json:"mtu"`
	Addrs    []string `json:"addrs"`    // CIDR
	Gateways []string `json:"gateways"` // default routes
	// ResolvConf and Hosts are mounted read-only over the root's.
	ResolvConf string `json:"resolv_conf"`
	Hosts      string `json:"hosts"`
}

// Bind is a read-only disk (its serial) mounted at Target.
type Bind struct {
	Serial string `json:"serial"`
	Target string `json:"target"`
}

// Limits are the guest cgroup's; zero means unlimited.
type Limits struct {
	CPU         float64 `json:"cpu,omitempty"`
	MemoryBytes int64   `json:"memory_bytes,omitempty"`
	PIDs        int64   `json:"pids,omitempty"`
}

// Paths the guest serves beside the agent protocol, to the host only
// (nothing in the guest can reach the port): PUT LimitsPath changes the
// guest cgroup's limits, GET ProcessesPath counts its processes, POST
// SyncPath flushes every file system to its disk, PUT ClockPath (a JSON
// number of nanoseconds since the epoch) sets the guest's clock, which
// stands still while the VM is paused or saved, and PUT NetPath (a Net)
// gives eth0 new addresses and routes and rewrites resolv.conf and hosts,
// for a VM restored into another network than the one it was saved in.
// GET UsagePath answers a Usage.
const (
	LimitsPath    = "/vm/limits"
	ProcessesPath = "/vm/processes"
	SyncPath      = "/vm/sync"
	ClockPath     = "/vm/clock"
	NetPath       = "/vm/net"
	UsagePath     = "/vm/usage"
)

// Usage is what the guest's sandbox cgroup has used, and its root's use of
// the writable disk (the overlay's upper file system, which statfs of the
// root reports).
type Usage struct {
	CPUUsec     int64 `json:"cpu_usec"`
	MemoryBytes int64 `json:"memory_bytes"` // memory.current
	FileBytes   int64 `json:"file_bytes"`   // page cache, tmpfs included
	DiskBytes   int64 `json:"disk_bytes"`
	DiskTotal   int64 `json:"disk_total_bytes"`
}

// control is a request of the agent to the guest's init, one JSON line
// answered by one: Limits to set, the clock to set, or (neither) a count
// of the sandbox's processes.
type control struct {
	Limits *Limits `json:"limits,omitempty"`
	// ClockNano, if set, is the host's time, for the guest's clock.
	ClockNano *int64 `json:"clock_nano,omitempty"`
	// Net, if set, is the network to take up in place of the one eth0 has.
	Net *Net `json:"net,omitempty"`
	// Usage asks for the cgroup's Usage.
	Usage bool `json:"usage,omitempty"`
}

type controlReply struct {
	Processes int    `json:"processes"`
	Usage     *Usage `json:"usage,omitempty"`
	Err       string `json:"err,omitempty"`
}

// serveControl answers the agent's requests about its cgroup.
func serveControl(f *os.File, cg int) {
	dec, enc := json.NewDecoder(f), json.NewEncoder(f)
	for {
		var req control
		if err := dec.Decode(&req); err != nil {
			return
		}
		var rep controlReply
		if req.Net != nil {
			if err := readdressNet(*req.Net); err != nil {
				rep.Err = err.Error()
			}
		} else if req.ClockNano != nil {
			ts := unix.NsecToTimespec(*req.ClockNano)
			if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
				rep.Err = err.Error()
			}
		} else if req.Usage {
			u, err := cgroupUsage(cg)
			rep.Usage = &u
			if err != nil {
				rep.Err = err.Error()
			}
		} else if req.Limits != nil {
			if err := applyLimits(cg, *req.Limits); err != nil {
				rep.Err = err.Error()
			}
		} else {
			n, err := countProcs(cg)
			rep.Processes = n
			if err != nil {
				rep.Err = err.Error()
			}
		}
		if err := enc.Encode(rep); err != nil {
			return
		}
	}
}

func countProcs(cg int) (int, error) {
	fd, err := unix.Openat(cg, "cgroup.procs", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	f := os.NewFile(uintptr(fd), "cgroup.procs")
	defer f.Close()
	b, err := io.ReadAll(f)
	return len(strings.Fields(string(b))), err
}

// cgroupUsage reads the CPU time and memory of the cgroup at directory cg.
func cgroupUsage(cg int) (Usage, error) {
	var u Usage
	read := func(name string) (string, error) {
		fd, err := unix.Openat(cg, name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", fmt.Errorf("reading %s: %w", name, err)
		}
		f := os.NewFile(uintptr(fd), name)
		defer f.Close()
		b, err := io.ReadAll(f)
		return string(b), err
	}
	// keyed finds key's value among a file's "key value" lines.
	keyed := func(text, key string) (int64, error) {
		for _, line := range strings.Split(text, "\n") {
			if k, v, ok := strings.Cut(line, " "); ok && k == key {
				return strconv.ParseInt(v, 10, 64)
			}
		}
		return 0, fmt.Errorf("no %s", key)
	}
	cpu, err := read("cpu.stat")
	if err == nil {
		u.CPUUsec, err = keyed(cpu, "usage_usec")
	}
	if err != nil {
		return u, err
	}
	cur, err := read("memory.current")
	if err == nil {
		u.MemoryBytes, err = strconv.ParseInt(strings.TrimSpace(cur), 10, 64)
	}
	if err != nil {
		return u, err
	}
	stat, err := read("memory.stat")
	if err == nil {
		u.FileBytes, err = keyed(stat, "file")
	}
	return u, err
}

// controller is the agent's side of the control socket.
type controller struct {
	mu  sync.Mutex
	enc *json.Encoder
	dec *json.Decoder
}

func (c *controller) call(req control) (controlReply, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var rep controlReply
	if err := c.enc.Encode(req); err != nil {
		return rep, err
	}
	if err := c.dec.Decode(&rep); err != nil {
		return rep, err
	}
	if rep.Err != "" {
		return rep, errors.New(rep.Err)
	}
	return rep, nil
}

// Init is the first stage; it does not return.
func Init() {
	err := setup()
	fmt.Fprintln(os.Stderr, "atoll-agent vm-init:", err)
	// PID 1 exiting panics the kernel, which (panic=-1) ends the VM.
	os.Exit(1)
}

func setup() error {
	for _, m := range []struct{ dst, fs string }{{"/dev", "devtmpfs"}, {"/proc", "proc"}, {"/sys", "sysfs"}} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.fs, m.dst, m.fs, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mounting %s: %w", m.dst, err)
		}
	}
	if err := loadModules(); err != nil {
		return err
	}
	b, err := os.ReadFile(ConfigPath)
	if err != nil {
		return err
	}
	var cfg Config
	if err := json.Unmarshal(b, &cfg); err != nil {
		return fmt.Errorf("parsing %s: %w", ConfigPath, err)
	}
	serials := append(append([]string{cfg.Writable}, cfg.Layers...), bindSerials(cfg.Binds)...)
	disks, err := waitDisks(serials, 20*time.Second)
	if err != nil {
		return err
	}
	if err := mountRoot(cfg, disks); err != nil {
		return err
	}
	if cfg.Net != nil {
		if err := mountNetFiles(*cfg.Net); err != nil {
			return err
		}
	}
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return fmt.Errorf("setting the hostname: %w", err)
	}
	if err := confine.Loopback(); err != nil {
		return err
	}
	if cfg.Net != nil {
		if err := setupNet(*cfg.Net); err != nil {
			return fmt.Errorf("configuring the network: %w", err)
		}
	}
	cg, err := setupCgroup(cfg.Limits)
	if err != nil {
		return err
	}
	port, err := openPort(20 * time.Second)
	if err != nil {
		return err
	}
	// The agent runs in a PID namespace of its own, as the sandbox's PID
	// 1: the sandbox sees its own processes, not the guest kernel's
	// threads. This process stays the guest's init, waiting for it.
	cmd := exec.Command(AgentPath, launch.VMAgent)
	cmd.Args[0] = launch.Name
	cmd.Env = []string{launch.VMConfigVar + "=" + string(b)}
	// The cgroup stays with this process, out of the sandbox's sight (a
	// directory descriptor of the agent's would be a way into it through
	// /proc/1/fd); the agent asks over a socket for what it needs.
	ctl, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	cmd.ExtraFiles = []*os.File{os.NewFile(uintptr(port), "port"), os.NewFile(uintptr(ctl[1]), "control")} // launch.PortFD and ControlFD
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, UseCgroupFD: true, CgroupFD: cg}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the agent: %w", err)
	}
	unix.Close(ctl[1])
	go serveControl(os.NewFile(uintptr(ctl[0]), "control"), cg)
	err = cmd.Wait()
	fmt.Fprintln(os.Stderr, "atoll-agent vm-init: the agent exited:", err)
	// With -no-reboot, QEMU exits.
	unix.Sync()
	return unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
}

// enterRoot makes the prepared root the agent's: a /proc of its PID
// namespace, the root moved over the initramfs (which cannot be pivoted
// away from) as switch_root does, masked paths, and Docker's default
// capabilities for it and all it starts.
func enterRoot() error {
	if err := unix.Mount("proc", "/newroot/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc: %w", err)
	}
	if err := unix.Chdir("/newroot"); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("moving the root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := confine.MaskPaths(); err != nil {
		return err
	}
	// Docker's set less CAP_MKNOD, for what the agent starts: a device
	// node of the VM's own disks would let the sandbox write them raw,
	// around the guest's file systems, and the host mounts the writable
	// one to copy it back. (Docker keeps CAP_MKNOD and lets a device
	// cgroup refuse the nodes; the guest has no device cgroup.)
	if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, unix.CAP_MKNOD, 0); e != 0 {
		return fmt.Errorf("dropping CAP_MKNOD: %w", e)
	}
	return confine.DropCapabilities()
}

// setupNet gives the guest's network device the sandbox's addresses and
// routes.
func setupNet(n Net) error {
	link, err := netLink(n.MAC, 10*time.Second)
	if err != nil {
		return err
	}
	if link.Attrs().Name != "eth0" {
		if err := netlink.LinkSetName(link, "eth0"); err != nil {
			return err
		}
	}
	if n.MTU > 0 {
		if err := netlink.LinkSetMTU(link, n.MTU); err != nil {
			return err
		}
	}
	if err := addAddrs(link, n.Addrs); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return err
	}
	return addGateways(link, n.Gateways)
}

// readdressNet gives eth0 n's MAC, addresses and routes in place of its
// own, and the sandbox n's resolv.conf and hosts. A restored guest kept the
// MAC it was saved with, its parent's slot's for a fork's child: the host's
// network gives each slot its own, and siblings sharing one would have the
// bridge send one's traffic to another.
func readdressNet(n Net) error {
	link, err := netlink.LinkByName("eth0") // setupNet's name for it
	if err != nil {
		return err
	}
	if mac, err := net.ParseMAC(n.MAC); err != nil {
		return err
	} else if link.Attrs().HardwareAddr.String() != mac.String() {
		// virtio-net takes a new address while up (its control queue
		// tells the device, whose receive filter follows).
		if err := netlink.LinkSetHardwareAddr(link, mac); err != nil {
			return fmt.Errorf("setting the MAC %s: %w", mac, err)
		}
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if !a.IP.IsLinkLocalUnicast() {
			if err := netlink.AddrDel(link, &a); err != nil {
				return fmt.Errorf("removing %s: %w", a.IPNet, err)
			}
		}
	}
	// Routes through the old addresses went with them; a default route
	// left over is replaced.
	routes, _ := netlink.RouteList(link, netlink.FAMILY_ALL)
	for _, r := range routes {
		if r.Gw != nil {
			_ = netlink.RouteDel(&r)
		}
	}
	if err := addAddrs(link, n.Addrs); err != nil {
		return err
	}
	if err := addGateways(link, n.Gateways); err != nil {
		return err
	}
	if n.Hostname != "" {
		if err := unix.Sethostname([]byte(n.Hostname)); err != nil {
			return fmt.Errorf("setting the hostname: %w", err)
		}
	}
	return rewriteNetFiles(n)
}

// netLink finds the network device with address mac, waiting up to
// timeout for it to appear.
func netLink(macAddr string, timeout time.Duration) (netlink.Link, error) {
	mac, err := net.ParseMAC(macAddr)
	if err != nil {
		return nil, err
	}
	var link netlink.Link
	for deadline := time.Now().Add(timeout); link == nil; {
		links, _ := netlink.LinkList()
		for _, l := range links {
			if l.Attrs().HardwareAddr.String() == mac.String() {
				link = l
			}
		}
		if link == nil {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("no network device with address %s", mac)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return link, nil
}

func addAddrs(link netlink.Link, addrs []string) error {
	for _, a := range addrs {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return err
		}
		if addr.IP.To4() == nil {
			// Static: no duplicate detection to wait for.
			addr.Flags |= unix.IFA_F_NODAD
		}
		if err := netlink.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("adding %s: %w", a, err)
		}
	}
	return nil
}

func addGateways(link netlink.Link, gateways []string) error {
	for _, g := range gateways {
		gw := net.ParseIP(g)
		if gw == nil {
			return fmt.Errorf("bad gateway %q", g)
		}
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw}); err != nil {
			return fmt.Errorf("route via %s: %w", g, err)
		}
	}
	return nil
}

// netFiles are the resolv.conf and hosts mounted over the root's, by name.
var netFiles = map[string]*os.File{}

// rewriteNetFiles gives the files mountNetFiles made n's contents, in place.
func rewriteNetFiles(n Net) error {
	for name, content := range map[string]string{"resolv.conf": n.ResolvConf, "hosts": n.Hosts} {
		f := netFiles[name]
		if f == nil {
			return fmt.Errorf("the guest has no %s of its network", name)
		}
		if err := f.Truncate(0); err != nil {
			return err
		}
		if _, err := f.WriteAt([]byte(content), 0); err != nil {
			return err
		}
	}
	return nil
}

// mountNetFiles writes resolv.conf and hosts into a tmpfs of the initramfs
// and binds them read-only over the new root's.
func mountNetFiles(n Net) error {
	const dir = "/mnt/net"
	os.MkdirAll(dir, 0o755)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=64k,mode=0755"); err != nil {
		return err
	}
	for name, content := range map[string]string{"resolv.conf": n.ResolvConf, "hosts": n.Hosts} {
		src := filepath.Join(dir, name)
		f, err := os.OpenFile(src, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		if _, err := f.WriteString(content); err != nil {
			return err
		}
		// Kept open, for rewriteNetFiles.
		netFiles[name] = f
		target := "/newroot/etc/" + name
		// An image's symlink here (to a systemd-resolved stub, say) is
		// replaced by a file to mount on, as the ns runtime does.
		if fi, err := os.Lstat(target); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			os.Remove(target)
		}
		if _, err := os.Lstat(target); err != nil {
			os.MkdirAll(filepath.Dir(target), 0o755)
			if err := os.WriteFile(target, nil, 0o644); err != nil {
				return err
			}
		}
		if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding /etc/%s: %w", name, err)
		}
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("read-only /etc/%s: %w", name, err)
		}
	}
	return nil
}

func bindSerials(bs []Bind) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.Serial)
	}
	return out
}

// loadModules loads the initramfs's modules in order, with the parameters
// the kernel command line gives them (QEMU's microvm describes its
// virtio-mmio devices as virtio_mmio.device=...; the kernel applies such
// parameters only to built-in drivers).
func loadModules() error {
	order, err := os.ReadFile(ModuleOrder)
	if err != nil {
		return err
	}
	cmdline, _ := os.ReadFile("/proc/cmdline")
	for _, name := range strings.Fields(string(order)) {
		mod, compression, _ := strings.Cut(name, ".ko")
		var params []string
		for _, f := range strings.Fields(string(cmdline)) {
			for _, n := range []string{mod, strings.ReplaceAll(mod, "_", "-")} {
				if p, ok := strings.CutPrefix(f, n+"."); ok {
					params = append(params, p)
				}
			}
		}
		fd, err := unix.Open(filepath.Join(ModulesDir, name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		flags := 0
		if compression != "" {
			// .ko.xz, .ko.zst: the kernel unpacks them itself.
			flags = unix.MODULE_INIT_COMPRESSED_FILE
		}
		err = unix.FinitModule(fd, strings.Join(params, " "), flags)
		unix.Close(fd)
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("loading %s: %w", name, err)
		}
	}
	return nil
}

// waitDisks maps each serial to its block device as virtio_blk probes them.
func waitDisks(serials []string, timeout time.Duration) (map[string]string, error) {
	deadline := time.Now().Add(timeout)
	for {
		found := map[string]string{}
		ents, _ := os.ReadDir("/sys/block")
		for _, e := range ents {
			s, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "serial"))
			if err == nil {
				found[strings.TrimSpace(string(s))] = "/dev/" + e.Name()
			}
		}
		missing := ""
		for _, s := range serials {
			if _, err := os.Stat(found[s]); found[s] == "" || err != nil {
				missing = s
			}
		}
		if missing == "" {
			return found, nil
		}
		if time.Now().After(deadline) {
			cmdline, _ := os.ReadFile("/proc/cmdline")
			return nil, fmt.Errorf("disk %s did not appear (found %v; %s)", missing, found, strings.TrimSpace(string(cmdline)))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mountRoot(cfg Config, disks map[string]string) error {
	if err := os.MkdirAll("/mnt/rw", 0o755); err != nil {
		return err
	}
	if err := unix.Mount(disks[cfg.Writable], "/mnt/rw", "ext4", unix.MS_NOATIME, ""); err != nil {
		return fmt.Errorf("mounting the writable disk: %w", err)
	}
	for _, d := range []string{"/mnt/rw/upper", "/mnt/rw/work"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	var lower []string
	for i, s := range cfg.Layers {
		dir := fmt.Sprintf("/mnt/l%d", i)
		os.MkdirAll(dir, 0o755)
		if err := unix.Mount(disks[s], dir, "erofs", unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("mounting layer %d: %w", i, err)
		}
		lower = append(lower, dir)
	}
	if len(lower) == 0 {
		return errors.New("no layers")
	}
	os.MkdirAll("/newroot", 0o755)
	// userxattr: the layer store's whiteouts and opaque directories are
	// user.overlay.* attributes, as the ns runtime's overlay (in a user
	// namespace) writes them; a writable layer means the same under every
	// runtime.
	opts := fmt.Sprintf("lowerdir=%s,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work,userxattr", strings.Join(lower, ":"))
	if err := unix.Mount("overlay", "/newroot", "overlay", 0, opts); err != nil {
		return fmt.Errorf("mounting the overlay root: %w", err)
	}
	for _, b := range cfg.Binds {
		dst, err := confine.Mountpoint("/newroot", b.Target, true)
		if err != nil {
			return err
		}
		if err := unix.Mount(disks[b.Serial], dst, "erofs", unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("mounting %s: %w", b.Target, err)
		}
	}
	const common = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if _, err := confine.Mountpoint("/newroot", "/proc", true); err != nil {
		return err
	}
	mounts := []struct {
		target, fstype, data string
		flags                uintptr
	}{
		{"/sys", "sysfs", "", common | unix.MS_RDONLY},
		{"/dev", "tmpfs", "mode=755,size=65536k", unix.MS_NOSUID | unix.MS_STRICTATIME},
		{"/dev/pts", "devpts", "newinstance,ptmxmode=0666,mode=0620,gid=5", unix.MS_NOSUID | unix.MS_NOEXEC},
		{"/dev/shm", "tmpfs", "mode=1777,size=65536k", common},
		{"/dev/mqueue", "mqueue", "", common},
	}
	for _, m := range mounts {
		dst, err := confine.Mountpoint("/newroot", m.target, true)
		if err != nil {
			return err
		}
		if err := unix.Mount(m.fstype, dst, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mounting %s: %w", m.target, err)
		}
	}
	// A /dev with the usual nodes and nothing of the VM's own: no disks,
	// no console, no kmsg, not the agent's port.
	for _, d := range []struct {
		name         string
		major, minor uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}} {
		if err := unix.Mknod("/newroot/dev/"+d.name, unix.S_IFCHR|0o666, int(unix.Mkdev(d.major, d.minor))); err != nil {
			return fmt.Errorf("making /dev/%s: %w", d.name, err)
		}
		_ = unix.Chmod("/newroot/dev/"+d.name, 0o666)
	}
	for name, target := range map[string]string{
		"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
		"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, "/newroot/dev/"+name); err != nil {
			return err
		}
	}
	return nil
}

// setupCgroup makes the cgroup the agent, and so every process it starts,
// runs in, with the sandbox's limits, and returns a descriptor of its
// directory. No cgroup file system is mounted in the sandbox.
func setupCgroup(l Limits) (int, error) {
	const root = "/cgroup"
	os.MkdirAll(root, 0o755)
	if err := unix.Mount("cgroup2", root, "cgroup2", 0, ""); err != nil {
		return -1, fmt.Errorf("mounting cgroup2: %w", err)
	}
	if err := os.WriteFile(root+"/cgroup.subtree_control", []byte("+pids +memory +cpu"), 0); err != nil {
		return -1, fmt.Errorf("enabling controllers: %w", err)
	}
	dir := root + "/sandbox"
	if err := os.Mkdir(dir, 0o755); err != nil {
		return -1, err
	}
	fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := applyLimits(fd, l); err != nil {
		return -1, err
	}
	_ = unix.Unmount(root, unix.MNT_DETACH)
	return fd, nil
}

func applyLimits(dir int, l Limits) error {
	pids, mem, cpu := "max", "max", "max 100000"
	if l.PIDs > 0 {
		pids = strconv.FormatInt(l.PIDs, 10)
	}
	if l.MemoryBytes > 0 {
		mem = strconv.FormatInt(l.MemoryBytes, 10)
	}
	if l.CPU > 0 {
		cpu = fmt.Sprintf("%d 100000", int64(l.CPU*100000))
	}
	for _, f := range []struct{ name, value string }{{"pids.max", pids}, {"memory.max", mem}, {"memory.swap.max", "0"}, {"cpu.max", cpu}} {
		err := writeAt(dir, f.name, f.value)
		if err != nil && !(f.name == "memory.swap.max" && errors.Is(err, unix.ENOENT)) {
			return fmt.Errorf("setting %s: %w", f.name, err)
		}
	}
	return nil
}

func writeAt(dir int, name, value string) error {
	fd, err := unix.Openat(dir, name, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	_, err = unix.Write(fd, []byte(value))
	return err
}

// openPort opens the virtio-serial port named PortName.
func openPort(timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		ents, _ := os.ReadDir("/sys/class/virtio-ports")
		for _, e := range ents {
			name, err := os.ReadFile(filepath.Join("/sys/class/virtio-ports", e.Name(), "name"))
			if err == nil && strings.TrimSpace(string(name)) == PortName {
				fd, err := unix.Open("/dev/"+e.Name(), unix.O_RDWR|unix.O_CLOEXEC, 0)
				if err == nil {
					return fd, nil
				}
			}
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("virtio-serial port %s did not appear", PortName)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// AgentMain is the second stage: the agent, serving over the port, with the
// limits endpoint beside the protocol.
func AgentMain() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := serve(log); err != nil {
		log.Error("atoll-agent vm-agent", "err", err)
		os.Exit(1)
	}
}

func serve(log *slog.Logger) error {
	var cfg Config
	if err := json.Unmarshal([]byte(os.Getenv(launch.VMConfigVar)), &cfg); err != nil {
		return fmt.Errorf("parsing %s: %w", launch.VMConfigVar, err)
	}
	os.Clearenv()
	// Nothing the agent starts inherits the port or the cgroup.
	syscall.CloseOnExec(launch.PortFD)
	syscall.CloseOnExec(launch.ControlFD)
	cf := os.NewFile(launch.ControlFD, "control")
	ctl := &controller{enc: json.NewEncoder(cf), dec: json.NewDecoder(cf)}
	if err := enterRoot(); err != nil {
		return err
	}
	// As in an ns sandbox: nothing the agent starts gains privileges by
	// exec, unless the template's setuid programs (sudo) are to work.
	if !cfg.Setuid {
		if _, _, e := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); e != 0 {
			return fmt.Errorf("setting no_new_privs: %w", e)
		}
	}
	a, err := agent.New(agent.Config{DefaultEnv: cfg.Env, Logger: log, Reap: true, DefaultUser: cfg.User, DefaultCwd: cfg.Workdir})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/", a.Handler())
	mux.HandleFunc("PUT "+LimitsPath, putControl(ctl, 4096, func(l *Limits) control { return control{Limits: l} }))
	mux.HandleFunc("GET "+ProcessesPath, func(w http.ResponseWriter, r *http.Request) {
		rep, err := ctl.call(control{})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		json.NewEncoder(w).Encode(rep.Processes)
	})
	mux.HandleFunc("PUT "+ClockPath, putControl(ctl, 64, func(n *int64) control { return control{ClockNano: n} }))
	mux.HandleFunc("PUT "+NetPath, putControl(ctl, 64<<10, func(n *Net) control { return control{Net: n} }))
	mux.HandleFunc("GET "+UsagePath, func(w http.ResponseWriter, r *http.Request) {
		rep, err := ctl.call(control{Usage: true})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		// The overlay's statfs is its upper file system's: the
		// writable disk, which the agent's root is.
		var st unix.Statfs_t
		if err := unix.Statfs("/", &st); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		rep.Usage.DiskTotal = int64(st.Blocks) * st.Bsize
		rep.Usage.DiskBytes = int64(st.Blocks-st.Bfree) * st.Bsize
		json.NewEncoder(w).Encode(rep.Usage)
	})
	mux.HandleFunc("POST "+SyncPath, func(w http.ResponseWriter, r *http.Request) {
		unix.Sync()
		w.WriteHeader(http.StatusNoContent)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 30 * time.Second}
	log.Info("atoll-agent serving", "pid", os.Getpid())
	return srv.Serve(channel.Listen(os.NewFile(launch.PortFD, "port")))
}

// putControl handles a PUT whose JSON body, at most limit bytes, becomes the
// control request that req makes of it.
func putControl[T any](ctl *controller, limit int64, req func(*T) control) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var v T
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit)).Decode(&v); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if _, err := ctl.call(req(&v)); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}
