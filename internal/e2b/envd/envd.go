// Package envd serves E2B's in-sandbox protocol (what E2B calls envd) for
// atoll sandboxes: the Connect RPC process and filesystem services, the HTTP
// file endpoints and health. It runs on the host in front of a sandbox's
// atoll agent and turns each call into agent calls, so E2B SDKs work against
// atoll sandboxes unchanged. Routing a request to a sandbox is the caller's
// job (package e2b); this package serves one sandbox per request.
package envd

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/e2b/envd/spec/filesystem/filesystemconnect"
	"github.com/atoll-dev/atoll/internal/e2b/envd/spec/process/processconnect"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/httpkit"
)

// Version is the envd version reported to SDKs, which gate features on
// it. The newest gates (E2B's JS and Python SDKs' envd/versions) are:
// 0.5.7 raw uploads, 0.6.2 file metadata, 0.6.3 entries in watch events,
// 0.6.4 watching network mounts, all served here. Later envd versions
// change nothing SDKs see (envd's internals: hugepages before pause,
// live upgrade), so none is claimed until an SDK gates on one.
const Version = "0.6.4"

// Port is the sandbox port SDKs address envd at.
const Port = 49983

// DefaultUser is who commands run as and who owns created files when a
// request names no user: E2B's default.
const DefaultUser = "user"

// Sandbox is the sandbox a request is for.
type Sandbox struct {
	ID    string
	Agent *agent.Client
	// AccessToken is what requests must carry in X-Access-Token (or sign
	// file URLs with); empty means no check.
	AccessToken string
}

// Config configures a Server.
type Config struct {
	Logger *slog.Logger // default slog.Default()
}

// Server serves the envd protocol.
type Server struct {
	log      *slog.Logger
	mux      *http.ServeMux
	watchers *watchers
}

// maxMessage bounds one RPC request message (SendInput carries stdin).
const maxMessage = 16 << 20

// New returns a Server.
func New(cfg Config) *Server {
	s := &Server{log: cfg.Logger, mux: http.NewServeMux()}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.watchers = newWatchers(s.log)
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(maxMessage)}
	s.mux.Handle(processconnect.NewProcessHandler(&processService{s}, opts...))
	s.mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{s}, opts...))
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	s.mux.HandleFunc("GET /files", s.download)
	s.mux.HandleFunc("POST /files", s.upload)
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no route for "+r.Method+" "+r.URL.Path)
	})
	return s
}

// Close stops the polling watchers (CreateWatcher) of every sandbox.
func (s *Server) Close() { s.watchers.closeAll() }

type callKey struct{}

// call is what a request carries down to the handlers: its sandbox and the
// user it acts as, with what was looked up about the sandbox's users.
type call struct {
	sb    Sandbox
	user  string
	accts *accounts // loaded on first use
}

func callFrom(ctx context.Context) *call { return ctx.Value(callKey{}).(*call) }

// Serve serves r, addressed to envd in sb.
func (s *Server) Serve(w http.ResponseWriter, r *http.Request, sb Sandbox) {
	c := &call{sb: sb, user: DefaultUser}
	if u, _, ok := r.BasicAuth(); ok && u != "" {
		c.user = u
	}
	if !s.authorized(r, sb) {
		writeError(w, http.StatusUnauthorized, "unauthorized access, please provide a valid access token or method signing if supported")
		return
	}
	s.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callKey{}, c)))
}

// authorized checks the access token. Health needs none; the file
// endpoints also take a signature in the query instead (checked there).
func (s *Server) authorized(r *http.Request, sb Sandbox) bool {
	if sb.AccessToken == "" || r.Method == http.MethodGet && r.URL.Path == "/health" {
		return true
	}
	if tok := r.Header.Get("X-Access-Token"); tok != "" {
		return subtle.ConstantTimeCompare([]byte(tok), []byte(sb.AccessToken)) == 1
	}
	return r.URL.Path == "/files" && (r.Method == http.MethodGet || r.Method == http.MethodPost) &&
		r.URL.Query().Has("signature")
}

// Signature is how E2B signs a file URL: v1_ and the unpadded base64 of
// the SHA-256 of path:operation:user:token[:expiration]. user is the name
// the URL carries, "" when it names none.
func Signature(path, operation, user, token string, expiration int64) string {
	raw := path + ":" + operation + ":" + user + ":" + token
	if expiration != 0 {
		raw += fmt.Sprintf(":%d", expiration)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// SignatureShaped reports whether sig looks like a Signature: v1_ and 43
// characters of unpadded base64.
func SignatureShaped(sig string) bool {
	b, ok := strings.CutPrefix(sig, "v1_")
	if !ok || len(b) != base64.RawStdEncoding.EncodedLen(sha256.Size) {
		return false
	}
	_, err := base64.RawStdEncoding.DecodeString(b)
	return err == nil
}

// fileOperations are the operations signed file URLs are for, by method.
var fileOperations = map[string]string{http.MethodGet: "read", http.MethodPost: "write"}

// SignedBy reports whether r is a file URL (GET or POST /files) signed
// with token; its expiration is checked later, by the handler.
func SignedBy(r *http.Request, token string) bool {
	op, ok := fileOperations[r.Method]
	if !ok || r.URL.Path != "/files" {
		return false
	}
	_, err := verifySignature(r, op, token)
	return err == nil
}

// verifySignature checks r's signature for operation under token and
// returns the expiration it carries (0 for none).
func verifySignature(r *http.Request, operation, token string) (expiration int64, err error) {
	q := r.URL.Query()
	if v := q.Get("signature_expiration"); v != "" {
		if _, err := fmt.Sscan(v, &expiration); err != nil || expiration <= 0 {
			return 0, errors.New("invalid signature expiration")
		}
	}
	want := Signature(q.Get("path"), operation, q.Get("username"), token, expiration)
	if subtle.ConstantTimeCompare([]byte(q.Get("signature")), []byte(want)) != 1 {
		return 0, errors.New("invalid signature")
	}
	return expiration, nil
}

// checkSignature verifies a file URL's signature unless the request carries
// the access token, which Serve has checked already.
func checkSignature(r *http.Request, sb Sandbox, operation string) error {
	if sb.AccessToken == "" || r.Header.Get("X-Access-Token") != "" {
		return nil
	}
	exp, err := verifySignature(r, operation, sb.AccessToken)
	if err != nil {
		return err
	}
	if exp != 0 && exp < time.Now().Unix() {
		return errors.New("signature is already expired")
	}
	return nil
}

// surface is envd's HTTP error shape, E2B's, and where its statuses differ
// from api.ErrorCodes: E2B's envd answers a full disk with 507, which the
// SDKs raise as NotEnoughSpaceError; and unavailable is none of envd's
// statuses: an agent that says so answered (500), one that did not is gone
// (502), as httpStatus decides for errors of no kind.
var surface = httpkit.Surface{
	Body: httpkit.E2B.Body,
	Statuses: map[string]int{
		api.CodeQuota:       http.StatusInsufficientStorage,
		api.CodeUnavailable: 0,
		api.CodeForbidden:   0, // the agent never says forbidden
	},
}

// writeError answers an HTTP (not RPC) request with envd's error shape.
func writeError(w http.ResponseWriter, status int, msg string) {
	surface.Error(w, status, "", msg)
}

// message is what a client may see of err: the agent's own message, which
// names only the sandbox's paths, or a generic text.
func message(err error) string {
	var se *agent.StatusError
	if errors.As(err, &se) {
		return se.Message
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "request cancelled"
	case errdefs.Code(err) != "internal":
		return err.Error()
	}
	return "sandbox agent is unreachable"
}

// connectCodes are the Connect codes E2B's envd gives errors of each code.
var connectCodes = map[string]connect.Code{
	api.CodeInvalid:      connect.CodeInvalidArgument,
	api.CodeNotFound:     connect.CodeNotFound,
	api.CodeConflict:     connect.CodeFailedPrecondition,
	api.CodeQuota:        connect.CodeResourceExhausted,
	api.CodeTooLarge:     connect.CodeResourceExhausted,
	api.CodeUnauthorized: connect.CodeUnauthenticated,
	api.CodeUnavailable:  connect.CodeUnavailable,
}

// rpcError turns an agent error into a Connect error with the code E2B's
// envd would give.
func rpcError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	code := connect.CodeUnavailable // the agent did not answer: the sandbox is going away
	var se *agent.StatusError
	switch c, ok := connectCodes[errdefs.Code(err)]; {
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	case ok:
		code = c
	case errors.As(err, &se):
		code = connect.CodeInternal
	}
	return connect.NewError(code, errors.New(message(err)))
}

// httpStatus is the envd HTTP status of an agent error.
func httpStatus(err error) int {
	if st := surface.Status(err); st != 0 && st != http.StatusInternalServerError {
		return st
	}
	var se *agent.StatusError
	if errors.As(err, &se) {
		return http.StatusInternalServerError
	}
	// E2B's proxy answers 502 when the sandbox is gone; SDKs read that as
	// "not running any more".
	return http.StatusBadGateway
}

func invalid(format string, args ...any) error {
	return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, args...))
}

// keepaliveInterval is how often a stream must send something while idle,
// from the Keepalive-Ping-Interval header (seconds) SDKs send; 0: never.
func keepaliveInterval(h http.Header) time.Duration {
	var sec int
	if _, err := fmt.Sscan(strings.TrimSpace(h.Get("Keepalive-Ping-Interval")), &sec); err != nil || sec <= 0 {
		return 0
	}
	return time.Duration(min(sec, 3600)) * time.Second
}

// drain discards the rest of a body so its connection can be reused.
func drain(r io.Reader) { io.Copy(io.Discard, io.LimitReader(r, 1<<20)) }
