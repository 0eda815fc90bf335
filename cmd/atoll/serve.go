package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/agentbin"
	"github.com/atoll-dev/atoll/internal/atomicfile"
	"github.com/atoll-dev/atoll/internal/audit"
	"github.com/atoll-dev/atoll/internal/auth"
	"github.com/atoll-dev/atoll/internal/blob"
	"github.com/atoll-dev/atoll/internal/control"
	"github.com/atoll-dev/atoll/internal/e2b"
	"github.com/atoll-dev/atoll/internal/events"
	"github.com/atoll-dev/atoll/internal/httpkit"
	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/mcp"
	"github.com/atoll-dev/atoll/internal/network"
	"github.com/atoll-dev/atoll/internal/node"
	"github.com/atoll-dev/atoll/internal/portproxy"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/runtime/gvisor"
	"github.com/atoll-dev/atoll/internal/runtime/lowers"
	"github.com/atoll-dev/atoll/internal/runtime/ns"
	"github.com/atoll-dev/atoll/internal/runtime/vm"
	"github.com/atoll-dev/atoll/internal/server"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
	"github.com/atoll-dev/atoll/internal/stscreds"
	"github.com/atoll-dev/atoll/internal/tlsca"
	"github.com/atoll-dev/atoll/internal/ui"
	"github.com/atoll-dev/atoll/internal/usage"
	"github.com/atoll-dev/atoll/internal/vault"
	"github.com/atoll-dev/atoll/internal/webhooks"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

type serveConfig struct {
	listen    string
	data      string
	agent     string
	imageSize int64
	dirty     int64
	fsync     bool // --sandbox-fsync
	warmPool  int
	prestart  int
	// creates in flight and waiting (admission control; 0: defaults)
	createConcurrency, createQueue int
	metricsInterval                time.Duration
	usageInterval                  time.Duration
	noUsage                        bool
	metricsListen                  string // address of the Prometheus metrics; "" for none
	archive                        string
	// cluster joins a cluster (--cluster and the --node- flags).
	cluster      clusterConfig
	e2b          bool
	debug        bool
	pprof        string // loopback address for net/http/pprof; "" for none
	cgroupParent string // names the runtimes' host cgroups (runtimeCgroups)
	out          io.Writer

	network     string // auto, on or off
	bridge      string
	subnet4     string
	subnet6     string
	netAllow    []string
	dnsUpstream []string
	netPool     int

	proxyListen string
	// vaultGitPort is the port on the sandboxes' gateway that serves
	// vaults' git URLs to mounted clones (0: none).
	vaultGitPort int
	// vaultSTSRole and vaultSTSEndpoint mint vaults' object-storage
	// credentials (stscreds): the role to assume, the STS endpoint.
	vaultSTSRole, vaultSTSEndpoint string
	proxyDomain                    string
	tlsListen                      string // HTTPS for the same handler, under the local CA; "" for none
	// auditRetention is how long the journal (audit log, events,
	// webhook deliveries) is kept.
	auditRetention time.Duration
	// webhookAllowPrivate lets webhooks reach private addresses;
	// webhookRetry is the wait before a failed delivery's first retry.
	webhookAllowPrivate bool
	webhookRetry        time.Duration
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
	f.BoolVar(&cfg.fsync, "sandbox-fsync", false, "make fsync inside ns and gvisor sandboxes reach the disk; by default their writes reach it by writeback alone, and deleting a sandbox does not sync every other's (docs/lifecycle.md)")
	f.IntVar(&cfg.warmPool, "warm-pool", 2, "default sandboxes to keep started ahead of demand (0: none); in cluster mode the most warm sandboxes a node keeps, sized by the demand for each template")
	f.IntVar(&cfg.prestart, "prestart", 4, "sandbox processes to keep started ahead of demand for forks and other creates (0: none); in cluster mode the most a node keeps, sized by its demand")
	f.IntVar(&cfg.createConcurrency, "create-concurrency", 0, "creates that may start sandboxes at once (default 4 per core); more wait in a queue")
	f.DurationVar(&cfg.metricsInterval, "metrics-interval", 5*time.Second, "how often running sandboxes are sampled for their metrics (E2B's interval is 5s)")
	f.DurationVar(&cfg.usageInterval, "usage-interval", usage.DefaultInterval, "how often every sandbox's usage is metered and written (at most 10s)")
	f.BoolVar(&cfg.noUsage, "no-usage", false, "do not meter usage (GET /v1/usage still answers from what was metered)")
	f.IntVar(&cfg.createQueue, "create-queue", 0, "creates that may wait for their turn (default 256); beyond it, and after 30 s of waiting, a create is answered 503 with Retry-After")
	f.StringVar(&cfg.archive, "archive", "", "object storage URL for archived sandboxes: file:///dir, or s3://bucket?region=R (S3-compatible: &endpoint=URL&use_path_style=true) with credentials from AWS_* variables or ~/.aws (default file://<data>/archive)")
	f.StringVar(&cfg.vaultSTSRole, "vault-sts-role", "", "IAM role (arn:aws:iam::ACCOUNT:role/NAME) that atoll vault credentials assumes through STS to mint temporary credentials limited to one vault's objects; needs an s3:// --blob (docs/vault.md)")
	f.StringVar(&cfg.vaultSTSEndpoint, "vault-sts-endpoint", "", "STS endpoint for --vault-sts-role (default: the AWS SDK's, or AWS_ENDPOINT_URL_STS; an S3-compatible store's own, e.g. MinIO's URL)")
	f.StringVar(&cfg.archive, "blob", "", "object storage every node of a cluster shares (--cluster): the same URLs as --archive, whose other name it is")
	f.StringVar(&cfg.cluster.url, "cluster", "", "join the cluster whose state is in this PostgreSQL database (postgres://USER:PASS@HOST/DB); one machine with embedded SQLite without it (docs/cluster.md)")
	f.StringVar(&cfg.cluster.name, "node-name", hostName(), "this node's name in its cluster (1-63 of [a-z0-9-])")
	f.StringVar(&cfg.cluster.listen, "node-listen", "", "address of this node's node-to-node listener (mutual TLS under the cluster's CA), e.g. 10.0.0.11:7443; required with --cluster")
	f.StringVar(&cfg.cluster.address, "node-address", "", "address other nodes reach this node's listener at (default: --node-listen's; goes into its certificate)")
	f.StringVar(&cfg.cluster.capacity, "node-capacity", "", "what this node offers the cluster, e.g. cpu=16,memory=60Gi,disk=500Gi,sandboxes=400 (default: the host's cores, memory less the host's share, the data directory's free space, 1000 sandboxes)")
	f.StringArrayVar(&cfg.cluster.labels, "node-label", nil, "label KEY=VALUE of this node, for node selectors and spreading (repeatable)")
	f.DurationVar(&cfg.cluster.lease, "node-lease", 15*time.Second, "how long this node stays live without a heartbeat; a node that misses its lease is fenced and its sandboxes are marked lost")
	f.BoolVar(&cfg.e2b, "e2b", true, "also serve the E2B-compatible API and sandbox traffic on the listener (see docs/e2b.md)")
	f.BoolVar(&cfg.debug, "debug", false, "log debug messages")
	f.StringVar(&cfg.metricsListen, "metrics-listen", "", `address to serve Prometheus metrics on at http://ADDR/metrics, without authentication ("": none; admin keys read them at GET /v1/metrics too); docs/operations.md`)
	f.StringVar(&cfg.pprof, "debug-pprof", "", "serve Go's profiles (net/http/pprof) at http://ADDR/debug/pprof/, on a loopback address only, without authentication")
	f.StringVar(&cfg.cgroupParent, "cgroup-parent", "atoll", `names the host cgroups below which sandboxes get theirs: /NAME (ns), /NAME-gvisor and /NAME-vm; servers that share a host each need their own, as they need their own --data and --network-bridge`)
	f.StringVar(&cfg.network, "network", "auto", "sandbox networking: auto (on if the kernel can enforce it), on or off")
	f.StringVar(&cfg.bridge, "network-bridge", "", `bridge for sandboxes; also names their namespaces and veths (default "atoll0")`)
	f.StringVar(&cfg.subnet4, "network-subnet4", "", "sandboxes' IPv4 subnet (default 10.213.0.0/16)")
	f.StringVar(&cfg.subnet6, "network-subnet6", "", "sandboxes' IPv6 /64 (default a unique local prefix derived from the bridge name)")
	f.StringArrayVar(&cfg.netAllow, "network-allow", nil, "private or special prefix that sandboxes may reach all the same, e.g. an internal mirror's 10.1.2.0/24 (repeatable)")
	f.StringArrayVar(&cfg.dnsUpstream, "dns-upstream", nil, "DNS server the sandboxes' resolver asks, ADDR or ADDR:PORT (repeatable; default the nameservers of /etc/resolv.conf)")
	f.IntVar(&cfg.netPool, "network-pool", 4, "network namespaces to keep made ahead of demand (0: none)")
	f.IntVar(&cfg.vaultGitPort, "vault-git-port", 7780, "port on the sandboxes' gateway address that serves vaults' git URLs, and nothing else, to the clones of vaults mounted in sandboxes (0: none; docs/vault.md)")
	f.StringVar(&cfg.proxyListen, "proxy-listen", "127.0.0.1:7401", `address of the port proxy, which serves sandboxes' ports at http://{port}-{id}.{domain}/ ("": none)`)
	f.StringVar(&cfg.proxyDomain, "proxy-domain", "localhost", "domain under which the port proxy serves sandboxes' ports (its names must resolve to the proxy)")
	f.StringVar(&cfg.tlsListen, "tls-listen", "", `address to serve the same API over HTTPS as well, with certificates for localhost and its subdomains from a CA kept in the data directory (<data>/tls-ca.pem, for clients to trust); E2B SDKs reach sandboxes' ports at https://{port}-{id}.localhost:PORT through it ("": none)`)
	f.BoolVar(&cfg.webhookAllowPrivate, "webhook-allow-private", false, "let webhooks reach private, loopback and link-local addresses (refused by default, so that a tenant cannot make the server call into its network)")
	f.DurationVar(&cfg.webhookRetry, "webhook-retry", webhooks.DefaultRetryAfter, "wait before a failed webhook delivery's first retry; each next waits twice as long, up to an hour, for a day")
	f.DurationVar(&cfg.auditRetention, "audit-retention", audit.DefaultRetention, "how long the audit log, lifecycle events and webhook deliveries are kept (0: forever)")
	return cmd
}

// networkConfig turns the network flags into a network.Config.
func networkConfig(cfg serveConfig, log *slog.Logger) (network.Config, error) {
	nc := network.Config{Bridge: cfg.bridge, Logger: log}
	var err error
	if cfg.vaultGitPort != 0 {
		if cfg.vaultGitPort < 0 || cfg.vaultGitPort > 65535 || cfg.vaultGitPort == 53 {
			return nc, fmt.Errorf("--vault-git-port %d: want a TCP port other than 53", cfg.vaultGitPort)
		}
		// The one host port sandboxes reach besides the resolver's, under
		// every egress policy.
		nc.GatewayTCPPorts = []uint16{53, uint16(cfg.vaultGitPort)}
	}
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
		p, err := parseOrAddr(a, netip.ParsePrefix, func(addr netip.Addr) netip.Prefix { return netip.PrefixFrom(addr, addr.BitLen()) })
		if err != nil {
			return nc, fmt.Errorf("--network-allow %q: want a CIDR prefix or an address", a)
		}
		nc.Allow = append(nc.Allow, p)
	}
	// Sandboxes never reach the networks this server listens on: that is
	// where its peers are (docs/network.md).
	addrs, err := listenAddrs(cfg.listen, cfg.proxyListen, cfg.tlsListen)
	if err != nil {
		return nc, err
	}
	if nc.Deny, err = network.PeerSubnets(addrs, cmp.Or(cfg.bridge, "atoll0")); err != nil {
		return nc, err
	}
	if len(nc.Deny) > 0 {
		log.Info("sandboxes are refused the networks the server listens on", "deny", fmt.Sprint(nc.Deny))
	}
	for _, u := range cfg.dnsUpstream {
		ap, err := parseOrAddr(u, netip.ParseAddrPort, func(addr netip.Addr) netip.AddrPort { return netip.AddrPortFrom(addr, 53) })
		if err != nil {
			return nc, fmt.Errorf("--dns-upstream %q: want ADDR or ADDR:PORT", u)
		}
		nc.Upstream = append(nc.Upstream, ap)
	}
	return nc, nil
}

// parseOrAddr parses s with parse or, failing that, as a bare address
// that whole makes into a T: a prefix of one address, the default port.
func parseOrAddr[T any](s string, parse func(string) (T, error), whole func(netip.Addr) T) (T, error) {
	if v, err := parse(s); err == nil {
		return v, nil
	}
	addr, err := netip.ParseAddr(s)
	if err != nil {
		var zero T
		return zero, err
	}
	return whole(addr), nil
}

// listenAddrs are the IP addresses of listeners (HOST:PORT, "" for
// none): an empty host is the unspecified address, a name is looked up.
func listenAddrs(listeners ...string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, l := range listeners {
		if l == "" {
			continue
		}
		host, _, err := net.SplitHostPort(l)
		if err != nil {
			return nil, fmt.Errorf("listen address %q: %w", l, err)
		}
		if host == "" {
			out = append(out, netip.IPv6Unspecified())
			continue
		}
		if a, err := netip.ParseAddr(host); err == nil {
			out = append(out, a)
			continue
		}
		as, err := net.DefaultResolver.LookupNetIP(context.Background(), "ip", host)
		if err != nil {
			return nil, fmt.Errorf("listen address %q: %w", l, err)
		}
		out = append(out, as...)
	}
	return out, nil
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

// serve runs the server: it builds its parts in named steps, each over the
// parts the steps before it made, then serves until ctx ends.
func serve(ctx context.Context, cfg serveConfig) error {
	if os.Geteuid() != 0 {
		return errors.New("atoll serve needs root: sandboxes are made of namespaces, cgroups and mounts (try: sudo atoll serve)")
	}
	// The server's live heap is small and most of what it allocates (a
	// request's rows and JSON) dies young. At Go's default (GOGC=100) its
	// collections took about 3% of its CPU in a sustained run of creates
	// and deletes (issue #13); twice the heap between them halves that.
	// GOGC in the environment still decides.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(200)
	}
	level := slog.LevelInfo
	if cfg.debug {
		level = slog.LevelDebug
	}
	s := &serving{cfg: cfg, log: slog.New(httpkit.LogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))}
	if cfg.cluster.url != "" {
		s.cluster.cfg = cfg.cluster
	}
	defer s.close()
	steps := []func(context.Context) error{
		s.openData,
		s.openStores,
		s.installAgent, // a binary that cannot be the agent fails before the layer image is made
		s.openLayers,
		s.startRuntimes,
		s.startNetwork,
		s.assembleNode,
		s.joinCluster,
		s.startControl,
		s.startPortProxy,
		s.buildHandler,
		s.listen,
		s.listenNode,
	}
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return err
		}
	}
	s.announce()
	return s.run(ctx)
}

// serving is what serve's steps build.
type serving struct {
	cfg serveConfig
	log *slog.Logger
	dir dataDir
	// closers undo steps, last first (close).
	closers []func()

	archive blob.Store
	// vaultCreds mints vaults' S3 credentials; nil without --vault-sts-role.
	vaultCreds *stscreds.Minter
	// drain is this node's drain, while it is draining (move.go).
	drain drainer
	// state is the state store: SQLite on one machine; in a cluster the
	// PostgreSQL store, then (joinCluster) its view fenced by this node's
	// epoch.
	state        store.Store
	cluster      clustering
	keys         *auth.Keys
	key, keyPath string // the API key, if just made, and its file
	layers       *layers.Store
	agentPath    string
	runtimes     []runtime.Runtime
	unavailable  map[string]string
	netm         *network.Manager
	netPool      *network.Pool
	node         *node.Node
	svc          *control.Service
	events       *events.Bus
	hooks        *webhooks.Service
	proxy        *portproxy.Proxy
	proxyLn      net.Listener
	handler      http.Handler
	mcp          *mcp.Handler // /v1/mcp
	// mounts clone vaults into sandboxes; nil when vaults are off.
	mounts *vaultMounts
	// local is handler without the cluster's router: what a request routed
	// here from another node is served with.
	local http.Handler
	ln    net.Listener
	url   string
	tls   *http.Server // nil without --tls-listen
	tlsLn net.Listener
}

func (s *serving) onClose(f func()) { s.closers = append(s.closers, f) }

// listenFor listens on addr, the value of flag, until serve ends.
func (s *serving) listenFor(flag, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	s.onClose(func() { ln.Close() })
	return ln, nil
}

func (s *serving) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
}

// openData makes or checks the data directory.
func (s *serving) openData(context.Context) (err error) {
	if _, err := runtimeCgroups(s.cfg.cgroupParent); err != nil {
		return err // before anything is made
	}
	s.dir, err = openDataDir(s.cfg.data)
	return err
}

// openStores opens the archive store and the state store, making the
// first API key if it has none. The archive URL first: a wrong one fails
// before the layer image is made.
func (s *serving) openStores(ctx context.Context) error {
	// Rows are whole seconds long, and billing promises 10 s at most.
	if i := s.cfg.usageInterval; i < time.Second || i > usage.DefaultInterval || i%time.Second != 0 {
		return fmt.Errorf("--usage-interval %s: want whole seconds from 1s to %s", i, usage.DefaultInterval)
	}
	archiveURL := s.cfg.archive
	if archiveURL == "" {
		if s.cfg.cluster.url != "" {
			// A node's archive must be restorable on every other node.
			return errors.New("--cluster needs --blob: object storage every node reaches (s3://bucket?..., or file:///dir on a filesystem they share)")
		}
		archiveURL = "file://" + s.dir.Archive()
	}
	bucket, err := blob.Open(ctx, archiveURL)
	if err != nil {
		return fmt.Errorf("--archive: %w", err)
	}
	s.archive = blob.Metered(bucket)
	s.onClose(func() { bucket.Close() })
	if s.cfg.vaultSTSRole != "" {
		// Vaults' credentials name the store's bucket and prefix.
		if !strings.HasPrefix(archiveURL, "s3://") {
			return errors.New("--vault-sts-role needs an s3:// object store (--blob s3://bucket?...): the credentials it mints are S3's")
		}
		if s.vaultCreds, err = stscreds.New(ctx, stscreds.Config{RoleARN: s.cfg.vaultSTSRole, BlobURL: archiveURL, STSEndpoint: s.cfg.vaultSTSEndpoint}); err != nil {
			return fmt.Errorf("--vault-sts-role: %w", err)
		}
	}
	if s.cfg.cluster.url != "" {
		if err := s.openCluster(ctx); err != nil {
			return err
		}
		s.state = s.cluster.store
	} else {
		st, err := sqlite.Open(s.dir.Store())
		if err != nil {
			return fmt.Errorf("opening store: %w", err)
		}
		s.state = st
		s.onClose(func() { st.Close() })
	}
	s.keys = auth.New(s.state)
	if s.key, s.keyPath, err = ensureAPIKey(ctx, s.keys, s.dir); err != nil {
		return err
	}
	return nil
}

// openLayers opens the node's layer store.
func (s *serving) openLayers(context.Context) (err error) {
	s.layers, err = layers.Open(layers.Config{Dir: s.dir.Layers(), ImageSize: s.cfg.imageSize, DirtyLimit: s.cfg.dirty, Logger: s.log})
	if err != nil {
		return fmt.Errorf("opening layer store: %w", err)
	}
	return nil
}

// installAgent installs the agent binary sandboxes run as PID 1.
func (s *serving) installAgent(context.Context) error {
	src, self, err := agentSource(s.cfg.agent)
	if err != nil {
		return err
	}
	if self {
		s.log.Warn("no atoll-agent beside this binary: sandboxes run all of atoll as their agent, which costs each start about 20 ms of CPU more; build both (go build -o DIR/ ./cmd/atoll ./cmd/atoll-agent) or pass --agent",
			"binary", src)
	}
	s.agentPath, err = agentbin.Install(s.dir.Bin(), src)
	return err
}

// startRuntimes makes the runtimes this host can offer: ns always, gvisor
// and vm where they work. Where a runtime does not, its constructor's error
// is the reason clients see: the missing package, or the probe and what it
// printed, for the operator to act on.
func (s *serving) startRuntimes(context.Context) error {
	// One set of template layer images for the ns and gvisor runtimes.
	lw, err := lowers.New(s.dir.Lowers(), s.log)
	if err != nil {
		return err
	}
	for _, old := range s.dir.OldLowers() {
		_ = lowers.Discard(old) // where earlier versions kept them
	}
	cg, err := runtimeCgroups(s.cfg.cgroupParent)
	if err != nil {
		return err
	}
	nsrt, err := ns.New(ns.Config{RunRoot: s.dir.Run("ns"), Lowers: lw, CgroupParent: cg.ns, SandboxFsync: s.cfg.fsync, Logger: s.log})
	if err != nil {
		return err
	}
	s.runtimes = []runtime.Runtime{nsrt}
	s.unavailable = map[string]string{}
	offer := func(name string, rt runtime.Runtime, err error) {
		if err == nil {
			err = checkSocketPaths(rt)
		}
		if err != nil {
			s.log.Info("runtime "+name+" not offered", "err", err)
			s.unavailable[name] = err.Error()
			return
		}
		s.runtimes = append(s.runtimes, rt)
	}
	// gvisor is offered where runsc is installed and runs a probe sandbox.
	gv, err := gvisor.New(gvisor.Config{RunRoot: s.dir.Run("gvisor"),
		PlatformCache: "/run/atoll/gvisor-platform", Lowers: lw, CgroupParent: cg.gvisor, SandboxFsync: s.cfg.fsync, Logger: s.log})
	offer("gvisor", gv, err)
	// vm is offered where QEMU and a guest kernel are installed.
	vmrt, err := vm.New(vm.Config{RunRoot: s.dir.Run("vm"), AccelCache: "/run/atoll/vm-accel", CgroupParent: cg.vm, Logger: s.log})
	offer("vm", vmrt, err)
	return nil
}

// cgroupParents are the host cgroups below which each runtime makes its
// sandboxes' own.
type cgroupParents struct{ ns, gvisor, vm string }

// runtimeCgroups derives the runtimes' cgroup parents from --cgroup-parent:
// one name, so that a server's cgroups are all found by it and a second
// server on the host needs one flag to keep out of them. Each runtime
// reconciles only the sandboxes of its own data directory, but a kill of
// everything in a cgroup, or an operator's look at one, must never meet
// another server's processes.
func runtimeCgroups(name string) (cgroupParents, error) {
	if !validCgroupName(name) {
		return cgroupParents{}, fmt.Errorf("--cgroup-parent %q: want 1 to 64 bytes of [a-z0-9_-], starting with a letter", name)
	}
	return cgroupParents{ns: "/" + name, gvisor: "/" + name + "-gvisor", vm: "/" + name + "-vm"}, nil
}

func validCgroupName(s string) bool {
	if len(s) == 0 || len(s) > 64 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// startNetwork gives sandboxes networks, unless --network says not to.
func (s *serving) startNetwork(context.Context) error {
	netm, err := startNetwork(s.cfg, s.log)
	if err != nil || netm == nil {
		return err
	}
	s.netm = netm
	s.onClose(func() { netm.Close() })
	if s.cfg.netPool > 0 {
		s.netPool = network.NewPool(netm, s.cfg.netPool)
	}
	return nil
}

// assembleNode puts the parts that run sandboxes (the layer store, the
// agent, the runtimes, the network) together as this machine's node.
func (s *serving) assembleNode(context.Context) error {
	s.node = node.New(node.Config{
		Name:     s.cluster.cfg.name,
		Runtimes: s.runtimes, Unavailable: s.unavailable, Layers: s.layers, AgentPath: s.agentPath,
		Network: s.netm, NetworkPool: s.netPool, CheckpointDir: s.dir.Checkpoints(),
	})
	return nil
}

// startControl makes the control plane, the sandbox state machine, over
// the store and the node, and reconciles it with what the node runs.
func (s *serving) startControl(ctx context.Context) error {
	cfg := s.cfg
	// Lifecycle events go to the store's journal; the webhooks' sender
	// delivers them (and, being woken, at once).
	s.hooks = webhooks.New(webhooks.Config{Store: s.state, AllowPrivate: cfg.webhookAllowPrivate, RetryAfter: cfg.webhookRetry, Logger: s.log})
	s.events = events.New(events.Config{Journal: s.state, Logger: s.log, Written: s.hooks.Kick})
	s.onClose(s.events.Close)
	ccfg := control.Config{
		Store: s.state, Node: s.node, Logger: s.log, Events: s.events,
		WarmPool: cfg.warmPool, Prestart: cfg.prestart, Archive: s.archive,
		CreateConcurrency: cfg.createConcurrency, CreateQueue: cfg.createQueue, MetricsInterval: cfg.metricsInterval,
		UsageInterval: cfg.usageInterval, NoUsage: cfg.noUsage,
	}
	if s.cluster.member != nil {
		ccfg.Placer, ccfg.Peers, ccfg.Mover = placer{s.cluster.sched}, peers{&s.cluster}, mover{&s.cluster}
		ccfg.Demand, ccfg.Capacity = s.cluster.store.Demand, s.cluster.capacity
		ccfg.TakeCreates, ccfg.BlobPins = s.cluster.store.TakeCreates, s.cluster.store
	}
	svc, err := control.New(ccfg)
	if err != nil {
		return err
	}
	s.svc = svc
	if err := svc.Recover(ctx); err != nil {
		return fmt.Errorf("recovering sandboxes: %w", err)
	}
	return nil
}

// startPortProxy listens for sandbox port traffic (with networks and
// --proxy-listen only).
func (s *serving) startPortProxy(ctx context.Context) error {
	if s.netm == nil || s.cfg.proxyListen == "" {
		return nil
	}
	ln, err := s.listenFor("--proxy-listen", s.cfg.proxyListen)
	if err != nil {
		return err
	}
	s.proxyLn = ln
	key, err := s.secret(ctx, "port-key", s.dir.PortKey(), portproxy.LoadKey)
	if err != nil {
		return err
	}
	s.proxy, err = portproxy.New(portproxy.Config{
		Sandboxes: s.svc, Key: key, Domain: s.cfg.proxyDomain,
		URLPort: ln.Addr().(*net.TCPAddr).Port, Logger: s.log,
	})
	return err
}

// buildHandler is the API: atoll's REST API, and E2B's beside it with
// --e2b.
func (s *serving) buildHandler(ctx context.Context) error {
	// The audit log records every request that asks for a change, on
	// the node that serves it (so around local, not the router), with
	// the key that asked.
	retention := s.cfg.auditRetention
	if retention == 0 {
		retention = -1 // forever
	}
	rec := audit.New(audit.Config{Journal: s.state, Retention: retention, Skip: notAnAction, Logger: s.log})
	s.onClose(rec.Close)
	keys := rec.Auth(s.keys)
	scfg := server.Config{Sandboxes: s.svc, Templates: s.svc.Templates(), Runtimes: s.svc, Auth: keys, Keys: s.keys, Tenants: s.svc.Tenants(),
		Usage: usage.Reporter{Store: s.state}, Audit: rec, Events: s.events, Webhooks: s.hooks, Logger: s.log, Version: version}
	// Memory vaults: packs in the archive's object store, refs in the
	// state store; git is needed (the README's packages have it).
	// Mounts counts the sandboxes that mount a vault (vaultmount.go),
	// made once the vaults are.
	var mounts *vaultMounts
	vcfg := vault.Config{Store: s.state, Blob: s.archive, Dir: s.dir.Vaults(), Logger: s.log,
		Mounts: func(ctx context.Context, t, name string) (int, error) { return mounts.count(ctx, t, name) }}
	if s.vaultCreds != nil {
		vcfg.Credentials = s.vaultCreds
	}
	vcfg.Sandboxes = summarizerSandboxes{svc: s.svc, log: s.log}
	vcfg.LayerMade = s.svc.PrepareVaultLayer
	tick, err := vaultScheduleTick()
	if err != nil {
		return err
	}
	vaults, err := vault.New(vcfg)
	switch {
	case errors.Is(err, vault.ErrNoGit):
		// Sandboxes do not need vaults: the vault routes answer 503.
		s.log.Warn("memory vaults are off", "err", err)
	case err != nil:
		return err
	default:
		// The compaction schedules, run by every node; the store
		// gives each compaction to one.
		sctx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); vaults.RunSchedules(sctx, tick) }()
		s.onClose(func() { stop(); <-done; vaults.Close() })
		scfg.Vaults = vaults
		if mounts, err = s.startVaultMounts(ctx, vaults); err != nil {
			return err
		}
		scfg.VaultMounts = mounts
		s.mounts = mounts
		s.svc.SetVaultLayers(mounts)
	}
	if s.cluster.store != nil {
		scfg.Nodes = nodes{s.cluster.store}
		scfg.Ready = s.cluster.ready
	}
	if s.proxy != nil {
		scfg.Ports = s.proxy
	}
	// MCP at /v1/mcp: its tools call this server's own listener with
	// the key of the session's first request (internal/mcp).
	s.mcp = mcp.NewHandler(mcp.HandlerConfig{URL: func() string { return s.url }, Version: version, Logger: s.log})
	scfg.MCP = s.mcp
	scfg.Metrics = s.metricsHandler()
	srv, err := server.New(scfg)
	if err != nil {
		return err
	}
	s.local = srv.Handler()
	// The dashboard is static files that call the API like any client:
	// every node serves its own copy, in front of the cluster's router.
	// One request ID from the first node a request reaches (httpkit.RequestID).
	defer func() {
		// Requests routed here from another node come with theirs.
		s.local = httpkit.RequestID(rec.Wrap(s.local))
		s.handler = httpkit.RequestID(ui.Mount(s.route(s.local)))
	}()
	if !s.cfg.e2b {
		return nil
	}
	tokenKey, err := s.secret(ctx, "e2b-token-key", s.dir.E2BTokenKey(), ensureSecret)
	if err != nil {
		return err
	}
	ecfg := e2b.Config{Sandboxes: s.svc, Templates: s.svc.Templates(), Auth: keys, TokenKey: tokenKey, Logger: s.log}
	if s.proxy != nil {
		ecfg.Ports = s.proxy
	}
	e, err := e2b.New(ecfg)
	if err != nil {
		return err
	}
	s.onClose(func() { e.Close() })
	s.local = withE2B(s.local, e)
	return nil
}

// secret is the 32-byte key kept in the data directory's file path (made
// by load when there is none), or in a cluster the one every node shares,
// kept in the cluster's store under name: a port URL or an E2B access
// token signed by one node must be good on all.
func (s *serving) secret(ctx context.Context, name, path string, load func(string) ([]byte, error)) ([]byte, error) {
	if s.cluster.store == nil {
		return load(path)
	}
	return s.cluster.store.Secret(ctx, name, func() ([]byte, error) {
		k := make([]byte, 32)
		_, err := rand.Read(k)
		return k, err
	})
}

// route puts the cluster's router in front of h: a request about a
// sandbox another node runs goes there. On one machine it is h.
func (s *serving) route(h http.Handler) http.Handler {
	if s.cluster.router == nil {
		return h
	}
	return s.cluster.gate(s.cluster.router.Wrap(h))
}

// listen opens the API's listeners, and writes their URLs for the local
// CLI.
func (s *serving) listen(context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.listen)
	if err != nil {
		return err
	}
	s.ln = ln
	s.url = "http://" + ln.Addr().String()
	if err := atomicfile.Write(s.dir.URL(), []byte(s.url+"\n"), 0o644); err != nil {
		return err
	}
	if s.cfg.tlsListen == "" {
		return nil
	}
	ca, err := tlsca.Load(s.dir.CA())
	if err != nil {
		return err
	}
	tlsLn, err := s.listenFor("--tls-listen", s.cfg.tlsListen)
	if err != nil {
		return err
	}
	s.tlsLn = tlsLn
	_, port, _ := net.SplitHostPort(tlsLn.Addr().String())
	if err := atomicfile.Write(s.dir.TLSURL(), []byte("https://localhost:"+port+"\n"), 0o644); err != nil {
		return err
	}
	ts := server.NewHTTPServer(s.cfg.tlsListen, s.handler)
	// HTTP/1.1 only, as on the plain listener: streams and websockets
	// through the port proxy rely on it.
	ts.TLSConfig = &tls.Config{GetCertificate: ca.GetCertificate, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
	ts.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
	s.tls = ts
	return nil
}

// announce tells the operator where the server is and how to reach it.
func (s *serving) announce() {
	out, url := s.cfg.out, s.url
	fmt.Fprintf(out, "atoll %s listening on %s\n", version, url)
	switch _, err := os.Stat(s.keyPath); {
	case s.key != "":
		fmt.Fprintf(out, "API key (shown once, saved in %s): %s\n", s.keyPath, s.key)
	case err == nil:
		fmt.Fprintf(out, "API key in %s\n", s.keyPath)
	default:
		// A cluster's keys are the cluster's: the node that made the
		// first one wrote it.
		fmt.Fprintf(out, "API keys are the cluster's: use one made on any node (the first is in the api-key file of the node that made it)\n")
	}
	if s.cluster.member != nil {
		fmt.Fprintf(out, "node %s of the cluster, epoch %d, node-to-node listener on %s\n", s.cluster.cfg.name, s.cluster.member.Epoch(), s.cluster.ln.Addr())
	}
	if s.proxy != nil {
		fmt.Fprintf(out, "port proxy listening on %s for *.%s\n", s.proxyLn.Addr(), s.cfg.proxyDomain)
	}
	tlsPort := ""
	if s.tls != nil {
		_, tlsPort, _ = net.SplitHostPort(s.tlsLn.Addr().String())
		fmt.Fprintf(out, "HTTPS on %s (https://localhost:%s, https://*.localhost:%s) with certificates from the CA %s\n",
			s.tlsLn.Addr(), tlsPort, tlsPort, s.dir.CACert())
	}
	fmt.Fprintf(out, "Web dashboard: %s%s (sign in with an API key)\n", url, ui.Prefix)
	fmt.Fprintf(out, "Try: atoll exec $(atoll create) -- python3 -c 'print(1)'\n")
	if s.cfg.e2b {
		hosts := ""
		if tlsPort != "" {
			hosts = fmt.Sprintf(" E2B_DOMAIN=localhost:%s NODE_EXTRA_CA_CERTS=%s", tlsPort, s.dir.CACert())
		}
		fmt.Fprintf(out, "E2B SDKs: E2B_API_URL=%s E2B_SANDBOX_URL=%s%s (docs/e2b.md)\n", url, url, hosts)
	}
}

// run serves until ctx ends or a listener fails, with the background work
// (the network's resolver and proxy, its pool, the state machine's loops)
// running beside; then it drains the listeners, leaving sandboxes running
// for the next start to re-adopt.
func (s *serving) run(ctx context.Context) error {
	log := s.log
	var wg sync.WaitGroup
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if s.cfg.pprof != "" {
		stopPprof, err := servePprof(s.cfg.pprof, log)
		if err != nil {
			return err
		}
		defer stopPprof()
	}
	if s.cfg.metricsListen != "" {
		stop, err := serveMetrics(s.cfg.metricsListen, s.metricsHandler(), log)
		if err != nil {
			return err
		}
		defer stop()
	}
	if s.netm != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.netm.Run(runCtx); err != nil {
				log.Error("sandbox resolver and egress proxy stopped", "err", err)
			}
		}()
	}
	if s.netPool != nil {
		wg.Add(1)
		go func() { defer wg.Done(); s.netPool.Run(runCtx) }()
	}
	wg.Add(2)
	go func() { defer wg.Done(); s.svc.Run(runCtx) }()
	go func() { defer wg.Done(); s.hooks.Run(runCtx) }()
	hs := server.NewHTTPServer(s.cfg.listen, s.handler)
	// Event streams never end on their own: a shutdown ends them.
	hs.RegisterOnShutdown(s.events.EndStreams)
	errc := make(chan error, 5)
	go func() { errc <- hs.Serve(s.ln) }()
	if s.cluster.member != nil {
		s.runCluster(runCtx, errc)
	}
	if s.tls != nil {
		s.tls.RegisterOnShutdown(s.events.EndStreams)
		go func() { errc <- s.tls.ServeTLS(s.tlsLn, "", "") }()
	}
	var ps *http.Server
	if s.proxy != nil {
		// The proxy's requests stream for as long as sandboxes' servers
		// answer (websockets, downloads): no write timeout.
		var proxy http.Handler = s.proxy
		if s.cluster.router != nil {
			proxy = s.cluster.router.For("ports").Wrap(proxy)
		}
		ps = &http.Server{Handler: proxy, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
			MaxHeaderBytes: 4 * server.MaxHeaderBytes, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
		go func() { errc <- ps.Serve(s.proxyLn) }()
	}
	var err error
	select {
	case err = <-errc:
	case <-ctx.Done():
		log.Info("shutting down; sandboxes keep running")
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		if ps != nil {
			ps.Shutdown(sctx)
		}
		if s.tls != nil {
			s.tls.Shutdown(sctx)
		}
		if s.cluster.srv != nil {
			s.cluster.srv.Shutdown(sctx)
		}
		// MCP sessions' streams stay open until ended.
		if s.mcp != nil {
			s.mcp.Close()
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

// notAnAction is a request the audit log leaves out although its method
// may change something: traffic to a sandbox's own daemons (envd, its
// ports), which is the sandbox's business, and git fetches of vaults,
// which are POSTs that read.
func notAnAction(r *http.Request) bool {
	if e2b.IsSandboxRequest(r) {
		return true
	}
	return strings.HasPrefix(r.URL.Path, server.GitPrefix) && !strings.HasSuffix(r.URL.Path, "/git-receive-pack")
}

// withE2B serves the E2B-compatible API beside atoll's: atoll's routes are
// all under /v1, E2B's never are, and sandbox traffic is marked by its
// headers or host whatever its path.
func withE2B(atoll http.Handler, e *e2b.Server) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Vaults' git URLs (/git/) are atoll's too.
		if strings.HasPrefix(r.URL.Path, "/v1/") && !e2b.IsSandboxRequest(r) || strings.HasPrefix(r.URL.Path, server.GitPrefix) {
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
	if err := atomicfile.Write(path, []byte(hex.EncodeToString(k)+"\n"), 0o600); err != nil {
		return nil, err
	}
	return k, nil
}

// agentSource picks the agent binary: the flag's, else an atoll-agent installed
// beside this binary, else this binary, which can act as the agent too
// (`go run ./cmd/atoll serve` needs no other build) but costs each sandbox
// far more: every start runs the package initialization of all of atoll
// (about 20 ms of CPU, against 3 for atoll-agent), which halved the
// sustained create rate (docs/benchmarks.md, issue #13). self is true then.
func agentSource(flag string) (path string, self bool, err error) {
	if flag != "" {
		return flag, false, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", false, err
	}
	beside := filepath.Join(filepath.Dir(exe), "atoll-agent")
	if fi, err := os.Stat(beside); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return beside, false, nil
	}
	return exe, true, nil
}

// ensureAPIKey creates the first API key, the admin's, when the store has
// none: the key is written 0600 to the data directory's APIKey file for the
// local CLI and only its hash is stored. It returns the key only when it
// was just created.
func ensureAPIKey(ctx context.Context, keys *auth.Keys, dir dataDir) (key, path string, err error) {
	path = dir.APIKey()
	key, err = keys.EnsureFirst(ctx, func(key string) error {
		return atomicfile.Write(path, []byte(key+"\n"), 0o600)
	})
	return key, path, err
}

// servePprof serves net/http/pprof's handlers on addr, which must be a
// loopback address: the profiles have no authentication and show the
// server's internals, so they are for the machine's admin alone.
func servePprof(addr string, log *slog.Logger) (stop func(), err error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("--debug-pprof: %w", err)
	}
	if ip, err := netip.ParseAddr(host); err != nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("--debug-pprof %q: want a loopback address, e.g. 127.0.0.1:6060", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--debug-pprof: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	// Where goroutines wait (store transactions, locks), not only where
	// they run: a burst of creates is bound by waiting as much as by CPU.
	goruntime.SetBlockProfileRate(int(time.Millisecond))
	goruntime.SetMutexProfileFraction(10)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(ln)
	log.Info("serving Go profiles", "addr", ln.Addr().String())
	return func() { hs.Close() }, nil
}

// checkTraversable refuses a data directory that sandboxes cannot reach:
// their processes run as unprivileged host users, which must pass through
// every directory above it to exec the agent and reach their own roots. A
// directory made by mktemp -d (mode 0700) above it would otherwise let the
// server start and every create fail.
func checkTraversable(data string) error {
	real, err := filepath.EvalSymlinks(data)
	if err != nil {
		return err
	}
	for p := filepath.Dir(real); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("--data %s: %s (mode %04o) cannot be passed through by other users, and sandboxes run as unprivileged users that must reach their files under it; "+
				"run chmod o+x %s, or choose a --data elsewhere", data, p, fi.Mode().Perm(), p)
		}
		if p == "/" {
			return nil
		}
	}
}

// socketPathMax is the longest path a unix socket may have: sun_path's 108
// bytes less the terminating NUL.
const socketPathMax = 107

// checkSocketPaths makes sure rt's agent sockets' paths fit in a unix
// socket's address (see checkSocketPath).
func checkSocketPaths(rt runtime.Runtime) error {
	sp, ok := rt.(interface{ SocketPath(id string) string })
	if !ok {
		return nil
	}
	return checkSocketPath(sp.SocketPath(strings.Repeat("x", api.SandboxIDLen)))
}

// checkSocketPath makes sure p, an agent socket's path, fits in a unix
// socket's address. Those paths hold the data directory's; one too long
// made every start fail at the agent's dial with "invalid argument".
func checkSocketPath(p string) error {
	if len(p) > socketPathMax {
		return fmt.Errorf("its sandboxes' agent sockets' paths, such as %s (%d bytes), pass the %d bytes a unix socket's path may hold: start atoll serve with a shorter --data", p, len(p), socketPathMax)
	}
	return nil
}
