package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/control"
	"github.com/atoll-dev/atoll/internal/vault"
)

// summarizerSandboxes make the sandboxes that vaults' command summarizers
// run in (vault.Sandboxes): one of the tenant's, of the default template,
// made for a compaction and deleted after it, labelled so that the
// tenant sees what it is while it runs.
type summarizerSandboxes struct {
	svc *control.Service
	log *slog.Logger
}

// summarizerLabel marks the sandboxes of summarizers.
const summarizerLabel = "atoll.dev/vault-summarizer"

// summarizerTimeout bounds a summarizer's sandbox's life, and each of its
// commands: a compaction that hangs does not keep it.
const summarizerTimeout = 15 * time.Minute

func (m summarizerSandboxes) Open(ctx context.Context) (vault.Sandbox, error) {
	req := api.CreateSandboxRequest{TimeoutSec: int64(summarizerTimeout / time.Second),
		Labels: map[string]string{summarizerLabel: "true"}}
	if n := m.svc.Node(); n != "" {
		// In a cluster, on this node, whose agents this server reaches.
		req.NodeSelector = map[string]string{api.NodeNameLabel: n}
	}
	sb, err := m.svc.Create(ctx, req)
	if err != nil {
		return nil, err
	}
	return &summarizerSandbox{m: m, id: sb.ID}, nil
}

type summarizerSandbox struct {
	m    summarizerSandboxes
	id   string
	once sync.Once
}

func (s *summarizerSandbox) Run(ctx context.Context, shell string, env map[string]string, stdin []byte) ([]byte, []byte, int, error) {
	dial, err := s.m.svc.AgentDialer(ctx, s.id)
	if err != nil {
		return nil, nil, 0, err
	}
	res, err := agent.NewClient(dial).Exec(ctx, api.ExecRequest{Shell: shell, Env: env, Stdin: stdin, User: "user",
		TimeoutMs: summarizerTimeout.Milliseconds()})
	if err != nil {
		return nil, nil, 0, err
	}
	code := res.ExitCode
	if res.Signal != "" || res.TimedOut {
		code = -1
		res.Stderr = append(res.Stderr, fmt.Sprintf("\n(killed: signal %s, timed out %v)", res.Signal, res.TimedOut)...)
	}
	return res.Stdout, res.Stderr, code, nil
}

func (s *summarizerSandbox) Close() {
	s.once.Do(func() {
		if err := s.m.svc.Delete(context.Background(), s.id); err != nil {
			s.m.log.Warn("deleting a vault summarizer's sandbox", "sandbox", s.id, "err", err)
		}
	})
}

// vaultScheduleTick is how often the server looks for due compactions:
// vault.ScheduleTick, or ATOLL_VAULT_COMPACT_TICK (a debug knob, for
// tests).
func vaultScheduleTick() (time.Duration, error) {
	v := os.Getenv("ATOLL_VAULT_COMPACT_TICK")
	if v == "" {
		return vault.ScheduleTick, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 100*time.Millisecond {
		return 0, fmt.Errorf("ATOLL_VAULT_COMPACT_TICK %q: want a duration of 100ms or more", v)
	}
	return d, nil
}
