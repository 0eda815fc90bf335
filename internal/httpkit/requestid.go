package httpkit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
)

// RequestIDHeader carries a request's ID, both ways: a client or a proxy
// in front may name the request, and every answer says what it was named.
const RequestIDHeader = "X-Request-Id"

// maxRequestID bounds an ID taken from a client, which goes into logs.
const maxRequestID = 128

type requestIDKey struct{}

// RequestID gives each request an ID, once, in front of everything else
// (atoll serve's handler): the one it came with in
// X-Request-Id if that is sane (RequestIDOK), a new random one otherwise.
// The ID is set on the answer's X-Request-Id before next runs, put in the
// request's context for logs (LogHandler) and errors (Surface.JSON), and
// so passed on by the cluster's router with the request's headers.
func RequestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(RequestIDHeader)
		if !RequestIDOK(id) {
			id = NewRequestID()
			r.Header.Set(RequestIDHeader, id)
		}
		w.Header().Set(RequestIDHeader, id)
		if RequestIDFrom(r.Context()) == id {
			// Named already by a RequestID further out: r goes on
			// itself, not a copy, for what reads what the ServeMux
			// writes into it (r.Pattern).
			next.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id)))
	})
}

// DropRequestID takes the X-Request-Id off an answer a reverse proxy
// passes on (as its ModifyResponse): the proxy's own answer has it
// already, from RequestID, and the proxy would add the upstream's as a
// second.
func DropRequestID(resp *http.Response) {
	resp.Header.Del(RequestIDHeader)
}

// RequestIDOK says whether id may be taken as given: 1 to 128 letters,
// digits and - _ . : (a UUID, a trace ID, a load balancer's), nothing that
// could forge a log line.
func RequestIDOK(id string) bool {
	if id == "" || len(id) > maxRequestID {
		return false
	}
	for _, c := range []byte(id) {
		ok := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':'
		if !ok {
			return false
		}
	}
	return true
}

// NewRequestID is a new random request ID: 16 hex digits.
func NewRequestID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// RequestIDFrom is the ID of the request whose context ctx is; "" if none.
func RequestIDFrom(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// LogHandler adds a request_id attribute to each record logged with the
// context of a request (Logger.InfoContext and the like, LogAttrs), so
// that every line about a request can be found by its ID.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ slog.Handler }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if id := RequestIDFrom(ctx); id != "" {
		r.AddAttrs(slog.String("request_id", id))
	}
	return h.Handler.Handle(ctx, r)
}

func (h logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logHandler{h.Handler.WithAttrs(as)}
}

func (h logHandler) WithGroup(name string) slog.Handler { return logHandler{h.Handler.WithGroup(name)} }
