package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/control"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/runtime/overlay"
	"github.com/atoll-dev/atoll/internal/server"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
	"github.com/atoll-dev/atoll/internal/vault"
)

// sandboxUID is the sandbox's user (the templates' "user", uid 1000),
// which owns the clones of its vaults.
const sandboxUID = 1000

// vaultMounts clone vaults into sandboxes and keep their tokens fresh
// (server.VaultMounts; docs/vault.md, "In a sandbox").
type vaultMounts struct {
	vaults *vault.Service
	svc    *control.Service
	state  store.Store
	key    []byte
	ttl    time.Duration
	// gitURL is a vault's git URL as sandbox sb reaches it.
	gitURL func(sb api.Sandbox, name string) string
	log    *slog.Logger
	now    func() time.Time
}

var (
	_ server.VaultMounts  = (*vaultMounts)(nil)
	_ control.VaultLayers = (*vaultMounts)(nil)
)

// startVaultMounts makes the vault mounts of the server: the token key
// (shared by a cluster's nodes, as the port key is), the git listener on
// the sandboxes' gateway (with networking and --vault-git-port), and the
// loop that renews the tokens of running sandboxes.
func (s *serving) startVaultMounts(ctx context.Context, vaults *vault.Service) (*vaultMounts, error) {
	key, err := s.secret(ctx, "vault-token-key", s.dir.VaultTokenKey(), ensureSecret)
	if err != nil {
		return nil, err
	}
	m := &vaultMounts{vaults: vaults, svc: s.svc, state: s.state, key: key, ttl: vault.DefaultTokenTTL, log: s.log, now: time.Now}
	// A debug knob, for tests of renewal and expiry.
	if v := os.Getenv("ATOLL_VAULT_TOKEN_TTL"); v != "" {
		if m.ttl, err = time.ParseDuration(v); err != nil || m.ttl < time.Second {
			return nil, fmt.Errorf("ATOLL_VAULT_TOKEN_TTL %q: want a duration of a second or more", v)
		}
	}
	var gw string // the gateway's git address, HOST:PORT
	if s.netm != nil && s.cfg.vaultGitPort != 0 {
		gw4 := s.netm.Config().Subnet4.Addr().Next()
		gw = netip.AddrPortFrom(gw4, uint16(s.cfg.vaultGitPort)).String()
		ln, err := s.listenFor("--vault-git-port", gw)
		if err != nil {
			return nil, err
		}
		// Only the vaults' git URLs: the firewall lets every sandbox reach
		// this port, so nothing else of the API is served on it.
		hs := server.NewHTTPServer(gw, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !strings.HasPrefix(r.URL.Path, server.GitPrefix) {
				http.NotFound(w, r)
				return
			}
			s.handler.ServeHTTP(w, r)
		}))
		done := make(chan struct{})
		go func() { defer close(done); hs.Serve(ln) }()
		s.onClose(func() { hs.Close(); <-done })
	}
	m.gitURL = func(sb api.Sandbox, name string) string {
		if gw != "" && sb.Network != nil {
			return "http://" + gw + vault.GitPath(name)
		}
		// No network namespace: the clone is there, but reaching the
		// server is up to the sandbox (the host's network, for one
		// without its own).
		return s.url + vault.GitPath(name)
	}
	rctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); m.run(rctx) }()
	s.onClose(func() { cancel(); wg.Wait() })
	return m, nil
}

// Check implements server.VaultMounts. The vaults there, it starts
// making the layers of their heads (vault.Service.PrepareLayers) while
// the create makes the sandbox, for the mounts of them this node made
// before (a push's own are made after it): the create's Plan then finds
// them made.
func (m *vaultMounts) Check(ctx context.Context, ms []api.VaultMount) error {
	for _, v := range ms {
		if _, err := m.vaults.ID(ctx, v.Name); err != nil {
			return err
		}
	}
	for _, v := range ms {
		if err := m.vaults.PrepareLayers(ctx, v.Name); err != nil {
			m.log.Debug("making a vault's layers ahead", "vault", v.Name, "err", err)
		}
	}
	return nil
}

// Plan implements control.VaultLayers: each vault with a commit gets the
// layer of its head, over the template's layers tmpl, if it is made or
// can be made from an earlier commit's; if not, the vault is cloned as
// before and its layer made for the next create (vault.ReadyLayer).
func (m *vaultMounts) Plan(ctx context.Context, sb *store.Sandbox, tmpl []string) ([]byte, error) {
	if len(tmpl)+len(sb.Vaults)*(vault.MaxStack) > overlay.MaxLayers {
		return nil, nil // cloned, as a template of that many layers leaves no room
	}
	ctx = tenant.NewContext(ctx, sb.Tenant)
	var specs []vault.LayerSpec
	for i, v := range sb.Vaults {
		id, head, err := m.vaults.Head(ctx, v.Name)
		if err != nil {
			return nil, fmt.Errorf("vault %s: %w", v.Name, err)
		}
		if head == "" {
			continue // empty: its clone is a .git, unpacked
		}
		spec := vault.LayerSpec{Vault: id, Tenant: sb.Tenant, Name: v.Name, Commit: head, Path: v.Path,
			UID: sandboxUID, GID: sandboxUID, Dirs: vault.TemplateDirs(tmpl, v.Path, sandboxUID, sandboxUID)}
		chain := m.vaults.ReadyStack(ctx, spec)
		if chain == nil {
			continue // cloned, while its layer is made for the next
		}
		sb.Vaults[i].Commit = head
		specs = append(specs, chain...)
	}
	if len(specs) == 0 {
		return nil, nil
	}
	return json.Marshal(specs)
}

// Layers implements control.VaultLayers.
func (m *vaultMounts) Layers(ctx context.Context, tnt string, kept []byte) ([]string, error) {
	var specs []vault.LayerSpec
	if err := json.Unmarshal(kept, &specs); err != nil {
		return nil, err
	}
	for _, sp := range specs {
		if sp.Tenant != tnt {
			return nil, fmt.Errorf("%w: the sandbox's files are over a layer of vault %s of another tenant", errdefs.ErrConflict, sp.Name)
		}
	}
	return m.vaults.LayersOf(tenant.NewContext(ctx, tnt), specs)
}

// token signs sb's token for mount v of the context's tenant.
func (m *vaultMounts) token(ctx context.Context, sb api.Sandbox, v api.VaultMount) (string, error) {
	id, err := m.vaults.ID(ctx, v.Name)
	if err != nil {
		return "", err
	}
	return vault.Token{Vault: id, Name: v.Name, Tenant: tenant.Of(ctx), Sandbox: sb.ID, ReadOnly: v.ReadOnly,
		Expires: m.now().Add(m.ttl)}.Sign(m.key), nil
}

// upload unpacks at dir in sandbox id the tar write writes.
func (m *vaultMounts) upload(ctx context.Context, id, dir string, write func(io.Writer) error) error {
	dial, err := m.svc.AgentDialer(ctx, id)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(write(pw)) }()
	err = agent.NewClient(dial).UploadTar(ctx, dir, pr)
	pr.CloseWithError(errors.New("upload ended"))
	return err
}

// Mount implements server.VaultMounts: one clone after the other (a
// sandbox has a few). A sandbox another node of the cluster runs is left
// alone: its clones go through its agent, which only its node reaches, so
// that node mounted them when it ran the sandbox (mountPlaced), before the
// create came back here.
func (m *vaultMounts) Mount(ctx context.Context, sb api.Sandbox) error {
	if sb.Node != m.svc.Node() {
		return nil
	}
	return m.mount(ctx, sb)
}

// mount clones sb.Vaults into sandbox sb, which this node runs, for the
// context's tenant.
func (m *vaultMounts) mount(ctx context.Context, sb api.Sandbox) error {
	for _, v := range sb.Vaults {
		tok, err := m.token(ctx, sb, v)
		if err != nil {
			return err
		}
		mt := vault.Mount{VaultMount: v, Sandbox: sb.ID, URL: m.gitURL(sb, v.Name), Token: tok, UID: sandboxUID, GID: sandboxUID}
		t0 := time.Now()
		upload := func(dir string, write func(io.Writer) error) error { return m.upload(ctx, sb.ID, dir, write) }
		if v.Commit != "" {
			// The clone is the layer's but for the sandbox's own files.
			err = upload("/", func(w io.Writer) error { return vault.SandboxFilesTar(w, mt) })
		} else {
			err = m.vaults.Clone(ctx, mt, upload)
		}
		if err != nil {
			return fmt.Errorf("vault %s: %w", v.Name, err)
		}
		m.log.Debug("vault mounted", "sandbox", sb.ID, "vault", v.Name, "op", "mount", "ms", time.Since(t0).Milliseconds())
	}
	return nil
}

// Renew implements server.VaultMounts. A sandbox another node of the
// cluster runs is left to that node, as in Mount: it renewed the tokens
// when it started the sandbox (renewStarted), and renews them every round.
func (m *vaultMounts) Renew(ctx context.Context, sb api.Sandbox) error {
	if sb.Node != m.svc.Node() {
		return nil
	}
	for _, v := range sb.Vaults {
		tok, err := m.token(ctx, sb, v)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // deleted (forced): its clone stays, pushing nowhere
		}
		if err != nil {
			return err
		}
		if err := m.upload(ctx, sb.ID, "/", func(w io.Writer) error {
			return vault.TokenTar(w, v.Path, tok, sandboxUID, sandboxUID)
		}); err != nil {
			return fmt.Errorf("vault %s: %w", v.Name, err)
		}
	}
	return nil
}

// run renews the tokens of this node's running sandboxes every third of
// their lifetime, so that a token is always good for two thirds of it;
// one that started again after a stop gets fresh ones at the next round.
func (m *vaultMounts) run(ctx context.Context) {
	t := time.NewTicker(m.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.sweepLayers(ctx)
		sbs, err := m.state.List(ctx)
		if err != nil {
			m.log.Warn("listing sandboxes to renew their vault tokens", "err", err)
			continue
		}
		for _, sb := range sbs {
			if len(sb.Vaults) == 0 || sb.State != api.StateRunning || sb.Node != m.svc.Node() {
				continue
			}
			tctx, cancel := context.WithTimeout(tenant.NewContext(ctx, sb.Tenant), 10*time.Second)
			if err := m.Renew(tctx, sb.Sandbox); err != nil && ctx.Err() == nil {
				m.log.Warn("renewing vault tokens", "sandbox", sb.ID, "err", err)
			}
			cancel()
		}
	}
}

// sweepLayers removes the vault layers no sandbox or snapshot of this
// node stacks on (but those of the heads its mounts will want), and the
// runtimes' images of them.
func (m *vaultMounts) sweepLayers(ctx context.Context) {
	keep := map[string]bool{}
	for _, kept := range m.svc.KeptVaultLayers() {
		var specs []vault.LayerSpec
		if err := json.Unmarshal(kept, &specs); err != nil {
			return // not understood: nothing removed
		}
		for _, spec := range specs {
			keep[vault.LayerKey(spec)] = true
		}
	}
	if m.vaults.SweepLayers(ctx, keep) > 0 {
		m.svc.PruneLayerImages()
	}
}

// CheckToken implements server.VaultMounts: the token's signature and
// expiry, then what it names against the stores as they are now, so
// that a sandbox stopped or deleted, a mount it does not have, or a vault
// made again under the name refuse it at once.
func (m *vaultMounts) CheckToken(ctx context.Context, token, name string) (string, bool, error) {
	tok, err := vault.ParseToken(m.key, token, m.now())
	if err != nil {
		return "", false, err
	}
	refuse := func(why string) (string, bool, error) {
		return "", false, fmt.Errorf("%w: vault token %s", errdefs.ErrUnauthorized, why)
	}
	if tok.Name != name {
		return refuse("is for another vault")
	}
	sb, err := m.state.Get(ctx, tok.Sandbox)
	if errors.Is(err, errdefs.ErrNotFound) {
		return refuse("of a sandbox that was deleted")
	}
	if err != nil {
		return "", false, err
	}
	if sb.Tenant != tok.Tenant {
		return refuse("of a sandbox that was deleted")
	}
	if sb.State != api.StateRunning {
		return refuse("of a sandbox that is " + sb.State)
	}
	var mount *api.VaultMount
	for i := range sb.Vaults {
		if sb.Vaults[i].Name == name {
			mount = &sb.Vaults[i]
		}
	}
	if mount == nil {
		return refuse("of a sandbox that does not mount this vault")
	}
	id, err := m.vaults.ID(tenant.NewContext(ctx, tok.Tenant), name)
	if errors.Is(err, errdefs.ErrNotFound) || err == nil && id != tok.Vault {
		return refuse("of a vault that was deleted")
	}
	if err != nil {
		return "", false, err
	}
	return tok.Tenant, tok.ReadOnly || mount.ReadOnly, nil
}

// count is vault.Config.Mounts: the sandboxes of tenant t that mount vault
// name, in any state (a stopped one mounts it again when it starts).
func (m *vaultMounts) count(ctx context.Context, t, name string) (int, error) {
	if m == nil {
		return 0, nil
	}
	sbs, err := m.state.List(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, sb := range sbs {
		if sb.Tenant != t {
			continue
		}
		for _, v := range sb.Vaults {
			if v.Name == name {
				n++
				break
			}
		}
	}
	return n, nil
}

// owner is ctx as the tenant of sandbox id (the node-to-node calls carry
// none), for the vaults the sandbox mounts, which are its tenant's.
func (s *serving) owner(ctx context.Context, id string) (context.Context, error) {
	row, err := s.state.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	return tenant.NewContext(ctx, row.Tenant), nil
}

// renewStarted writes fresh vault tokens into sb, which this node has just
// started for another node (the start endpoint: an archived sandbox moved
// here), as that node's server does for a sandbox it starts itself.
func (s *serving) renewStarted(ctx context.Context, sb api.Sandbox) {
	if len(sb.Vaults) == 0 || sb.State != api.StateRunning || s.mounts == nil {
		return
	}
	tctx, err := s.owner(ctx, sb.ID)
	if err == nil {
		err = s.mounts.Renew(tctx, sb)
	}
	if err != nil {
		s.log.Warn("writing a started sandbox's vault tokens", "sandbox", sb.ID, "err", err)
	}
}

// mountPlaced clones the vaults of sb, which this node has just run for a
// create another node took (the run endpoint): as that node's server does
// for a sandbox it runs itself, the sandbox is deleted if a clone fails,
// so the create answers with its vaults there or not at all. The vault
// cache here is brought up to the shared store as for any request, and the
// token key is the cluster's, so the clone's token is good on every node.
func (s *serving) mountPlaced(ctx context.Context, sb api.Sandbox) error {
	if len(sb.Vaults) == 0 {
		return nil
	}
	ctx = context.WithoutCancel(ctx) // the sandbox exists: finish either way
	err := fmt.Errorf("%w: this node keeps no vaults", errdefs.ErrUnavailable)
	if s.mounts != nil {
		var tctx context.Context
		if tctx, err = s.owner(ctx, sb.ID); err == nil {
			err = s.mounts.mount(tctx, sb)
		}
	}
	if err == nil {
		return nil
	}
	if derr := s.svc.Delete(ctx, sb.ID); derr != nil {
		s.log.Error("deleting a sandbox whose vaults could not be cloned", "sandbox", sb.ID, "err", derr)
	}
	return fmt.Errorf("cloning its vaults into sandbox %s: %w", sb.ID, err)
}
