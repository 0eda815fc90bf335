// Package vault keeps memory vaults: a tenant's git repositories of
// Markdown, served over git's smart HTTP protocol (git.go) so that the
// stock git client clones, fetches and pushes them.
//
// A vault's truth is in two places that outlive any node: its objects are
// packs in the object store (blob.Store, under vaults/<id>/packs/), and its
// refs are rows of the state store (store.Vaults) together with the names
// of those packs. A push is acknowledged only after both: git's
// pre-receive hook (git.go) hands the received pack to this package,
// which writes it to the object store, then moves the refs in one store
// transaction, compare-and-set on their old values; only then does the
// hook let git accept the push. A bare repository on local disk under
// Config.Dir is a cache of that truth (repo.go), rebuilt from it when
// missing and brought up to it before every request.
package vault

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/atomicfile"
	"github.com/atoll-dev/atoll/internal/blob"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/stscreds"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// Config configures a Service. Store, Blob and Dir are required.
type Config struct {
	Store Store
	// Blob is the object store the packs go to: the archive's.
	Blob blob.Store
	// Dir holds the local cache of bare repositories.
	Dir string
	// Git is the git binary; default "git" from $PATH.
	Git string
	// MaxPush bounds a push's request body and its pack, in bytes;
	// default DefaultMaxPush. A larger push is refused with 413.
	MaxPush int64
	// Mounts, if set, counts the sandboxes that mount vault name of
	// tenant t; Delete refuses a vault they mount unless forced. nil:
	// none ever does (sandboxes do not mount vaults yet).
	Mounts func(ctx context.Context, t, name string) (int, error)
	// LayerMade, if set, is told of each mount's layer made (layer.go),
	// for the runtimes to make their images of it ahead.
	LayerMade func(ctx context.Context, dir string)
	// Credentials, if set, mints object-storage credentials limited to a
	// vault's objects (stscreds.Minter); nil: Credentials answers
	// errdefs.ErrConflict, the server has no S3 store or no role.
	Credentials Minter
	// Sandboxes, if set, make the sandboxes that command summarizers
	// run in (summarizer.go); nil: a compaction with one is
	// errdefs.ErrUnavailable.
	Sandboxes Sandboxes
	Logger    *slog.Logger // default slog.Default()
}

// Store is what the vaults keep in the state store.
type Store interface {
	store.Vaults
	store.VaultSchedules
}

// Minter mints temporary object-storage credentials for the objects of
// vault id of tenant (stscreds.Minter).
type Minter interface {
	Mint(ctx context.Context, tenant, id string, ttl time.Duration, readOnly bool) (api.VaultCredentials, error)
}

// Limits.
const (
	DefaultMaxPush = 256 << 20
	// MaxRefs bounds a vault's refs: thousands of refs are refused.
	MaxRefs = 1000
	// MaxFile bounds what Show returns.
	MaxFile = 32 << 20
)

// ErrNoGit is New's error on a host without git, which serves the
// protocol (git http-backend), or without bash, which runs its hook.
var ErrNoGit = errors.New("vault: git and bash are needed to serve vaults (apt-get install git)")

// Service serves vaults.
type Service struct {
	cfg Config
	log *slog.Logger
	git string
	// backend and backendArgs run git http-backend.
	backend     string
	backendArgs []string
	ln          net.Listener   // the hooks' (git.go)
	wg          sync.WaitGroup // the hook listener and its connections

	// mu guards locks, pushes, conns and closed.
	mu sync.Mutex
	// locks serialize, per vault ID, the bringing of the cache up to the
	// store and the pushes through this node (see lock).
	locks map[string]*vaultLock
	// mounted are, by vault ID, the mounts of it this node made as
	// layers, latest first, without their commits (layer.go).
	mounted map[string][]LayerSpec
	// layerUsed are when layers were last asked for (layer.go).
	layerUsed map[string]time.Time
	// lastLayer are the last layers made, by mount (a LayerSpec's key
	// without its commit): the next commit's is made from it.
	lastLayer map[string]lastLayers
	// building are the temporary directories of the layers being made,
	// by name, which the sweep leaves; runID starts this run's names of
	// them, tmpSeq ends them (layer.go).
	building map[string]bool
	runID    string
	tmpSeq   int
	// pushes are the pushes under way, by their token (git.go).
	pushes map[string]*push
	// conns are the hooks' connections being served; closed, Close.
	conns  map[net.Conn]struct{}
	closed bool

	// idx are the vaults' search indexes (index.go).
	idx *indexes
	// adverts are the vaults' ref advertisements (advert.go).
	adverts adverts
	// sweeps are the sweeps of unrecorded packs (packs.go).
	sweeps packSweeps
	// preparing makes prepared mounts, one maker each (prepared.go).
	preparing singleflight.Group

	// afterCommit, set by tests, runs after a push is committed to the
	// store; an error refuses the push to git as a crash there would.
	afterCommit func() error
	// inProcess counts the pushes taken in-process (fastReceive).
	inProcess atomic.Int64
	// inProcessSlots bounds the pushes read in-process at once, and so
	// the memory their objects take (fastPushSlots × the bytes each may).
	inProcessSlots chan struct{}
	// beforeCompactCommit, set by tests, runs before a compaction's
	// commit goes to the store (compact.go).
	beforeCompactCommit func()
}

type vaultLock struct {
	sync.Mutex
	users int
}

// New returns a Service for cfg, listening for its hooks.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil || cfg.Blob == nil || cfg.Dir == "" {
		return nil, errors.New("vault: Config.Store, Blob and Dir are required")
	}
	s := &Service{cfg: cfg, log: cfg.Logger, locks: map[string]*vaultLock{}, mounted: map[string][]LayerSpec{}, layerUsed: map[string]time.Time{}, lastLayer: map[string]lastLayers{}, building: map[string]bool{}, runID: rand.Text()[:8], pushes: map[string]*push{}, conns: map[net.Conn]struct{}{}, idx: newIndexes(),
		inProcessSlots: make(chan struct{}, fastPushSlots),
		sweeps:         packSweeps{unseen: map[string]time.Time{}, lastSwept: map[string]time.Time{}}}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.cfg.MaxPush <= 0 {
		s.cfg.MaxPush = DefaultMaxPush
	}
	var err error
	if s.git, err = exec.LookPath(cmpOr(cfg.Git, "git")); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoGit, err)
	}
	// git http-backend, run as itself rather than through the git
	// wrapper: one process less per request.
	s.backend, s.backendArgs = s.git, []string{"http-backend"}
	if out, err := exec.Command(s.git, "--exec-path").Output(); err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "git-http-backend")
		if _, err := os.Stat(p); err == nil {
			s.backend, s.backendArgs = p, nil
		}
	}
	if _, err := exec.LookPath("bash"); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoGit, err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, err
	}
	if err := s.dropStaleCaches(); err != nil {
		return nil, err
	}
	if err := s.listen(); err != nil {
		return nil, err
	}
	return s, nil
}

// Close stops taking hooks (pushes under way fail, unacknowledged) and
// waits for the hook connections to end.
func (s *Service) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close() // a hook that has not sent its push yet would hold Close
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.idx.close()
	return err
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// namePattern is the shape of a vault name: it is a URL path segment and
// a directory name in clones, so no "/", no "..", nothing a shell or a URL
// must quote.
var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// CheckName returns errdefs.ErrInvalid unless name is a vault name.
func CheckName(name string) error {
	if !namePattern.MatchString(name) || strings.Contains(name, "..") || strings.HasSuffix(name, ".git") || strings.HasSuffix(name, ".lock") {
		return fmt.Errorf("%w: vault name %.80q: want 1 to 64 characters of [A-Za-z0-9._-], starting with a letter or digit, without \"..\" and not ending in .git or .lock", errdefs.ErrInvalid, name)
	}
	return nil
}

// GitPath is the path of vault name's git URL on the server.
func GitPath(name string) string { return "/git/" + name + ".git" }

const (
	idLen      = 20
	idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
)

// newID is a vault's ID: 20 characters of [a-z0-9], its cache directory's
// and its object prefix's name, so that a vault made again under a name
// never meets the old one's objects.
func newID() string {
	b := make([]byte, idLen)
	rand.Read(b)
	for i := range b {
		b[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	return string(b)
}

// Create makes a vault for the context's tenant, seeded as req.Layout
// says.
func (s *Service) Create(ctx context.Context, req api.CreateVaultRequest) (api.Vault, error) {
	if err := CheckName(req.Name); err != nil {
		return api.Vault{}, err
	}
	seed, ok := layouts[req.Layout]
	if !ok {
		return api.Vault{}, fmt.Errorf("%w: unknown layout %.40q (want %q or none)", errdefs.ErrInvalid, req.Layout, api.VaultLayoutAgent)
	}
	every, err := checkSchedule(req.Compact)
	if err != nil {
		return api.Vault{}, err
	}
	if err := checkSummarizer(req.Summarizer); err != nil {
		return api.Vault{}, err
	}
	v := store.Vault{ID: newID(), Tenant: tenant.Of(ctx), Name: req.Name, Layout: req.Layout,
		AllowRewrite: req.AllowRewrite, CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
	if err := s.cfg.Store.CreateVault(ctx, v); err != nil {
		return api.Vault{}, err
	}
	if seed != nil {
		if err := s.commit(ctx, v, seed(v.CreatedAt), "Seed the "+req.Layout+" layout"); err != nil {
			// A vault half made is no vault: remove it.
			s.remove(context.WithoutCancel(ctx), v)
			return api.Vault{}, fmt.Errorf("seeding vault %s: %w", v.Name, err)
		}
	}
	if every != "" || req.Summarizer != "" {
		sc := store.VaultSchedule{VaultID: v.ID, Every: every, Summarizer: req.Summarizer}
		if every != "" {
			sc.Next = time.Now().UTC().Truncate(time.Microsecond)
		}
		if err := s.cfg.Store.SetVaultSchedule(ctx, sc); err != nil {
			s.remove(context.WithoutCancel(ctx), v)
			return api.Vault{}, err
		}
	}
	return s.Get(ctx, req.Name)
}

// lookup returns the context's tenant's vault name; another tenant's is
// not found, as one that does not exist.
func (s *Service) lookup(ctx context.Context, name string) (store.Vault, error) {
	if err := CheckName(name); err != nil {
		return store.Vault{}, err
	}
	return s.cfg.Store.GetVault(ctx, tenant.Of(ctx), name)
}

// Get returns the context's tenant's vault name.
func (s *Service) Get(ctx context.Context, name string) (api.Vault, error) {
	v, err := s.lookup(ctx, name)
	if err != nil {
		return api.Vault{}, err
	}
	return s.describe(ctx, v)
}

func (s *Service) describe(ctx context.Context, v store.Vault) (api.Vault, error) {
	refs, packs, err := s.cfg.Store.VaultState(ctx, v.ID)
	if err != nil {
		return api.Vault{}, err
	}
	sc, err := s.cfg.Store.VaultSchedule(ctx, v.ID)
	if err != nil {
		return api.Vault{}, err
	}
	av := api.Vault{Name: v.Name, Layout: v.Layout, AllowRewrite: v.AllowRewrite, GitPath: GitPath(v.Name),
		Head: refs[mainRef], Refs: refs, Packs: len(packs), CreatedAt: v.CreatedAt, Compact: sc.Every, Summarizer: sc.Summarizer}
	if sc.Every != "" && !sc.Next.IsZero() {
		av.NextCompaction = &sc.Next
	}
	return av, nil
}

// Credentials mints temporary object-storage credentials that read (and
// with req.ReadWrite write) the objects of the context's tenant's vault
// name and no others: for agents that read the packs from the store
// directly (docs/vault.md).
func (s *Service) Credentials(ctx context.Context, name string, req api.VaultCredentialsRequest) (api.VaultCredentials, error) {
	secs := req.TTLSeconds
	if secs == 0 {
		secs = int(stscreds.MinTTL / time.Second)
	}
	// Bounded in seconds before the Duration: a huge count would wrap.
	ttl := time.Duration(secs) * time.Second
	if secs < int(stscreds.MinTTL/time.Second) || secs > int(stscreds.MaxTTL/time.Second) {
		return api.VaultCredentials{}, fmt.Errorf("%w: ttl_seconds must be %d to %d", errdefs.ErrInvalid,
			int(stscreds.MinTTL/time.Second), int(stscreds.MaxTTL/time.Second))
	}
	v, err := s.lookup(ctx, name)
	if err != nil {
		return api.VaultCredentials{}, err
	}
	// Writing and deleting the vault's objects directly can undo pushes
	// that were acknowledged: only a vault whose history may be rewritten
	// (allow_rewrite) gives write access to them.
	if req.ReadWrite && !v.AllowRewrite {
		return api.VaultCredentials{}, fmt.Errorf("%w: read-write credentials can undo acknowledged pushes: vault %s was not created with allow_rewrite", errdefs.ErrForbidden, v.Name)
	}
	if s.cfg.Credentials == nil {
		return api.VaultCredentials{}, fmt.Errorf("%w: this server mints no vault credentials: it needs an s3:// object store (--blob) and a role to assume (--vault-sts-role)", errdefs.ErrConflict)
	}
	return s.cfg.Credentials.Mint(ctx, tenant.Of(ctx), v.ID, ttl, !req.ReadWrite)
}

// List returns the context's tenant's vaults, by name.
func (s *Service) List(ctx context.Context) ([]api.Vault, error) {
	vs, err := s.cfg.Store.ListVaults(ctx, tenant.Of(ctx))
	if err != nil {
		return nil, err
	}
	out := []api.Vault{}
	for _, v := range vs {
		av, err := s.describe(ctx, v)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, av)
	}
	return out, nil
}

// Delete removes vault name and its objects; while sandboxes mount it
// (Config.Mounts) only with force.
func (s *Service) Delete(ctx context.Context, name string, force bool) error {
	v, err := s.lookup(ctx, name)
	if err != nil {
		return err
	}
	if s.cfg.Mounts != nil && !force {
		n, err := s.cfg.Mounts(ctx, v.Tenant, v.Name)
		if err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("%w: vault %s is mounted by %d sandboxes (delete them, or force)", errdefs.ErrConflict, name, n)
		}
	}
	return s.remove(ctx, v)
}

// remove deletes v's record, then its cache and its objects: once the
// record is gone nothing reaches them, so what a crash leaves behind is
// only garbage under a prefix no vault has.
func (s *Service) remove(ctx context.Context, v store.Vault) error {
	if err := s.cfg.Store.DeleteVault(ctx, v.ID); err != nil {
		return err
	}
	s.idx.drop(v.ID)
	s.adverts.drop(v.ID)
	s.forget(v.ID)
	unlock := s.lock(v.ID)
	defer unlock()
	if err := os.RemoveAll(s.repoDir(v.ID)); err != nil {
		s.log.Warn("removing a deleted vault's cache", "vault", v.ID, "err", err)
	}
	keys, err := s.cfg.Blob.List(ctx, objectPrefix(v.ID))
	if err != nil {
		s.log.Warn("listing a deleted vault's objects", "vault", v.ID, "err", err)
	}
	for _, k := range keys {
		if err := s.cfg.Blob.Delete(ctx, k); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			s.log.Warn("deleting a deleted vault's object", "vault", v.ID, "key", k, "err", err)
		}
	}
	return nil
}

// revPattern is what Log and Show take as a revision: a ref or object
// name and git's ~ ^ suffixes, never an option.
var revPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._/~^-]{0,199}$`)

func checkRev(rev string) error {
	if !revPattern.MatchString(rev) || strings.Contains(rev, "..") {
		return fmt.Errorf("%w: revision %.80q: want a branch, tag or commit ID, optionally with ~N or ^", errdefs.ErrInvalid, rev)
	}
	return nil
}

// Log returns up to limit commits of vault name reachable from rev
// (default the main branch), newest first.
func (s *Service) Log(ctx context.Context, name, rev string, limit int) ([]api.VaultCommit, error) {
	v, err := s.lookup(ctx, name)
	if err != nil {
		return nil, err
	}
	if rev = cmpOr(rev, mainRef); checkRev(rev) != nil {
		return nil, checkRev(rev)
	}
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	dir, err := s.ready(ctx, v)
	if err != nil {
		return nil, err
	}
	out := []api.VaultCommit{}
	if rev == mainRef {
		if _, err := s.run(ctx, dir, nil, nil, "rev-parse", "--verify", "--quiet", mainRef); err != nil {
			return out, nil // an empty vault has no commits
		}
	}
	b, err := s.run(ctx, dir, nil, nil, "log", "--format=%H%x1f%an%x1f%ae%x1f%aI%x1f%s%x1e", fmt.Sprintf("-n%d", limit), "--end-of-options", rev, "--")
	if err != nil {
		return nil, revError(rev, err)
	}
	for _, rec := range strings.Split(string(b), "\x1e") {
		f := strings.Split(strings.TrimSpace(rec), "\x1f")
		if len(f) != 5 {
			continue
		}
		at, _ := time.Parse(time.RFC3339, f[3])
		out = append(out, api.VaultCommit{ID: f[0], Author: f[1], Email: f[2], Time: at.UTC(), Subject: f[4]})
	}
	return out, nil
}

// revError is git's failure on rev as the contract's kind.
func revError(rev string, err error) error {
	var ge *gitError
	if errors.As(err, &ge) && ge.code == 128 {
		return fmt.Errorf("%w: revision %.80q is not in the vault", errdefs.ErrNotFound, rev)
	}
	return err
}

// CheckPath returns errdefs.ErrInvalid unless p names a file inside a
// tree: relative, of named parts, with no "." or ".." part.
func CheckPath(p string) error {
	if p == "" || len(p) > 4096 || strings.ContainsAny(p, "\x00\n\r") || path.IsAbs(p) {
		return fmt.Errorf("%w: file path %.80q: want a relative path", errdefs.ErrInvalid, p)
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("%w: file path %.80q: want a relative path of named parts, no . or ..", errdefs.ErrInvalid, p)
		}
	}
	return nil
}

// Show returns the file at p in vault name at rev (default the main
// branch): a blob's bytes, read from git's object database; nothing is
// ever checked out, so a symlink's content is its target's name and no
// pushed path is followed on the server's disk.
func (s *Service) Show(ctx context.Context, name, p, rev string) ([]byte, error) {
	v, err := s.lookup(ctx, name)
	if err != nil {
		return nil, err
	}
	if err := CheckPath(p); err != nil {
		return nil, err
	}
	if rev = cmpOr(rev, mainRef); checkRev(rev) != nil {
		return nil, checkRev(rev)
	}
	dir, err := s.ready(ctx, v)
	if err != nil {
		return nil, err
	}
	// --batch reads the object name from stdin: no part of it is ever an
	// argument.
	out, err := s.run(ctx, dir, nil, strings.NewReader(rev+":"+p+"\n"), "cat-file", "--batch")
	if err != nil {
		return nil, err
	}
	head, body, _ := bytes.Cut(out, []byte("\n"))
	f := strings.Fields(string(head))
	switch {
	case len(f) == 3 && f[1] == "blob":
		if len(body) > 0 {
			body = body[:len(body)-1] // --batch ends each object with a newline
		}
		if len(body) > MaxFile {
			return nil, fmt.Errorf("%w: %s is larger than %d bytes", errdefs.ErrTooLarge, p, MaxFile)
		}
		return body, nil
	case len(f) == 3 && f[1] == "tree":
		return nil, fmt.Errorf("%w: %s is a directory", errdefs.ErrInvalid, p)
	}
	return nil, fmt.Errorf("%w: no file %.200s at %.80s", errdefs.ErrNotFound, p, rev)
}

// gitError is a git command that failed.
type gitError struct {
	args   []string
	code   int
	stderr string
}

func (e *gitError) Error() string {
	return fmt.Sprintf("git %s: exit %d: %s", strings.Join(e.args, " "), e.code, strings.TrimSpace(e.stderr))
}

// run runs git in dir with the environment of gitEnv and extra, and
// returns its standard output.
func (s *Service) run(ctx context.Context, dir string, extra []string, stdin io.Reader, args ...string) ([]byte, error) {
	cmd := s.command(ctx, dir, extra, args...)
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return stdout.Bytes(), &gitError{args: args, code: ee.ExitCode(), stderr: stderr.String()}
		}
		return nil, err
	}
	return stdout.Bytes(), nil
}

func (s *Service) command(ctx context.Context, dir string, extra []string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, s.git, args...)
	cmd.Dir = dir
	cmd.Env = append(s.gitEnv(), extra...)
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// gitEnv is the environment of every git this package runs: no user's or
// system's configuration, no prompts.
func (s *Service) gitEnv() []string {
	return []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + s.cfg.Dir,
		"GIT_CONFIG_NOSYSTEM=1",
		"GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_TERMINAL_PROMPT=0",
		"LC_ALL=C",
		// No fsync in the caches: a push is durable by the object
		// store's and the state store's writes, and the caches are
		// dropped after a reboot (dropStaleCaches). git's own fsyncs
		// were the better part of a small push's time.
		"GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=core.fsync", "GIT_CONFIG_VALUE_0=none",
	}
}

// lines splits git's line output.
func lines(b []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if sc.Text() != "" {
			out = append(out, sc.Text())
		}
	}
	return out
}

// bootIDFile, in Config.Dir, names the boot the caches were written in.
const bootIDFile = "boot-id"

// dropStaleCaches removes the cache repositories if the machine has
// booted since they were written: git writes them without fsync (see
// gitEnv), so after a crash of the machine a cache may hold refs whose
// objects never reached the disk. A process that died (kill -9) leaves
// its writes in the page cache, whole; a reboot does not, and the caches
// are then made again from the stores, as a deleted one is.
func (s *Service) dropStaleCaches() error {
	cur, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return fmt.Errorf("vault: reading the boot ID: %w", err)
	}
	p := filepath.Join(s.cfg.Dir, bootIDFile)
	was, err := os.ReadFile(p)
	if err == nil && bytes.Equal(was, cur) {
		return nil
	}
	if err == nil { // booted since: drop them (a first start has none to)
		caches, _ := filepath.Glob(filepath.Join(s.cfg.Dir, "*.git"))
		for _, c := range caches {
			if err := os.RemoveAll(c); err != nil {
				return fmt.Errorf("vault: dropping a cache written before a reboot: %w", err)
			}
		}
		s.log.Info("vault caches dropped after a reboot", "caches", len(caches))
		// And the mounts' layers not known to be on disk (layer.go),
		// made again when a sandbox wants them.
		layers, _ := os.ReadDir(s.layersDir())
		for _, l := range layers {
			d := filepath.Join(s.layersDir(), l.Name())
			if _, err := os.Stat(d + syncedMark); l.IsDir() && err != nil {
				if err := os.RemoveAll(d); err != nil {
					return fmt.Errorf("vault: dropping a layer written before a reboot: %w", err)
				}
			}
		}
	}
	return atomicfile.Write(p, cur, 0o600)
}
