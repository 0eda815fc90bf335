package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-dev/atoll/internal/auth"
	"github.com/atoll-dev/atoll/internal/blob"
	"github.com/atoll-dev/atoll/internal/control"
	"github.com/atoll-dev/atoll/internal/e2b"
	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/network"
	"github.com/atoll-dev/atoll/internal/portproxy"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/runtime/gvisor"
	"github.com/atoll-dev/atoll/internal/runtime/lowers"
	"github.com/atoll-dev/atoll/internal/runtime/ns"
	"github.com/atoll-dev/atoll/internal/runtime/vm"
	"github.com/atoll-dev/atoll/internal/server"
	"github.com/atoll-dev/atoll/internal/store"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

type serveConfig struct {
	listen    string
	data      string
	agent     string
	imageSize int64
	dirty     int64
	warmPool  int
	prestart  int
	archive   string
	e2b       bool
	debug     bool
	out       io.Writer

	network     string // auto, on or off
	bridge      string
	subnet4     string
	subnet6     string
	netAllow    []string
	dnsUpstream []string
	netPool     int

	proxyListen string
	proxyDomain string
}

func newServeCmd() *cobra.Command {
	cfg := serveConfig{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the atoll server (needs root)",
		Long: `Run the atoll server: the REST API under /v1 and the sandboxes it starts.
The same listener serves an E2B-compatible API, so code written for E2B's SDKs
runs against it with E2B_API_URL and E2B_SANDBOX_URL set to its URL
(docs/e2b.md; --e2b=false turns it off).

It needs root, because sandboxes are made of namespaces, cgroups and mounts.
Everything it keeps lives in the data directory: an embedded SQLite database,
the layer store (a btrfs image loop-mounted there unless the directory is already
on btrfs: snapshots, forks and disk quotas need it), and the admin's API key, created
on first start ("atoll key create" issues keys for other tenants, which see
only their own sandboxes).

Each sandbox gets a network namespace of its own on a bridge (--network-bridge,
default atoll0) with an IPv4 and an IPv6 address, NAT to the host's uplink, a
resolver on its gateway and an egress policy (docs/network.md). This turns on
IP forwarding on the host. --network auto (the default) turns networking off,
with a warning, if the kernel cannot enforce it; sandboxes then have loopback
only and creates that ask for an egress policy are refused. --network on
refuses to start instead; --network off never tries.

Stopping the server (Ctrl-C, SIGTERM) leaves sandboxes running; the next start
re-adopts them.

With networking on, the port proxy (--proxy-listen, default 127.0.0.1:7401)
serves sandboxes' ports at http://{port}-{id}.{domain}/ (--proxy-domain,
default localhost). A sandbox's ports need its access token or a signed URL
unless it was created with public ports; the key that signs them is kept in
the data directory (port-key).`,
		Example: `  sudo atoll serve
  sudo atoll serve --listen 0.0.0.0:7400 --data /srv/atoll
  sudo atoll serve --archive 's3://atoll-archive?region=eu-west-1'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg.out = cmd.OutOrStdout()
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return serve(ctx, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.listen, "listen", "127.0.0.1:7400", "address to serve the API on")
	f.StringVar(&cfg.data, "data", "/var/lib/atoll", "data directory")
	f.StringVar(&cfg.agent, "agent", "", "atoll-agent binary to run in sandboxes (default: atoll-agent beside this binary, else this binary)")
	f.Int64Var(&cfg.imageSize, "layer-image-size", 0, "size in bytes of the layer image, when one is created (default: 90% of free space, at most 1 TiB)")
	f.Int64Var(&cfg.dirty, "layer-dirty-limit", 0, fmt.Sprintf("bytes the layer store may hold written but not yet on disk, all sandboxes together; it bounds the time a snapshot or fork takes after large writes (default %d; -1: the kernel's defaults)", layers.DefaultDirtyLimit))
	f.IntVar(&cfg.warmPool, "warm-pool", 2, "default sandboxes to keep started ahead of demand (0: none)")
	f.IntVar(&cfg.prestart, "prestart", 4, "sandbox processes to keep started ahead of demand for forks and other creates (0: none)")
	f.StringVar(&cfg.archive, "archive", "", "object storage URL for archived sandboxes: file:///dir, or s3://bucket?region=R (S3-compatible: &endpoint=URL&use_path_style=true) with credentials from AWS_* variables or ~/.aws (default file://<data>/archive)")
	f.BoolVar(&cfg.e2b, "e2b", true, "also serve the E2B-compatible API and sandbox traffic on the listener (see docs/e2b.md)")
	f.BoolVar(&cfg.debug, "debug", false, "log debug messages")
	f.StringVar(&cfg.network, "network", "auto", "sandbox networking: auto (on if the kernel can enforce it), on or off")
	f.StringVar(&cfg.bridge, "network-bridge", "", `bridge for sandboxes; also names their namespaces and veths (default "atoll0")`)
	f.StringVar(&cfg.subnet4, "network-subnet4", "", "sandboxes' IPv4 subnet (default 10.213.0.0/16)")
	f.StringVar(&cfg.subnet6, "network-subnet6", "", "sandboxes' IPv6 /64 (default a unique local prefix derived from the bridge name)")
	f.StringArrayVar(&cfg.netAllow, "network-allow", nil, "private or special prefix that sandboxes may reach all the same, e.g. an internal mirror's 10.1.2.0/24 (repeatable)")
	f.StringArrayVar(&cfg.dnsUpstream, "dns-upstream", nil, "DNS server the sandboxes' resolver asks, ADDR or ADDR:PORT (repeatable; default the nameservers of /etc/resolv.conf)")
	f.IntVar(&cfg.netPool, "network-pool", 4, "network namespaces to keep made ahead of demand (0: none)")
	f.StringVar(&cfg.proxyListen, "proxy-listen", "127.0.0.1:7401", `address of the port proxy, which serves sandboxes' ports at http://{port}-{id}.{domain}/ ("": none)`)
	f.StringVar(&cfg.proxyDomain, "proxy-domain", "localhost", "domain under which the port proxy serves sandboxes' ports (its names must resolve to the proxy)")
	return cmd
}

// networkConfig turns the network flags into a network.Config.
func networkConfig(cfg serveConfig, log *slog.Logger) (network.Config, error) {
	nc := network.Config{Bridge: cfg.bridge, Logger: log}
	var err error
	if cfg.subnet4 != "" {
		if nc.Subnet4, err = netip.ParsePrefix(cfg.subnet4); err != nil {
			return nc, fmt.Errorf("--network-subnet4: %w", err)
		}
	}
	if cfg.subnet6 != "" {
		if nc.Subnet6, err = netip.ParsePrefix(cfg.subnet6); err != nil {
			return nc, fmt.Errorf("--network-subnet6: %w", err)
		}
	}
	for _, a := range cfg.netAllow {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			addr, aerr := netip.ParseAddr(a)
			if aerr != nil {
				return nc, fmt.Errorf("--network-allow %q: want a CIDR prefix or an address", a)
			}
			p = netip.PrefixFrom(addr, addr.BitLen())
		}
		nc.Allow = append(nc.Allow, p)
	}
	for _, u := range cfg.dnsUpstream {
		ap, err := netip.ParseAddrPort(u)
		if err != nil {
			addr, aerr := netip.ParseAddr(u)
			if aerr != nil {
				return nc, fmt.Errorf("--dns-upstream %q: want ADDR or ADDR:PORT", u)
			}
			ap = netip.AddrPortFrom(addr, 53)
		}
		nc.Upstream = append(nc.Upstream, ap)
	}
	return nc, nil
}

// startNetwork makes the sandboxes' network as --network says: nil when it
// is off.
func startNetwork(cfg serveConfig, log *slog.Logger) (*network.Manager, error) {
	switch cfg.network {
	case "off":
		return nil, nil
	case "on", "auto":
	default:
		return nil, fmt.Errorf("--network %q: want auto, on or off", cfg.network)
	}
	nc, err := networkConfig(cfg, log)
	if err != nil {
		return nil, err
	}
	m, err := network.New(nc)
	if err == nil {
		if err = m.Listen(); err != nil {
			m.Close()
			m = nil
		}
	}
	if err != nil {
		if cfg.network == "on" {
			return nil, fmt.Errorf("sandbox networking: %w", err)
		}
		log.Warn("sandbox networking is off: sandboxes get loopback only, and creates that ask for an egress policy are refused", "err", err)
		return nil, nil
	}
	return m, nil
}

func serve(ctx context.Context, cfg serveConfig) error {
	if os.Geteuid() != 0 {
		return errors.New("atoll serve needs root: sandboxes are made of namespaces, cgroups and mounts (try: sudo atoll serve)")
	}
	level := slog.LevelInfo
	if cfg.debug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	data, err := filepath.Abs(cfg.data)
	if err != nil {
		return err
	}
	// 0711: sandboxes' unprivileged host uids traverse it to reach the agent
	// binary and their mountpoints; nothing in it is listable or readable.
	if err := os.MkdirAll(data, 0o711); err != nil {
		return err
	}
	if err := os.Chmod(data, 0o711); err != nil {
		return err
	}
	// The archive URL first: a wrong one fails before the layer image is made.
	archiveURL := cfg.archive
	if archiveURL == "" {
		archiveURL = "file://" + filepath.Join(data, "archive")
	}
	bucket, err := blob.Open(ctx, archiveURL)
	if err != nil {
		return fmt.Errorf("--archive: %w", err)
	}
	defer bucket.Close()

	st, err := store.Open(filepath.Join(data, "atoll.db"))
	if err != nil {
		return fmt.Errorf("opening store: %w", err)
	}
	defer st.Close()
	keys := auth.New(st)
	key, keyPath, err := ensureAPIKey(ctx, keys, data)
	if err != nil {
		return err
	}
	ls, err := layers.Open(layers.Config{Dir: filepath.Join(data, "layers"), ImageSize: cfg.imageSize, DirtyLimit: cfg.dirty, Logger: log})
	if err != nil {
		return fmt.Errorf("opening layer store: %w", err)
	}
	src, err := agentSource(cfg.agent)
	if err != nil {
		return err
	}
	agentPath, err := control.InstallAgent(filepath.Join(data, "bin"), src)
	if err != nil {
		return err
	}
	// One set of template layer images for the ns and gvisor runtimes.
	lw, err := lowers.New(filepath.Join(data, "lowers"), log)
	if err != nil {
		return err
	}
	for _, old := range []string{filepath.Join(data, "run", "lowers"), filepath.Join(data, "run-gvisor", "lowers")} {
		_ = lowers.Discard(old) // where earlier versions kept them
	}
	nsrt, err := ns.New(ns.Config{RunRoot: filepath.Join(data, "run"), Lowers: lw, Logger: log})
	if err != nil {
		return err
	}
	runtimes := []runtime.Runtime{nsrt}
	unavailable := map[string]string{}
	// gvisor is offered where runsc is installed and runs a probe sandbox.
	if gv, err := gvisor.New(gvisor.Config{RunRoot: filepath.Join(data, "run-gvisor"),
		PlatformCache: "/run/atoll/gvisor-platform", Lowers: lw, Logger: log}); err != nil {
		log.Info("runtime gvisor not offered", "err", err)
		unavailable["gvisor"] = "runsc does not run sandboxes on this host"
		if errors.Is(err, gvisor.ErrNoRunsc) || errors.Is(err, lowers.ErrNoErofs) {
			unavailable["gvisor"] = err.Error()
		}
	} else {
		runtimes = append(runtimes, gv)
	}
	netm, err := startNetwork(cfg, log)
	if err != nil {
		return err
	}
	// vm is offered where QEMU and a guest kernel are installed.
	if vmrt, err := vm.New(vm.Config{RunRoot: filepath.Join(data, "run-vm"), AccelCache: "/run/atoll/vm-accel", Logger: log}); err != nil {
		log.Info("runtime vm not offered", "err", err)
		unavailable["vm"] = "QEMU does not run microVMs on this host"
		if errors.Is(err, vm.ErrNoQEMU) || errors.Is(err, vm.ErrNoKernel) {
			unavailable["vm"] = err.Error()
		}
	} else {
		runtimes = append(runtimes, vmrt)
	}
	var netPool *network.Pool
	if netm != nil {
		defer netm.Close()
		if cfg.netPool > 0 {
			netPool = network.NewPool(netm, cfg.netPool)
		}
	}
	svc, err := control.New(control.Config{
		Store: st, Layers: ls, Runtimes: runtimes, Unavailable: unavailable, AgentPath: agentPath, Logger: log,
		WarmPool: cfg.warmPool, Prestart: cfg.prestart, Archive: bucket,
		Network: netm, NetworkPool: netPool, CheckpointDir: filepath.Join(data, "checkpoints"),
	})
	if err != nil {
		return err
	}
	if err := svc.Recover(ctx); err != nil {
		return fmt.Errorf("recovering sandboxes: %w", err)
	}
	var proxy *portproxy.Proxy
	var proxyLn net.Listener
	if netm != nil && cfg.proxyListen != "" {
		if proxyLn, err = net.Listen("tcp", cfg.proxyListen); err != nil {
			return fmt.Errorf("--proxy-listen: %w", err)
		}
		defer proxyLn.Close()
		key, err := portproxy.LoadKey(filepath.Join(data, "port-key"))
		if err != nil {
			return err
		}
		proxy, err = portproxy.New(portproxy.Config{
			Sandboxes: svc, Key: key, Domain: cfg.proxyDomain,
			URLPort: proxyLn.Addr().(*net.TCPAddr).Port, Logger: log,
		})
		if err != nil {
			return err
		}
	}
	scfg := server.Config{Sandboxes: svc, Templates: svc.Templates(), Runtimes: svc, Auth: keys, Keys: keys, Logger: log, Version: version}
	if proxy != nil {
		scfg.Ports = proxy
	}
	srv, err := server.New(scfg)
	if err != nil {
		return err
	}
	handler := srv.Handler()
	if cfg.e2b {
		tokenKey, err := ensureSecret(filepath.Join(data, "e2b-token-key"))
		if err != nil {
			return err
		}
		ecfg := e2b.Config{Sandboxes: svc, Auth: keys, TokenKey: tokenKey, Logger: log}
		if proxy != nil {
			ecfg.Ports = proxy
		}
		e, err := e2b.New(ecfg)
		if err != nil {
			return err
		}
		defer e.Close()
		handler = withE2B(handler, e)
	}
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return err
	}
	url := "http://" + ln.Addr().String()
	if err := writeFileAtomic(filepath.Join(data, "url"), []byte(url+"\n"), 0o644); err != nil {
		return err
	}
	hs := server.NewHTTPServer(cfg.listen, handler)

	fmt.Fprintf(cfg.out, "atoll %s listening on %s\n", version, url)
	if key != "" {
		fmt.Fprintf(cfg.out, "API key (shown once, saved in %s): %s\n", keyPath, key)
	} else {
		fmt.Fprintf(cfg.out, "API key in %s\n", keyPath)
	}
	if proxy != nil {
		fmt.Fprintf(cfg.out, "port proxy listening on %s for *.%s\n", proxyLn.Addr(), cfg.proxyDomain)
	}
	fmt.Fprintf(cfg.out, "Try: atoll exec $(atoll create) -- python3 -c 'print(1)'\n")
	if cfg.e2b {
		fmt.Fprintf(cfg.out, "E2B SDKs: E2B_API_URL=%s E2B_SANDBOX_URL=%s (docs/e2b.md)\n", url, url)
	}

	var wg sync.WaitGroup
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if netm != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := netm.Run(runCtx); err != nil {
				log.Error("sandbox resolver and egress proxy stopped", "err", err)
			}
		}()
	}
	if netPool != nil {
		wg.Add(1)
		go func() { defer wg.Done(); netPool.Run(runCtx) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); svc.Run(runCtx) }()
	errc := make(chan error, 2)
	go func() { errc <- hs.Serve(ln) }()
	var ps *http.Server
	if proxy != nil {
		// The proxy's requests stream for as long as sandboxes' servers
		// answer (websockets, downloads): no write timeout.
		ps = &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
			MaxHeaderBytes: 4 * server.MaxHeaderBytes, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
		go func() { errc <- ps.Serve(proxyLn) }()
	}
	select {
	case err = <-errc:
	case <-ctx.Done():
		log.Info("shutting down; sandboxes keep running")
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		if ps != nil {
			ps.Shutdown(sctx)
		}
		err = hs.Shutdown(sctx)
		scancel()
	}
	cancel()
	wg.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// withE2B serves the E2B-compatible API beside atoll's: atoll's routes are
// all under /v1, E2B's never are, and sandbox traffic is marked by its
// headers or host whatever its path.
func withE2B(atoll http.Handler, e *e2b.Server) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/") && !e2b.IsSandboxRequest(r) {
			atoll.ServeHTTP(w, r)
			return
		}
		e.ServeHTTP(w, r)
	})
}

// ensureSecret returns the 32-byte secret kept at path, creating it (0600)
// on first use.
func ensureSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		if k, err := hex.DecodeString(strings.TrimSpace(string(b))); err == nil && len(k) >= 32 {
			return k, nil
		}
		return nil, fmt.Errorf("%s: want 64 hex digits; delete it to make a new one (invalidates E2B access tokens)", path)
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	k := make([]byte, 32)
	rand.Read(k)
	if err := writeFileAtomic(path, []byte(hex.EncodeToString(k)+"\n"), 0o600); err != nil {
		return nil, err
	}
	return k, nil
}

// agentSource picks the agent binary: the flag's, else an atoll-agent installed
// beside this binary (smaller, so sandboxes start faster), else this binary,
// which can act as the agent too (`go run ./cmd/atoll serve` needs no other build).
func agentSource(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	beside := filepath.Join(filepath.Dir(self), "atoll-agent")
	if fi, err := os.Stat(beside); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return beside, nil
	}
	return self, nil
}

// ensureAPIKey creates the first API key, the admin's, when the store has
// none: the key is written 0600 to data/api-key for the local CLI and only
// its hash is stored. It returns the key only when it was just created.
func ensureAPIKey(ctx context.Context, keys *auth.Keys, data string) (key, path string, err error) {
	path = filepath.Join(data, "api-key")
	key, err = keys.EnsureFirst(ctx, func(key string) error {
		return writeFileAtomic(path, []byte(key+"\n"), 0o600)
	})
	return key, path, err
}

// writeFileAtomic writes a file so that a crash leaves the old or the new
// content, never a mix: temp file, fsync, rename, fsync the directory.
func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
