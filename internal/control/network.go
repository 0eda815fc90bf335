package control

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/egress"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/network"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/store"
)

// A sandbox's network lives while the sandbox runs: it is attached (from
// the network pool) when the sandbox starts, or when a prestarted process is
// made for its slot, and released when it stops or is deleted. Its addresses
// come from its slot, so they are the same at every start. Its egress
// policy is stored with it and given to the network at every attach, and at
// start-up to the networks of the sandboxes still running.

// errNoNetwork refuses policies on a server without networking.
var errNoNetwork = fmt.Errorf("%w: this server runs sandboxes without networking (turned off, or the kernel cannot enforce egress policies), so it cannot enforce a network policy", errdefs.ErrUnavailable)

// policyOf parses a stored policy; stored policies were checked when they
// were set, so an error means a damaged row, and the sandbox gets the
// strictest policy rather than the loosest.
func (s *Service) policyOf(sb store.Sandbox) egress.Policy {
	p := sb.Policy
	pol, err := egress.Parse(&p)
	if err != nil {
		s.log.Error("stored egress policy is invalid; denying all", "sandbox", sb.ID, "err", err)
		return egress.Policy{DenyByDefault: true}
	}
	return pol
}

// networked reports whether sandboxes of runtime rt get networks: the
// server has networking and the runtime joins them.
func (s *Service) networked(rt string) bool {
	return s.net != nil && runtime.CapsOf(s.runtimes[rt]).Network
}

// checkPolicy parses a requested policy for a sandbox of runtime rt into
// its stored form.
func (s *Service) checkPolicy(rt string, p *api.NetworkPolicy) (api.NetworkPolicy, error) {
	if p == nil {
		return api.NetworkPolicy{}, nil
	}
	pol, err := egress.Parse(p)
	if err != nil && s.net != nil {
		return api.NetworkPolicy{}, err
	}
	if !s.networked(rt) {
		// Loopback only enforces deny-all with nothing allowed and no
		// caps; it is kept, for a later start with networking.
		if err != nil || !pol.DenyByDefault || len(pol.Allow) > 0 || len(pol.Names) > 0 || pol.EgressRate != 0 || pol.IngressRate != 0 {
			if s.net == nil {
				return api.NetworkPolicy{}, errNoNetwork
			}
			return api.NetworkPolicy{}, noNetworkRuntime(rt)
		}
	}
	if pol.IsDefault() {
		return api.NetworkPolicy{}, nil
	}
	return pol.API(), nil
}

// noNetworkRuntime refuses what needs a network for a runtime that gives
// its sandboxes loopback only.
func noNetworkRuntime(rt string) error {
	return fmt.Errorf("%w: runtime %s runs sandboxes with loopback only (no network capability), so it cannot enforce a network policy other than deny-all", errdefs.ErrInvalid, rt)
}

// view is sb as the API shows it.
func (s *Service) view(sb store.Sandbox) api.Sandbox {
	out := sb.Sandbox
	if s.networked(sb.Runtime) {
		out.Network = s.networkOf(sb)
	}
	return out
}

func (s *Service) networkOf(sb store.Sandbox) *api.SandboxNetwork {
	a4, a6 := s.net.Addrs(sb.Slot)
	n := &api.SandboxNetwork{IPv4: a4.String(), IPv6: a6.String(), Policy: sb.Policy}
	if n.Policy.Egress == "" {
		n.Policy.Egress = egress.AllowAll
	}
	return n
}

// attachNetwork gives sb its network, under its policy, for a start. A
// network its slot already has (a prestarted process's) is kept.
func (s *Service) attachNetwork(ctx context.Context, sb store.Sandbox) (*runtime.Network, error) {
	if !s.networked(sb.Runtime) {
		return nil, nil
	}
	pol := s.policyOf(sb)
	if att, err := s.net.Lookup(sb.Slot); err == nil {
		if err := s.net.SetPolicy(ctx, sb.Slot, pol); err == nil {
			return runtimeNetwork(att), nil
		} else if !errors.Is(err, errdefs.ErrNotFound) {
			return nil, err
		}
		// A namespace without firewall state: left by a crash.
		if err := s.net.Release(ctx, sb.Slot); err != nil {
			return nil, err
		}
	}
	att, err := s.attach(ctx, sb.Slot, pol)
	if errors.Is(err, errdefs.ErrConflict) {
		// Left by a crash or a failed release: start clean.
		if err := s.net.Release(ctx, sb.Slot); err != nil {
			return nil, err
		}
		att, err = s.attach(ctx, sb.Slot, pol)
	}
	if err != nil {
		return nil, err
	}
	return runtimeNetwork(att), nil
}

func (s *Service) attach(ctx context.Context, slot int, pol egress.Policy) (*network.Attachment, error) {
	if s.netPool != nil {
		return s.netPool.Get(ctx, slot, pol)
	}
	return s.net.Attach(ctx, slot, pol)
}

// releaseNetwork removes sb's network, if it has one; a failure is logged:
// the next start-up's sweep removes what is left.
func (s *Service) releaseNetwork(ctx context.Context, sb store.Sandbox) {
	if !s.networked(sb.Runtime) {
		return
	}
	if err := s.net.Release(ctx, sb.Slot); err != nil {
		s.log.Error("releasing network", "sandbox", sb.ID, "err", err)
	}
}

func runtimeNetwork(a *network.Attachment) *runtime.Network {
	return &runtime.Network{
		Netns:       a.Netns,
		Addrs:       []netip.Addr{a.Addr4.Addr(), a.Addr6.Addr()},
		Nameservers: a.Resolvers,
	}
}

// recoverNetworks removes the networks of sandboxes that no longer run and
// gives those that do their policies again.
func (s *Service) recoverNetworks(ctx context.Context) error {
	if s.net == nil {
		return nil
	}
	sbs, err := s.store.ListNode(ctx, s.name)
	if err != nil {
		return err
	}
	var inUse []int
	var running []store.Sandbox
	for _, sb := range sbs {
		if (sb.State == api.StateRunning || sb.State == api.StatePaused) && s.networked(sb.Runtime) {
			inUse = append(inUse, sb.Slot)
			running = append(running, sb)
		}
	}
	if err := s.net.Sweep(ctx, inUse); err != nil {
		s.log.Error("sweeping networks", "err", err)
	}
	for _, sb := range running {
		if err := s.net.SetPolicy(ctx, sb.Slot, s.policyOf(sb)); err != nil {
			s.log.Warn("restoring egress policy", "sandbox", sb.ID, "err", err)
		}
	}
	return nil
}

// GetNetwork returns a sandbox's network.
func (s *Service) GetNetwork(ctx context.Context, id string) (api.SandboxNetwork, error) {
	sb, err := s.get(ctx, id)
	if err != nil {
		return api.SandboxNetwork{}, err
	}
	if s.net == nil {
		return api.SandboxNetwork{}, errNoNetwork
	}
	if !s.networked(sb.Runtime) {
		return api.SandboxNetwork{}, fmt.Errorf("%w: sandbox %s (runtime %s) has loopback only", errdefs.ErrInvalid, id, sb.Runtime)
	}
	s.touch(id)
	return *s.networkOf(sb), nil
}

// SetNetwork replaces a sandbox's egress policy. A running or paused
// sandbox gets it at once, and its connections that it forbids are cut; a
// stopped one at its next start.
func (s *Service) SetNetwork(ctx context.Context, id string, req api.NetworkPolicy) (api.SandboxNetwork, error) {
	if err := checkID(id); err != nil {
		return api.SandboxNetwork{}, err
	}
	ctx = context.WithoutCancel(ctx)
	sb, unlock, err := s.acquire(ctx, id, "")
	if err != nil {
		return api.SandboxNetwork{}, err
	}
	defer unlock()
	if s.net == nil {
		return api.SandboxNetwork{}, errNoNetwork
	}
	stored, err := s.checkPolicy(sb.Runtime, &req)
	if err != nil {
		return api.SandboxNetwork{}, err
	}
	// After the policy's own checks: a bad policy is refused whatever
	// the state.
	if err := refuses("network", sb); err != nil {
		return api.SandboxNetwork{}, err
	}
	old := sb
	sb.Policy = stored
	live := sb.State == api.StateRunning || sb.State == api.StatePaused
	if live {
		if err := s.net.SetPolicy(ctx, sb.Slot, s.policyOf(sb)); err != nil {
			s.log.Error("setting egress policy", "sandbox", id, "err", err)
			return api.SandboxNetwork{}, fmt.Errorf("%w: setting the network policy failed", errdefs.ErrUnavailable)
		}
	}
	if err := s.setState(ctx, &sb, sb.State); err != nil {
		if live {
			_ = s.net.SetPolicy(ctx, sb.Slot, s.policyOf(old))
		}
		return api.SandboxNetwork{}, err
	}
	s.touch(id)
	return *s.networkOf(sb), nil
}
