package control

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// portAccess is the access a create request asks for: absent is not
// public, so a port a sandbox happens to listen on is never open to anyone
// who can reach the proxy unless its owner says so.
func portAccess(p *api.PortAccess) api.PortAccess {
	if p == nil {
		return api.PortAccess{}
	}
	return *p
}

// PortTarget returns the IPv4 address on the bridge where the port proxy
// reaches running sandbox id (an auto-resume one is woken first), and
// whether its ports are public, and counts
// the request as activity. A sandbox that is not running, or a server
// without networking, is errdefs.ErrUnavailable.
func (s *Service) PortTarget(ctx context.Context, id string) (addr netip.Addr, public bool, err error) {
	if err := checkID(id); err != nil {
		return addr, false, err
	}
	sb, err := s.forTraffic(ctx, id)
	if err != nil {
		return addr, false, err
	}
	if s.net == nil {
		return addr, false, fmt.Errorf("%w: this server runs sandboxes without networking, so their ports cannot be reached", errdefs.ErrUnavailable)
	}
	if sb.State != api.StateRunning {
		return addr, false, fmt.Errorf("%w: sandbox %s is %s, not running", errdefs.ErrUnavailable, id, sb.State)
	}
	s.touch(id)
	a4, _ := s.net.Addrs(sb.Slot)
	return a4, sb.Ports.Public, nil
}

// Touch records activity of sandbox id, for auto-stop: the port proxy
// calls it while a long request (a websocket, a stream) is open.
func (s *Service) Touch(id string) {
	if api.ValidSandboxID(id) {
		s.touch(id)
	}
}

// SetPorts changes who may open sandbox id's ports through the port proxy.
// It applies to the next request (and the next connection a client opens).
func (s *Service) SetPorts(ctx context.Context, id string, req api.PortAccess) (api.Sandbox, error) {
	return s.locked(ctx, id, "ports", func(ctx context.Context, sb *store.Sandbox) error {
		sb.Ports = req
		if err := s.setState(ctx, sb, sb.State); err != nil {
			return err
		}
		s.touch(id)
		return nil
	})
}
