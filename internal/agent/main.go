package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

// EnvVar holds the sandbox's default environment for Main, as a JSON object.
const EnvVar = "ATOLL_AGENT_ENV"

// UserVar and CwdVar hold the default user and working directory for Main.
const (
	UserVar = "ATOLL_AGENT_USER"
	CwdVar  = "ATOLL_AGENT_CWD"
)

// Main is atoll-agent's main: it serves the listener inherited as fd 3 until
// SIGTERM, reaping every child. It calls ready, if not nil, just before it
// serves.
func Main(ready func()) {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(log, ready); err != nil {
		log.Error("atoll-agent", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger, ready func()) error {
	var env map[string]string
	if s := os.Getenv(EnvVar); s != "" {
		if err := json.Unmarshal([]byte(s), &env); err != nil {
			return fmt.Errorf("parsing %s: %w", EnvVar, err)
		}
	}
	defaultUser, defaultCwd := os.Getenv(UserVar), os.Getenv(CwdVar)
	// Children get their environment from the request, never the agent's.
	os.Clearenv()

	f := os.NewFile(3, "listener")
	if f == nil {
		return errors.New("no listener on fd 3")
	}
	ln, err := net.FileListener(f)
	f.Close() // FileListener holds its own copy
	if err != nil {
		return fmt.Errorf("listener on fd 3: %w", err)
	}

	// As PID 1 the agent inherits every orphan; otherwise ask to.
	if os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("becoming a subreaper: %w", err)
		}
	}
	a, err := New(Config{Listener: ln, DefaultEnv: env, Logger: log, Reap: true, DefaultUser: defaultUser, DefaultCwd: defaultCwd})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
	defer stop()
	log.Info("atoll-agent serving", "pid", os.Getpid())
	if ready != nil {
		ready()
	}
	err = a.Run(ctx)
	a.Close()
	return err
}
