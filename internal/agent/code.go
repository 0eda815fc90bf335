package agent

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// CodePort is where the code-interpreter template's service listens
// (templates/code-interpreter/server.py), E2B's port for it.
const CodePort = 49999

// codeProxy passes /code/... to the code interpreter service on the
// sandbox's loopback, /code taken off: atoll's code API reaches it through
// the agent, so it needs no networking. Its streams pass as they come, and
// a request that goes away closes its connection to the service, which
// interrupts the execution. The service's errors ({"message"} with a
// status) come back in atoll's shape.
func codeProxy() http.Handler {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(CodePort))
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "http", addr, addr
			pr.Out.URL.Path = strings.TrimPrefix(pr.In.URL.Path, "/code")
			pr.Out.URL.RawPath = ""
		},
		Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     90 * time.Second,
		},
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			if resp.StatusCode < 400 {
				return nil
			}
			defer resp.Body.Close()
			var body struct {
				Message string `json:"message"`
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			if json.Unmarshal(b, &body) != nil || body.Message == "" {
				body.Message = strings.TrimSpace(string(b))
			}
			kind := errdefs.ErrUnavailable
			switch resp.StatusCode {
			case http.StatusBadRequest:
				kind = errdefs.ErrInvalid
			case http.StatusNotFound:
				kind = errdefs.ErrNotFound
			case http.StatusRequestEntityTooLarge:
				kind = errdefs.ErrTooLarge
			}
			return errorf(kind, "code interpreter: %s", body.Message)
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the caller went away
			}
			var ke *kindError
			if !errors.As(err, &ke) {
				err = errorf(errdefs.ErrUnavailable, "no code interpreter answers on port %d of this sandbox: create the sandbox from the code-interpreter template (docs/code-interpreter.md)", CodePort)
			}
			writeError(w, err)
		},
	}
}
