package server

import (
	"context"
	"fmt"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// VaultMounts clone memory vaults into sandboxes (a create's Vaults) and
// check the tokens those clones fetch and push with (docs/vault.md, "In a
// sandbox").
type VaultMounts interface {
	// Check returns errdefs.ErrNotFound unless the context's tenant has
	// every vault of ms: a create asking for one that is not there fails
	// before a sandbox is made.
	Check(ctx context.Context, ms []api.VaultMount) error
	// Mount clones sb.Vaults into the running sandbox sb.
	Mount(ctx context.Context, sb api.Sandbox) error
	// Renew writes fresh tokens into sb's clones: a fork's, whose files
	// came with its parent's tokens.
	Renew(ctx context.Context, sb api.Sandbox) error
	// CheckToken returns the tenant a vault token is good for on vault
	// name, and whether it may only fetch; errdefs.ErrUnauthorized for a
	// token that is bad, expired, for another vault, or whose sandbox is
	// not running.
	CheckToken(ctx context.Context, token, name string) (tenant string, readOnly bool, err error)
}

// mountVaults clones sb's vaults once its create has made it; if that
// fails the sandbox is deleted: a create answers with its vaults there or
// not at all.
func (s *Server) mountVaults(ctx context.Context, sb api.Sandbox) error {
	if len(sb.Vaults) == 0 {
		return nil
	}
	err := s.cfg.VaultMounts.Mount(ctx, sb)
	if err == nil {
		return nil
	}
	if derr := s.cfg.Sandboxes.Delete(context.WithoutCancel(ctx), sb.ID); derr != nil {
		s.log.Error("deleting a sandbox whose vaults could not be cloned", "sandbox", sb.ID, "err", derr)
	}
	return fmt.Errorf("cloning its vaults into sandbox %s: %w", sb.ID, err)
}

// checkVaults refuses a create whose vaults this server cannot mount.
func (s *Server) checkVaults(ctx context.Context, req api.CreateSandboxRequest) error {
	if len(req.Vaults) == 0 {
		return nil
	}
	if s.cfg.VaultMounts == nil {
		return fmt.Errorf("%w: this server keeps no vaults", errdefs.ErrUnavailable)
	}
	return s.cfg.VaultMounts.Check(ctx, req.Vaults)
}

// renewingVaults is op (a start or a resume) followed by fresh tokens for
// the sandbox's vaults: those in its clones may have expired while it was
// not running, and the renewal round may be minutes away.
func (s *Server) renewingVaults(op func(ctx context.Context, id string) (api.Sandbox, error)) func(ctx context.Context, id string) (api.Sandbox, error) {
	return func(ctx context.Context, id string) (api.Sandbox, error) {
		sb, err := op(ctx, id)
		if err == nil && len(sb.Vaults) > 0 && sb.State == api.StateRunning && s.cfg.VaultMounts != nil {
			if rerr := s.cfg.VaultMounts.Renew(ctx, sb); rerr != nil {
				s.log.Warn("writing a started sandbox's vault tokens", "sandbox", sb.ID, "err", rerr)
			}
		}
		return sb, err
	}
}
