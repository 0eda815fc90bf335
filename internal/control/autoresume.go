package control

import (
	"context"
	"time"

	"github.com/atoll-dev/atoll/internal/store"
)

// forTraffic reads sandbox id for a request that reaches it: one of its
// ports through the port proxy, its agent, E2B's envd. An auto-resume
// sandbox in a state resumes marks onTraffic is resumed first, and the
// request waits for it (concurrent ones wait on its lock, then find it
// running). Anything else is returned as it is, for the caller to refuse.
func (s *Service) forTraffic(ctx context.Context, id string) (store.Sandbox, error) {
	sb, err := s.get(ctx, id)
	if err == nil {
		err = s.here(sb)
	}
	if err != nil || !sb.AutoResume || !resumes[sb.State].onTraffic {
		return sb, err
	}
	// The resume goes through even if the client gives up: a half-made
	// resume is worse than an unused one.
	ctx = context.WithoutCancel(ctx)
	sb, unlock, err := s.acquire(ctx, id, "")
	if err != nil {
		return sb, err
	}
	defer unlock()
	r := resumes[sb.State]
	if !r.onTraffic { // resumed (or stopped, deleted) meanwhile
		return sb, nil
	}
	t0 := time.Now()
	if err := r.resume(s, ctx, &sb); err != nil {
		return sb, err
	}
	// Traffic is activity, and the timeout counts again from now.
	s.touch(id)
	from := sb.State
	s.setTimeout(&sb, time.Now().UTC())
	if err := s.setState(ctx, &sb, from); err != nil {
		return sb, err
	}
	s.log.Info("resumed sandbox on traffic", "sandbox", id, "ms", ms(t0))
	return sb, nil
}
