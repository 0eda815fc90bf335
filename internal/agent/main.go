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

	"github.com/atoll-dev/atoll/internal/agent/launch"
)

// Main is atoll-agent's main: it serves the listener inherited as launch.ListenerFD
// (or the socket at $ATOLL_AGENT_LISTEN) until SIGTERM, reaping every child. It
// calls ready, if not nil, just before it serves, and starts every process
// through startOn, if not nil (Config.StartOn).
func Main(ready func(), startOn func(func())) {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(log, ready, startOn); err != nil {
		log.Error("atoll-agent", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger, ready func(), startOn func(func())) error {
	var env map[string]string
	if s := os.Getenv(launch.EnvVar); s != "" {
		if err := json.Unmarshal([]byte(s), &env); err != nil {
			return fmt.Errorf("parsing %s: %w", launch.EnvVar, err)
		}
	}
	defaultUser, defaultCwd := os.Getenv(launch.UserVar), os.Getenv(launch.CwdVar)
	listenPath := os.Getenv(launch.ListenVar)
	// Children get their environment from the request, never the agent's.
	os.Clearenv()
	// Not dumpable: no process of the sandbox, its root included, may
	// trace the agent or read its memory (that takes CAP_SYS_PTRACE, which
	// sandboxes do not hold). The agent's threads other than the one that
	// starts processes keep a full bounding set (confine.Starter): traced,
	// one could be made to execute a program that gains it.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("making the agent not dumpable: %w", err)
	}

	ln, err := listener(listenPath)
	if err != nil {
		return err
	}

	// As PID 1 the agent inherits every orphan; otherwise ask to.
	if os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("becoming a subreaper: %w", err)
		}
	}
	a, err := New(Config{Listener: ln, DefaultEnv: env, Logger: log, Reap: true, DefaultUser: defaultUser, DefaultCwd: defaultCwd, StartOn: startOn})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
	defer stop()
	// Nothing is logged on a good start: a line written to every
	// sandbox's log file is work a burst of creates pays for nothing. GET
	// /health says how many Ps the agent runs on.
	if ready != nil {
		ready()
	}
	if listenPath != "" {
		err = a.serveReleasable(ctx, log, ln, listenPath)
	} else {
		err = a.Run(ctx)
	}
	a.Close()
	return err
}

// Signals that make an agent listening on a path let go of its socket and
// take it up again. gvisor cannot checkpoint a sandbox holding a socket bound
// on the host, so its runtime sends ReleaseSignal, waits for the socket file
// to go, checkpoints, and after a restore sends ListenSignal. Processes keep
// running throughout; only connections to the agent end.
const (
	ReleaseSignal = unix.SIGUSR1
	ListenSignal  = unix.SIGUSR2
)

// serveReleasable serves ln until ctx is done, closing it (and every
// connection) on ReleaseSignal and listening on path again on ListenSignal.
func (a *Agent) serveReleasable(ctx context.Context, log *slog.Logger, ln net.Listener, path string) error {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, ReleaseSignal, ListenSignal)
	defer signal.Stop(sigs)
	for {
		sctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		go func() { errc <- a.Serve(sctx, ln) }()
		var err error
	serving:
		for {
			select {
			case err = <-errc:
				break serving
			case sig := <-sigs:
				if sig == ReleaseSignal {
					cancel()
				}
			}
		}
		cancel()
		if ctx.Err() != nil || err != nil {
			return err
		}
		// Serve closed ln, which removed the socket file: the node
		// watches for that.
		log.Info("atoll-agent released its socket")
		for released := true; released; {
			select {
			case <-ctx.Done():
				return nil
			case sig := <-sigs:
				released = sig != ListenSignal
			}
		}
		if ln, err = listener(path); err != nil {
			return err
		}
		log.Info("atoll-agent listening again")
	}
}

// listener is the socket at path if path is set, else the one inherited as launch.ListenerFD.
func listener(path string) (net.Listener, error) {
	if path != "" {
		// A socket left by an earlier run of the same sandbox is stale.
		_ = os.Remove(path)
		ln, err := net.Listen("unix", path)
		if err != nil {
			return nil, fmt.Errorf("listening on %s: %w", path, err)
		}
		return ln, nil
	}
	f := os.NewFile(launch.ListenerFD, "listener")
	if f == nil {
		return nil, errors.New("no listener on fd 3")
	}
	ln, err := net.FileListener(f)
	f.Close() // FileListener holds its own copy
	if err != nil {
		return nil, fmt.Errorf("listener on fd 3: %w", err)
	}
	return ln, nil
}
