package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/httpkit"
	"github.com/atoll-dev/atoll/internal/telemetry"
)

// forward returns the handler of an agent route: it forwards the request to the
// sandbox's agent with the /v1/sandboxes/{id} prefix taken off. Responses,
// streams (flushed as they arrive) and websocket upgrades pass through unchanged.
func (s *Server) forward(hasPID, jsonBody bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, ok := sandboxID(w, r)
		if !ok {
			return
		}
		if hasPID {
			if pid, err := strconv.Atoi(r.PathValue("pid")); err != nil || pid <= 0 {
				writeJSONError(w, http.StatusBadRequest, "invalid", "malformed process ID: want a positive integer")
				return
			}
		}
		if jsonBody {
			if r.ContentLength > MaxJSONBody {
				s.writeError(w, r, fmt.Errorf("%w: request body is larger than %d bytes", errdefs.ErrTooLarge, MaxJSONBody))
				return
			}
			r.Body = http.MaxBytesReader(w, r.Body, MaxJSONBody)
		}
		dial, err := s.cfg.Sandboxes.AgentDialer(r.Context(), id)
		if errors.Is(err, errdefs.ErrConflict) && r.URL.Query().Get("resume") == "true" {
			// ?resume=true wakes a paused sandbox first, as E2B's connect
			// does; resume itself knows which states it applies to (a
			// conflict here may be another request's resume winning).
			if _, rerr := s.cfg.Sandboxes.Resume(r.Context(), id); rerr == nil || errors.Is(rerr, errdefs.ErrConflict) {
				dial, err = s.cfg.Sandboxes.AgentDialer(r.Context(), id)
			}
		}
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		prefix := "/v1/sandboxes/" + id
		rp := &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.Out.URL.Scheme = "http"
				pr.Out.URL.Host = "agent"
				pr.Out.Host = "agent"
				pr.Out.URL.Path = strings.TrimPrefix(pr.In.URL.Path, prefix)
				pr.Out.URL.RawPath = ""
				// The agent trusts its socket, not keys; don't hand it the tenant's key.
				pr.Out.Header.Del("Authorization")
				pr.Out.Header.Del("X-Api-Key")
				stripWSKey(pr.Out.Header)
			},
			Transport: &http.Transport{
				DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
					return dial(ctx)
				},
				// One connection per request: the dialer may change when the
				// sandbox restarts, and unix-socket dials are cheap.
				DisableKeepAlives:  true,
				DisableCompression: true,
			},
			FlushInterval: -1,
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				var mbe *http.MaxBytesError
				switch {
				case errors.As(err, &mbe):
					writeJSONError(w, http.StatusRequestEntityTooLarge, "too_large",
						fmt.Sprintf("request body is larger than %d bytes", MaxJSONBody))
				case r.Context().Err() != nil:
					// The client went away; nobody is listening for an answer.
				default:
					s.log.Warn("agent unreachable", "sandbox", id, "err", err)
					writeJSONError(w, http.StatusServiceUnavailable, "unavailable", "sandbox agent is unreachable")
				}
			},
			ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		}
		// An exec's answer begins once its process has started: the time
		// to the agent's answer is the exec's latency.
		exec, start := strings.HasSuffix(r.URL.Path, "/exec"), time.Now()
		rp.ModifyResponse = func(resp *http.Response) error {
			// This answer has the request's ID already (httpkit.RequestID).
			httpkit.DropRequestID(resp)
			if exec {
				var err error
				if resp.StatusCode >= 400 {
					// The agent's errors carry their code (httpkit.Surface).
					if err = errdefs.FromCode(resp.Header.Get(httpkit.ErrorCodeHeader)); err == nil {
						err = fmt.Errorf("agent answered %d", resp.StatusCode)
					}
				}
				telemetry.Op(telemetry.OpExec, start, err)
			}
			return selectWSProtocol(resp)
		}
		rp.ServeHTTP(w, r)
	}
}
